"""Fused sequential draft of the Markov head: one round (γ positions) in γ+1 launches of one kernel.

Step k needs x_{k-1}, and x_{k-1} is an argmax over the whole draft vocabulary, so every step is a grid-wide
reduction. Launch k (grid = vocabulary blocks) therefore does two things:
  A. (k ≥ 1) reduce the per-block candidates of step k-1 → x_{k-1} (every program redundantly: they are few),
     program 0 writes it out; with top-k, also find the global k-th largest logit and mask row k-1 below it;
  B. (k < γ) its block of step k: z = (U_k + W2'·W1[x_{k-1}]) / T, write z (the exact q logits), and emit
     candidates for step k's reduction (block best key, or its top-KC keys with top-k); program 0 also writes
     the confidence logit w·[h_k ; W1[x_{k-1}]] + b.
Launch γ only does A. A candidate is one int64: the float's order-preserving bits above (MAXJ - j), so one
max/sort yields the value and, among equal values, the smallest index (torch.argmax's first occurrence).
Sampling is Gumbel-max with caller-given uniforms [γ, V'] (see reference.py): same uniforms, same tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAXJ = 2**31 - 1
_NEG_INF_KEY32 = -2139095041  # order key of float32 -inf (bits 0xFF800000 with the magnitude bits flipped)
PAD = (_NEG_INF_KEY32 << 32) | MAXJ  # the key of (-inf, j = 0): an empty candidate slot


@triton.jit
def _pack(v, j, MAXJ: tl.constexpr):
    """float32 v, int j → int64 key ordered by v, then by smaller j."""
    bits = v.to(tl.int32, bitcast=True)
    key32 = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (key32.to(tl.int64) << 32) | (MAXJ - j).to(tl.int64)


@triton.jit
def _unpack(key, MAXJ: tl.constexpr):
    key32 = (key >> 32).to(tl.int32)
    bits = key32 ^ ((key32 >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True), MAXJ - key.to(tl.int32)  # low word: MAXJ - j < 2**31


@triton.jit
def _gumbel(u):
    return -tl.log(-tl.log(u))


@triton.jit(do_not_specialize=["k", "n", "top_k"])
def _markov_draft_step(
    k, n, anchor_ptr,
    base_ptr, stride_base,  # U [n, V'] float32
    u_ptr, stride_u,  # uniforms [n, V'] float32 (SAMPLE)
    hid_ptr, stride_hid,  # h [n, D] (HAS_CONF)
    w1_ptr, stride_w1,  # W1 [V, R]
    w2_ptr, stride_w2,  # W2 rows [V', R]
    vocab_ptr,  # [V'] token ids (HAS_VOCAB)
    conf_w_ptr, conf_b_ptr,  # [D (+R)], [1]
    logits_ptr, stride_logits,  # out [n, V] float32
    tok_ptr,  # out [n] int64
    conf_ptr,  # out [n] float32
    cand_ptr,  # scratch [n, NB, KC] int64
    Vd, R, D, NB, top_k, temperature,
    HAS_HEAD: tl.constexpr, HAS_VOCAB: tl.constexpr, HAS_CONF: tl.constexpr, CONF_EMB: tl.constexpr,
    HAS_TEMP: tl.constexpr, SAMPLE: tl.constexpr, TOP_K: tl.constexpr,
    KC: tl.constexpr, NB_P: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
    PAD: tl.constexpr, MAXJ: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid * BLOCK_V + tl.arange(0, BLOCK_V)
    valid = offs < Vd
    if HAS_VOCAB:
        ids = tl.load(vocab_ptr + offs, mask=valid, other=0)
    else:
        ids = offs.to(tl.int64)

    # ---- A: close step k-1 ------------------------------------------------------------------------------
    if k == 0:
        prev = tl.load(anchor_ptr)
    else:
        ci = tl.arange(0, NB_P * KC)
        keys = tl.load(cand_ptr + (k - 1) * NB * KC + ci, mask=ci < NB * KC, other=PAD)
        if TOP_K:
            srt = tl.sort(keys, descending=True)
            thr, _ = _unpack(tl.max(tl.where(ci == top_k - 1, srt, PAD)), MAXJ)  # k-th largest, -inf if fewer
            z, j = _unpack(keys, MAXJ)
            ok = z >= thr
            if SAMPLE:
                z = z + _gumbel(tl.load(u_ptr + (k - 1) * stride_u + j, mask=ok, other=0.5))
            s = tl.where(ok, z, float("-inf"))
            best = tl.max(s)
            jb = tl.min(tl.where(ok & (s == best), j, MAXJ))
            # q must be exactly what was sampled from: mask this block of row k-1 below the threshold
            row = logits_ptr + (k - 1) * stride_logits + ids
            zr = tl.load(row, mask=valid, other=0.0)
            tl.store(row, tl.full([BLOCK_V], float("-inf"), tl.float32), mask=valid & (zr < thr))
        else:
            _, jb = _unpack(tl.max(keys), MAXJ)
        if HAS_VOCAB:
            prev = tl.load(vocab_ptr + jb)
        else:
            prev = jb.to(tl.int64)
        if pid == 0:
            tl.store(tok_ptr + k - 1, prev)

    # ---- B: open step k ---------------------------------------------------------------------------------
    if k < n:
        z = tl.load(base_ptr + k * stride_base + offs, mask=valid, other=float("-inf")).to(tl.float32)
        if HAS_HEAD:
            bias = tl.zeros([BLOCK_V], tl.float32)
            for r0 in range(0, R, BLOCK_R):
                ro = r0 + tl.arange(0, BLOCK_R)
                e = tl.load(w1_ptr + prev * stride_w1 + ro, mask=ro < R, other=0.0).to(tl.float32)
                w = tl.load(w2_ptr + offs[:, None] * stride_w2 + ro[None, :],
                            mask=valid[:, None] & (ro[None, :] < R), other=0.0).to(tl.float32)
                bias += tl.sum(w * e[None, :], axis=1)
            # as the reference: W2·u comes out in the weights' dtype before it is added in float32
            z = z + bias.to(w2_ptr.dtype.element_ty).to(tl.float32)
        if HAS_TEMP:
            z = z / temperature
        tl.store(logits_ptr + k * stride_logits + ids, z, mask=valid)
        jj = offs.to(tl.int32)
        if TOP_K:  # this block's top-KC by z: a superset of its share of the global top-k
            keys = tl.where(valid, _pack(z, jj, MAXJ), PAD)
            srt = tl.sort(keys, descending=True)
            ar = tl.arange(0, BLOCK_V)
            tl.store(cand_ptr + (k * NB + pid) * KC + ar, srt, mask=ar < KC)
        else:
            s = z
            if SAMPLE:
                s = z + _gumbel(tl.load(u_ptr + k * stride_u + offs, mask=valid, other=0.5))
            keys = tl.where(valid, _pack(s, jj, MAXJ), PAD)
            tl.store(cand_ptr + k * NB + pid, tl.max(keys))
        if HAS_CONF:  # noqa: SIM102 (constexpr outside, runtime inside: Triton compiles the outer away)
            if pid == 0:
                do = tl.arange(0, BLOCK_D)
                acc = tl.zeros([BLOCK_D], tl.float32)
                for d0 in range(0, D, BLOCK_D):
                    hm = d0 + do < D
                    h = tl.load(hid_ptr + k * stride_hid + d0 + do, mask=hm, other=0.0).to(tl.float32)
                    acc += h * tl.load(conf_w_ptr + d0 + do, mask=hm, other=0.0).to(tl.float32)
                c = tl.sum(acc, axis=0)
                if CONF_EMB:
                    ro = tl.arange(0, BLOCK_R)
                    acc_r = tl.zeros([BLOCK_R], tl.float32)
                    for r0 in range(0, R, BLOCK_R):
                        rm = r0 + ro < R
                        e = tl.load(w1_ptr + prev * stride_w1 + r0 + ro, mask=rm, other=0.0).to(tl.float32)
                        acc_r += e * tl.load(conf_w_ptr + D + r0 + ro, mask=rm, other=0.0).to(tl.float32)
                    c += tl.sum(acc_r, axis=0)
                tl.store(conf_ptr + k, c + tl.load(conf_b_ptr).to(tl.float32))


def markov_draft(
    base_logits: torch.Tensor,
    anchor: torch.Tensor,
    w1: torch.Tensor | None,
    w2: torch.Tensor | None,
    hidden: torch.Tensor | None = None,
    conf_w: torch.Tensor | None = None,
    conf_b: torch.Tensor | None = None,
    vocab: torch.Tensor | None = None,
    vocab_size: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    uniforms: torch.Tensor | None = None,
    block_v: int = 1024,
    block_r: int = 64,
):
    """base_logits [n, V'] float32, anchor 0-dim long, w1 [V, r] / w2 [V', r] (or None: no head), hidden [n, d]
    with conf_w [d] or [d + r] and conf_b [1] (or None: no confidence), vocab [V'] sorted ids or None,
    vocab_size V, temperature T, top_k (HF TopKLogitsWarper semantics), uniforms [n, V'] (sampling) or None
    (greedy) → tokens [n] long, logits [n, V] float32 (q logits), conf_logits [n] float32 or None.
    """
    n, vd = base_logits.shape
    dev = base_logits.device
    V = vocab_size or vd
    base_logits = base_logits.float().contiguous()
    use_topk = top_k is not None and top_k < V
    kc = max(2, triton.next_power_of_2(top_k)) if use_topk else 1  # tl.sort wants a power of 2 above 1
    block_v = max(triton.next_power_of_2(min(block_v, vd)), kc, 16)
    while triton.cdiv(vd, block_v) > 64 and block_v < 4096:  # few blocks: every program reduces them all
        block_v *= 2
    nb = triton.cdiv(vd, block_v)
    has_head, has_conf = w1 is not None, conf_w is not None
    r = w1.shape[1] if has_head else 1
    d = hidden.shape[1] if has_conf else 1
    conf_emb = has_conf and has_head and conf_w.numel() == d + r
    if has_conf and conf_w.numel() != (d + r if conf_emb else d):
        raise ValueError(f"confidence weight has {conf_w.numel()} inputs, expected {d} or {d + r}")
    if vocab is not None:  # q is 0 off the draft vocabulary
        logits = torch.full((n, V), float("-inf"), device=dev, dtype=torch.float32)
    else:
        logits = torch.empty((n, V), device=dev, dtype=torch.float32)
    tokens = torch.empty(n, dtype=torch.long, device=dev)
    conf = torch.empty(n, dtype=torch.float32, device=dev) if has_conf else None
    cand = torch.empty((n, nb, kc), dtype=torch.int64, device=dev)
    dummy = base_logits  # stands in for absent pointers (never read)
    w1c = w1.contiguous() if has_head else dummy
    w2c = w2.contiguous() if has_head else dummy
    hid = hidden.contiguous() if has_conf else dummy
    u = uniforms.float().contiguous() if uniforms is not None else dummy
    anchor = anchor.reshape(1).to(device=dev, dtype=torch.long)
    for k in range(n + 1):
        _markov_draft_step[(nb,)](
            k, n, anchor, base_logits, base_logits.stride(0), u, u.stride(0), hid, hid.stride(0),
            w1c, w1c.stride(0), w2c, w2c.stride(0), vocab if vocab is not None else anchor,
            conf_w if has_conf else dummy, conf_b if has_conf else dummy,
            logits, logits.stride(0), tokens, conf if has_conf else dummy, cand,
            vd, r, d, nb, top_k if use_topk else 1, float(temperature or 1.0),
            HAS_HEAD=has_head, HAS_VOCAB=vocab is not None, HAS_CONF=has_conf, CONF_EMB=conf_emb,
            HAS_TEMP=temperature is not None, SAMPLE=uniforms is not None, TOP_K=use_topk,
            KC=kc, NB_P=triton.next_power_of_2(nb), BLOCK_V=block_v,
            BLOCK_R=min(triton.next_power_of_2(r), block_r), BLOCK_D=min(triton.next_power_of_2(d), 1024),
            PAD=PAD, MAXJ=MAXJ,
        )
    return tokens, logits, conf
