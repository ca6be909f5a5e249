"""PyTorch specification of the fused kernels, the oracle in tests/test_kernels.py.

Sampling uses Gumbel-max with explicit uniforms: x = argmax(z + g), g = -log(-log(u)), u ~ U[0, 1) per draft
vocabulary entry. That is an exact draw from softmax(z), and the kernel, given the same u, draws the same x.
"""

from __future__ import annotations

import torch


def gumbel(u: torch.Tensor) -> torch.Tensor:
    """u [...] in [0, 1) → standard Gumbel noise (u = 0 gives -inf: never drawn)."""
    return -torch.log(-torch.log(u))


def markov_draft(
    base_logits: torch.Tensor,
    anchor: int | torch.Tensor,
    w1: torch.Tensor | None,
    w2: torch.Tensor | None,
    vocab: torch.Tensor | None = None,
    vocab_size: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    uniforms: torch.Tensor | None = None,
):
    """The Markov head's sequential draft, step by step (what `markov_draft` fuses).

    base_logits [n, V'] float32 (U_k over the draft vocabulary), anchor x_0 (full-vocabulary id),
    w1 [V, r] (W1, full vocabulary) and w2 [V', r] (W2 rows of the draft vocabulary), or both None (no head);
    vocab [V'] sorted token ids or None (V' = V), vocab_size V.
    temperature: z / T; top_k: HF TopKLogitsWarper (-inf below the k-th largest); uniforms [n, V'] to sample
    (None = greedy argmax).
    → tokens [n] long, logits [n, V] float32 (exactly what each token was drawn from), prev embeddings [n, r].
    """
    n, vd = base_logits.shape
    vocab_size = vocab_size or vd
    prev = torch.as_tensor(anchor, device=base_logits.device).view(())
    tokens, rows, embs = [], [], []
    for k in range(n):
        z = base_logits[k].float()
        if w1 is not None:
            e = w1[prev]
            embs.append(e)
            z = z + (w2 @ e).float()  # as heads.sequential_draft: the bias in the weights' dtype, then float
        if temperature is not None:
            z = z / temperature
        if top_k is not None and top_k < vocab_size:  # the k-th largest of the full row (-inf off the draft vocab)
            thr = torch.topk(z, top_k).values[-1] if top_k <= vd else z.new_tensor(float("-inf"))
            z = z.masked_fill(z < thr, float("-inf"))
        s = z if uniforms is None else z + gumbel(uniforms[k].float())
        j = s.argmax()
        x = vocab[j] if vocab is not None else j
        row = z if vocab is None else torch.full((vocab_size,), float("-inf"), device=z.device).index_copy(0, vocab, z)
        tokens.append(x)
        rows.append(row)
        prev = x
    emb = torch.stack(embs) if embs else None
    return torch.stack(tokens), torch.stack(rows), emb


def confidence_logits(hidden: torch.Tensor, emb: torch.Tensor | None, conf_w: torch.Tensor, conf_b: torch.Tensor):
    """hidden [n, d], emb [n, r] or None, conf_w [d (+ r)], conf_b [1] → raw confidence logits [n] float32."""
    x = hidden.float() if emb is None or conf_w.shape[0] == hidden.shape[1] else torch.cat([hidden, emb.to(hidden.dtype)], -1).float()
    return x @ conf_w.float() + conf_b.float()


def context_fusion(features: torch.Tensor, fc_w: torch.Tensor, norm_w: torch.Tensor, eps: float) -> torch.Tensor:
    """features [M, m·d] (concatenated taps), fc_w [d, m·d], norm_w [d] → RMSNorm(fc(features)) [M, d] in
    fc_w's dtype; LlamaRMSNorm's arithmetic (fp32 statistics, weight times the normalised row in the dtype)."""
    y = torch.nn.functional.linear(features.to(fc_w.dtype), fc_w)
    yf = y.float()
    yf = yf * torch.rsqrt(yf.pow(2).mean(-1, keepdim=True) + eps)
    return norm_w * yf.to(y.dtype)
