"""Judging a bf16/fp16 greedy output that left plain decoding, against the target loaded in float32 (the referee).

In float32 DSpark's greedy output is token-for-token plain `generate`'s, and any difference is a bug. In bf16/fp16
a 1-token decode step and a multi-token verification forward round differently, so at a near-tie greedy decoding
can take the other token (transformers' own prompt lookup does too), and from there the two texts go their own
ways. What can still be checked is that the output is greedy decoding of the *model* up to rounding: from the first
difference on, each token must be within `tolerance` float32 logits of the referee's best (on SmolLM2 the flips
measured 0.02-0.2 logits apart; ordinary choices win by much more). A real bug (a wrong token, a skipped logits
processor) does not pass: the check is on every position from the first difference, not only on that one.
"""

from __future__ import annotations

import torch

TIE_TOLERANCE = 0.5  # float32 logits


@torch.no_grad()
def judge_divergence(plain: torch.Tensor, other: torch.Tensor, prompt_len: int, referee=None,
                     tolerance: float = TIE_TOLERANCE) -> dict:
    """plain, other: greedy outputs [1, len] (prompt included) that differ; referee: the target in float32.

    → {"position": first differing index among the new tokens (0-based), "plain_token", "token", "near_tie"} and,
    when the referee could judge: "fp32_gap" = |logit(plain_token) − logit(token)| at that position,
    "off_argmax" = positions from there on where `other` is not the referee's argmax, "max_gap" = the largest
    (best logit − chosen logit) over those positions, plain's token at the first one included. "near_tie" is True
    only if that is ≤ tolerance. Never a near-tie: no referee, a difference inside the prompt or in length only,
    or a target whose generation config changes greedy scores (its logits processors; the referee judges raw
    logits, so it refuses rather than misjudge; "reason" says which)."""
    a, b = plain[0].tolist(), other[0].tolist()
    j = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    d = {"position": j - prompt_len, "plain_token": a[j] if j < len(a) else None,
         "token": b[j] if j < len(b) else None, "near_tie": False}
    if referee is None:
        return d
    if j < prompt_len or d["plain_token"] is None or d["token"] is None:
        d["reason"] = "the prompt differs" if j < prompt_len else "one output is a prefix of the other"
        return d
    dev = referee.device
    probe = referee.generate(torch.tensor([a[:j]], device=dev), max_new_tokens=1, do_sample=False, output_scores=True,
                             output_logits=True, return_dict_in_generate=True)
    if not torch.equal(probe.scores[0], probe.logits[0]):
        d["reason"] = "the target's logits processors change greedy scores; the referee judges raw logits"
        return d
    # rows predicting b[j:]: a forward over b[:-1] keeps its last len(b) - j rows
    logits = referee(torch.tensor([b[:-1]], device=dev), logits_to_keep=len(b) - j).logits[0].float()
    best = logits.max(-1).values
    gaps = best - logits.gather(1, torch.tensor(b[j:], device=dev)[:, None])[:, 0]  # [len(b) - j], ≥ 0
    plain_gap = float(best[0] - logits[0, a[j]])
    d["fp32_gap"] = abs(float(logits[0, a[j]] - logits[0, b[j]]))
    d["off_argmax"] = int((gaps > 0).sum())
    d["max_gap"] = max(float(gaps.max()), plain_gap)
    d["near_tie"] = d["max_gap"] <= tolerance
    return d
