"""DSparkLogitsProcessor: an observer in the target's processor list that records, during verification,
the target's (processed) probability of each draft token. It never changes the scores."""

from __future__ import annotations

import torch
from transformers import LogitsProcessor


class DSparkLogitsProcessor(LogitsProcessor):
    """Put last in the target's list (after the warpers), so it sees exactly the distribution the target
    samples from. Transformers calls it once per verified position with the draft prefix as `input_ids`;
    it may revisit a prefix length in a later round, so records are keyed by round, overwritten, not counted.
    """

    def __init__(self):
        self.candidate: torch.Tensor | None = None  # [1, cur_len + ℓ]
        self.cur_len = 0
        self.target_probs: dict[int, float] = {}  # position k (1-based) → p_target(x_k)
        self.target_tokens: dict[int, int] = {}  # position k (1-based) → target argmax

    def begin_round(self, candidate_ids: torch.Tensor, cur_len: int) -> None:
        self.candidate, self.cur_len = candidate_ids, cur_len
        self.target_probs, self.target_tokens = {}, {}

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        top, arg = scores[0].max(-1)  # one pass: max propagates NaN, and +inf is the max if present
        if torch.isnan(top) or torch.isposinf(top):
            # -inf is a processor's "forbidden"; NaN/+inf mean the target itself broke (e.g. fp16 overflow).
            raise ValueError(f"the target produced NaN/+inf logits at sequence length {input_ids.shape[1]}")
        if self.candidate is None:  # the prefill step: nothing drafted yet
            return scores
        k = input_ids.shape[1] - self.cur_len + 1  # which draft position these scores judge
        self.target_tokens[k] = int(arg)
        if input_ids.shape[1] < self.candidate.shape[1]:
            token = self.candidate[0, input_ids.shape[1]]
            s = scores[0].float()
            self.target_probs[k] = float(torch.exp(s[token] - torch.logsumexp(s, -1)))
        return scores
