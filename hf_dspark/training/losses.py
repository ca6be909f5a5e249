"""DSpark losses: 0.1·CE + 0.9·L1(draft, target) + 1.0·confidence BCE, position-weighted means.

All softmaxes at temperature 1 in float32. L1 is the full Σ|p^d − p^t| (2·TV, no ½). The confidence label
c* = 1 − ½·L1 (the probability a draft from p^d is accepted against p^t) is detached; the confidence
features are not, so L_conf also trains the backbone and W1. Each term is Σ w·valid·ℓ / Σ w·valid.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class LossWeights:
    ce: float = 0.1
    l1: float = 0.9
    conf: float = 1.0
    decay: float = 4.0  # w_k = exp(-k / decay), k = 0..γ-1 (released configs use 4.0 for γ = 7)

    @classmethod
    def dflash(cls) -> LossWeights:
        """The DFlash ablation: CE only (no Markov head, no confidence head), same decay."""
        return cls(ce=1.0, l1=0.0, conf=0.0)


def position_weights(block_size: int, decay: float = 4.0, device=None) -> torch.Tensor:
    """[γ]: exp(-k / decay)."""
    return torch.exp(-torch.arange(block_size, device=device, dtype=torch.float32) / decay)


def target_probs(target_logits: torch.Tensor, vocab: torch.Tensor | None = None) -> torch.Tensor:
    """Target logits [..., V] → p^t [..., V], or on a pruned draft vocabulary `vocab` [V'] only → [..., V']
    (still normalised over V: one logsumexp pass instead of a V-sized softmax)."""
    target_logits = target_logits.float()
    if vocab is None:
        return F.softmax(target_logits, dim=-1)
    return (target_logits[..., vocab] - target_logits.logsumexp(-1, keepdim=True)).exp()


def block_terms(draft_logits: torch.Tensor, target_logits: torch.Tensor, labels: torch.Tensor,
                conf_logits: torch.Tensor | None, vocab: torch.Tensor | None = None):
    """Per-slot quantities. draft_logits [..., V] (V' with `vocab`; they include the Markov bias), target_logits
    [..., V], labels [...], conf_logits [...] or None → dict of [...] float32 tensors: ce, l1, conf (BCE), conf_label."""
    return prob_terms(draft_logits, target_probs(target_logits, vocab), labels, conf_logits, vocab)


def prob_terms(draft_logits: torch.Tensor, p_t: torch.Tensor, labels: torch.Tensor, conf_logits: torch.Tensor | None,
               vocab: torch.Tensor | None = None):
    """`block_terms` from p^t = target_probs(...) [..., V or V'].

    `vocab` [V'] (sorted token ids) is a pruned draft vocabulary: q is 0 outside it, exactly as when drafting, so
    L1 = Σ_{v∈V'} |q_v − p_v| + p(outside) and a label outside V' has CE 0 (the drafter cannot propose it).
    """
    logp_d = F.log_softmax(draft_logits.float(), dim=-1)
    if vocab is None:
        ce = -logp_d.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        l1 = (logp_d.exp() - p_t).abs().sum(-1)
    else:
        l1 = (logp_d.exp() - p_t).abs().sum(-1) + (1 - p_t.sum(-1)).clamp(min=0)
        col = torch.searchsorted(vocab, labels).clamp(max=vocab.numel() - 1)
        inside = vocab[col] == labels
        ce = torch.where(inside, -logp_d.gather(-1, col.unsqueeze(-1)).squeeze(-1), torch.zeros_like(l1))
    label = (1 - 0.5 * l1).clamp(0, 1).detach()
    out = {"ce": ce, "l1": l1, "conf_label": label}
    if conf_logits is not None:
        out["conf"] = F.binary_cross_entropy_with_logits(conf_logits.float(), label, reduction="none")
    return out


def weighted_sums(terms: dict, valid: torch.Tensor, decay: float):
    """valid [..., γ] → ({name: Σ w·valid·ℓ}, Σ w·valid): sums, so callers can all-reduce the denominator."""
    w = position_weights(valid.shape[-1], decay, valid.device) * valid.float()
    sums = {k: (v * w).sum() for k, v in terms.items() if k in ("ce", "l1", "conf")}
    return sums, w.sum()


def dspark_loss(draft_logits, target_logits, labels, valid, conf_logits=None, weights: LossWeights | None = None):
    """Single-process convenience: [N, γ, V] logits, labels/valid/conf_logits [N, γ] → (loss, {term: mean})."""
    weights = weights or LossWeights()
    terms = block_terms(draft_logits, target_logits, labels, conf_logits)
    sums, denom = weighted_sums(terms, valid, weights.decay)
    means = {k: v / denom.clamp(min=1e-8) for k, v in sums.items()}
    return combine(means, weights), means


def combine(means: dict, weights: LossWeights) -> torch.Tensor:
    loss = weights.ce * means["ce"]
    if weights.l1:
        loss = loss + weights.l1 * means["l1"]
    if weights.conf and "conf" in means:
        loss = loss + weights.conf * means["conf"]
    return loss
