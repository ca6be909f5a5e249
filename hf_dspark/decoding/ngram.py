"""N-gram drafts from the context itself (prompt lookup), for the rounds where they beat the drafter.

Answers often copy spans of their prompt or of themselves (numbers in a GSM8K solution, identifiers in code).
When the last `n` committed tokens (n = max_ngram..min_ngram, longest first) occurred earlier, the tokens that
followed their latest earlier occurrence are a free draft: no drafter pass, and on a CPU whose step-time curve is
flat (research/record/benchmarks.md) verifying 7 of them costs little more than one plain step.

Differences from transformers' `prompt_lookup_num_tokens`, chosen by replaying benchmark outputs
(research/record/benchmarks.md, "hybrid"): the latest earlier occurrence, not the first (recent text predicts better);
n-grams of 2-4 tokens (single-token matches paid less than they cost); the matched suffix lies in the answer
(`answer_start`): a suffix reaching back into the prompt ends in the chat template's last token and the answer's
first, like "\n" + "I", and what followed it in the prompt was never what came next (0 of 78 such drafts
accepted over 31 calls, research/record/benchmarks.md); and an index updated with each round's new tokens instead
of a scan of the whole sequence.

Lossless: the draft is a function of the committed tokens only, a point mass q. Greedy verification keeps its
matching prefix; sampled verification (transformers' "sample and compare" path, used when no draft logits are
passed) commits y_k ~ p and keeps the draft while y_k equals it, so every token is drawn from the target.
"""

from __future__ import annotations

MIN_NGRAM, MAX_NGRAM = 2, 4


class NgramIndex:
    """Latest earlier occurrence of every n-gram (MIN_NGRAM ≤ n ≤ MAX_NGRAM) of one growing sequence."""

    def __init__(self, min_ngram: int = MIN_NGRAM, max_ngram: int = MAX_NGRAM):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.seq: list[int] = []
        self.last_end: dict[tuple[int, ...], int] = {}  # n-gram → end index (exclusive) of its latest occurrence
        self.indexed = 0  # n-grams ending at or before this index are in last_end
        self.answer_start = 0  # a matched suffix lies in seq[answer_start:] (0: anywhere)

    def extend(self, ids: list[int]) -> None:
        """The sequence now reads seq + ids (committed tokens only: the sequence never shrinks)."""
        self.seq.extend(ids)

    def draft(self, num: int) -> list[int]:
        """Up to `num` tokens that followed the latest earlier occurrence of the longest matching suffix n-gram
        (MAX_NGRAM down to MIN_NGRAM tokens, at most the tokens since answer_start); [] when none occurred before."""
        seq, end = self.seq, len(self.seq)
        # index every n-gram that ends before the last token: those are the "earlier" occurrences
        for e in range(max(self.indexed, self.min_ngram), end):
            for n in range(self.min_ngram, min(self.max_ngram, e) + 1):
                self.last_end[tuple(seq[e - n:e])] = e
        self.indexed = max(self.indexed, end)
        if num <= 0:
            return []
        for n in range(min(self.max_ngram, end - 1, end - self.answer_start), self.min_ngram - 1, -1):
            e = self.last_end.get(tuple(seq[end - n:]))
            if e is not None:
                return seq[e:e + num]
        return []
