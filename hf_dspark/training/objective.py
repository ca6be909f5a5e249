"""The drafter's teacher-forced forward over anchor blocks → per-slot loss terms and simulated acceptance.

Wrapped as an nn.Module so `accelerate`/DDP sees a forward() and synchronises gradients. Shapes: B sequences,
n positions, N anchors per sequence, γ slots per block, K kept blocks, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn

from ..model.drafter import DSparkDrafter
from .anchors import Blocks, block_mask
from .losses import block_terms


class DraftObjective(nn.Module):
    def __init__(self, drafter: DSparkDrafter):
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
        logits = dr.base_logits(h)  # U [K, γ, V] float32
        emb = None
        if dr.head is not None:
            bias, emb = dr.head.block(prev, h)
            logits = logits + bias.float()
        conf = dr.confidence(h, emb) if dr.confidence is not None else None
        with torch.no_grad():
            pos = blocks.positions.clamp(max=n - 1).view(B, N * g, 1).expand(-1, -1, last_hidden.shape[-1])
            tgt_h = torch.gather(last_hidden, 1, pos).view(B * N, g, -1)[keep]
            target_logits = dr.base_logits(tgt_h)  # p^t of slot j = LMHead(last_hidden[a+j])
        terms = block_terms(logits, target_logits, blocks.labels.view(B * N, g)[keep], conf)
        terms["valid"] = blocks.valid.view(B * N, g)[keep]
        terms["draft_top"] = logits.detach().argmax(-1)
        terms["target_top"] = target_logits.argmax(-1)
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
