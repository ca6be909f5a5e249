"""The drafter's teacher-forced forward over anchor blocks → per-slot loss terms and simulated acceptance.

Wrapped as an nn.Module so `accelerate`/DDP sees a forward() and synchronises gradients. Shapes: B sequences,
n positions, N anchors per sequence, γ slots per block, K kept blocks, V vocabulary (V' a pruned draft vocabulary).
"""

from __future__ import annotations

import torch
from torch import nn

from ..model.drafter import DSparkDraftModel
from .anchors import Blocks, block_mask
from .losses import prob_terms, target_probs


class DraftObjective(nn.Module):
    def __init__(self, drafter: DSparkDraftModel):
        super().__init__()
        self.drafter = drafter

    def forward(self, features: torch.Tensor, last_hidden: torch.Tensor, blocks: Blocks) -> dict:
        """features [B, n, m·d], last_hidden [B, n, d] (final-normed) → per-slot terms [K, γ] for kept blocks:
        ce, l1, conf (if a confidence head), conf_label, plus `valid` [K, γ], `draft_top`/`target_top` [K, γ]."""
        dr = self.drafter
        B, n, _ = features.shape
        N, g = blocks.anchors.shape[1], blocks.labels.shape[-1]
        kv = dr.context_kv(features, torch.arange(n, device=features.device)[None].expand(B, n))
        mask = block_mask(blocks.anchors, g, n)
        h = dr.backbone(dr.embed(blocks.input_ids.view(B, N * g)), blocks.positions.view(B, N * g), kv, mask)
        keep = blocks.keep.flatten()
        h = h.view(B * N, g, -1)[keep]  # [K, γ, d]: dummy blocks cost no vocab-sized compute
        prev = blocks.prev_ids.view(B * N, g)[keep]
        vocab = dr.draft_vocab  # a pruned draft vocabulary [V'] trains as it drafts: on its rows only
        head_w = None if vocab is None else dr.target.get_output_embeddings().weight[vocab]
        logits = dr.base_logits(h, head_w)  # U [K, γ, V or V'] float32
        emb = None
        if dr.markov_head is not None:
            bias, emb = dr.markov_head.block(prev, h, None if vocab is None else dr.markov_head.W2.weight[vocab])
            logits = logits + bias.float()
        conf = dr.confidence_head(h, emb) if dr.confidence_head is not None else None
        with torch.no_grad():  # p^t of slot j = LMHead(last_hidden[a+j]): once per position, not once per slot
            pos = blocks.positions.clamp(max=n - 1) + n * torch.arange(B, device=h.device).view(B, 1, 1)
            flat = pos.view(B * N, g)[keep]  # [K, γ] index into the B·n positions
            used = torch.zeros(B * n, dtype=torch.bool, device=h.device)
            used[flat] = True
            rows = (used.cumsum(0) - 1)[flat]  # [K, γ] → row among the used positions
            target_logits = dr.base_logits(last_hidden.reshape(B * n, -1)[used])  # [U, V]: U < K·γ (blocks overlap)
            p_t = target_probs(target_logits, vocab)
            target_top = target_logits.argmax(-1)
        terms = prob_terms(logits, p_t[rows], blocks.labels.view(B * N, g)[keep], conf, vocab)
        terms["valid"] = blocks.valid.view(B * N, g)[keep]
        top = logits.detach().argmax(-1)
        terms["draft_top"] = top if vocab is None else vocab[top]
        terms["target_top"] = target_top[rows]
        return terms


def simulated_tau(terms: dict) -> dict:
    """Expected τ (accepted drafts + bonus) of teacher-forced blocks whose γ labels are all valid.

    tau_t1: 1 + Σ_k Π_{i≤k} (1 − ½·L1_i), the temperature-1 rejection-sampling acceptance chain;
    tau_greedy: 1 + Σ_k Π_{i≤k} 1[argmax draft_i = argmax target_i]. Both condition on the data prefix and the
    ground-truth previous token (teacher forcing), so they approximate what `generate` measures.
    """
    full = terms["valid"].all(-1)
    if not bool(full.any()):
        return {"tau_t1": float("nan"), "tau_greedy": float("nan"), "blocks": 0}
    acc = terms["conf_label"][full].double()
    match = (terms["draft_top"] == terms["target_top"])[full].double()
    return {
        "tau_t1": float((1 + acc.cumprod(-1).sum(-1)).mean()),
        "tau_greedy": float((1 + match.cumprod(-1).sum(-1)).mean()),
        "blocks": int(full.sum()),
    }
