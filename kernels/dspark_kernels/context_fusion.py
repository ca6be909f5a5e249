"""Context fusion: RMSNorm(fc(concat of tapped layers)) in 2 launches instead of ~9 (fc, then LlamaRMSNorm's
cast, pow, mean, add, rsqrt, mul, cast, mul).

Chosen by profiling a drafter round (docs/kernels.md): after the sequential head, the per-round context
ingestion is the next launch-bound piece (a handful of rows, many tiny ops). The RMSNorm needs whole rows and
the fc output is spread over column blocks, so launch 1 (GEMM) also writes each tile's row sum of squares and
launch 2 (one program per row) normalises: deterministic, no atomics.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Triton's CPU interpreter computes bf16/fp16 tl.dot wrongly (triton 3.9): there the tiles are upcast to
# float32 first. bf16·bf16 products are exact in float32, so this is the GPU's math up to summation order.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _fc_sumsq(x_ptr, w_ptr, y_ptr, ss_ptr, M, N, K, stride_x, stride_w, stride_y, NBN,
              IEEE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """y = x @ w^T [M, N] in y's dtype; ss[m, pid_n] = Σ_tile y² (of the rounded y, as the reference sees it)."""
    pm, pn = tl.program_id(0), tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(x_ptr + rm[:, None] * stride_x + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(w_ptr + rn[None, :] * stride_w + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
        if IEEE:  # float32 weights: no TF32, as torch's default matmul
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    y = acc.to(y_ptr.dtype.element_ty)
    ok = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(y_ptr + rm[:, None] * stride_y + rn[None, :], y, mask=ok)
    yf = tl.where(ok, y.to(tl.float32), 0.0)
    tl.store(ss_ptr + rm * NBN + pn, tl.sum(yf * yf, axis=1), mask=rm < M)


@triton.jit
def _rmsnorm_rows(y_ptr, ss_ptr, w_ptr, out_ptr, N, stride_y, stride_out, NBN, eps,
                  NBN_P: tl.constexpr, BLOCK: tl.constexpr):
    """out[m] = w * (y[m] * rsqrt(mean(y[m]²) + eps)).to(dtype): LlamaRMSNorm's arithmetic."""
    m = tl.program_id(0)
    p = tl.arange(0, NBN_P)
    ss = tl.sum(tl.load(ss_ptr + m * NBN + p, mask=p < NBN, other=0.0), axis=0)
    rstd = tl.rsqrt(ss / N + eps)
    for n0 in range(0, N, BLOCK):
        cols = n0 + tl.arange(0, BLOCK)
        cm = cols < N
        y = tl.load(y_ptr + m * stride_y + cols, mask=cm, other=0.0).to(tl.float32)
        h = (y * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=cm, other=0.0).to(tl.float32)
        tl.store(out_ptr + m * stride_out + cols, (w * h).to(out_ptr.dtype.element_ty), mask=cm)


def context_fusion(features: torch.Tensor, fc_w: torch.Tensor, norm_w: torch.Tensor, eps: float,
                   bm: int = 16, bn: int = 64, bk: int = 64) -> torch.Tensor:
    """features [..., K] (K = m·d), fc_w [d, K], norm_w [d] → [..., d] in fc_w's dtype."""
    lead = features.shape[:-1]
    x = features.reshape(-1, features.shape[-1]).to(fc_w.dtype).contiguous()
    w = fc_w.contiguous()
    M, K = x.shape
    N = w.shape[0]
    bn = min(bn, max(16, triton.next_power_of_2(N)))
    bk = min(bk, max(16, triton.next_power_of_2(K)))
    nbn = triton.cdiv(N, bn)
    y = torch.empty((M, N), device=x.device, dtype=w.dtype)
    if M == 0:
        return y.reshape(*lead, N)
    ss = torch.empty((M, nbn), device=x.device, dtype=torch.float32)
    _fc_sumsq[(triton.cdiv(M, bm), nbn)](x, w, y, ss, M, N, K, x.stride(0), w.stride(0), y.stride(0), nbn,
                                          IEEE=w.dtype == torch.float32 or _INTERPRETED, BM=bm, BN=bn, BK=bk)
    out = torch.empty_like(y)
    _rmsnorm_rows[(M,)](y, ss, norm_w, out, N, y.stride(0), out.stride(0), nbn, float(eps),
                        NBN_P=triton.next_power_of_2(nbn), BLOCK=min(1024, triton.next_power_of_2(N)))
    return out.reshape(*lead, N)
