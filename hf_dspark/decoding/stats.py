"""Speculative-decoding metrics, defined once (vLLM's definitions; τ includes the bonus token).

- τ (mean accepted length) = tokens committed per round, the target's bonus/correction token included;
  a round that ends in an accepted EOS (or the length limit) without a bonus counts what it committed.
- acceptance_rate[k] (vLLM's per-position rate) = rounds whose k-th draft was accepted / rounds that drafted ≥ k.
- conditional_acceptance[k] = P(draft k accepted | drafts 1..k-1 accepted and draft k verified).
- drafted_rounds = rounds that drafted at all (the scheduler's draft gate makes plain steps, which count as
  rounds of τ = 1); ngram_rounds = those whose drafts were n-grams from the context
  (drafter.options.ngram_drafts), not the drafter's. Per-position rates pool both kinds: they describe the method as run.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Round:
    """One draft-and-verify round."""

    drafted: int  # draft tokens produced (≤ γ; fewer near the length limit)
    verified: int  # ℓ: draft tokens sent to the target
    accepted: int  # draft tokens the target kept (a prefix of the verified ones)
    committed: int  # tokens added to the sequence this round (accepted + bonus, unless a stop cut it)
    draft_time: float  # seconds in the drafter
    verify_time: float  # seconds from returning the candidates to hearing the verdict (target forward + selection)
    confidence: list[float] = field(default_factory=list)  # calibrated c_k for each drafted position
    target_probs: list[float] = field(default_factory=list)  # target probability of each verified draft token
    tokens: list[int] = field(default_factory=list)  # the drafted tokens
    new_tokens: list[int] = field(default_factory=list)  # what the round committed
    source: str = "dspark"  # who drafted: "dspark" (the drafter; also rounds without drafts) or "ngram" (n-grams)


@dataclass
class DSparkStats:
    block_size: int
    loop: str = "assisted"  # the decoding loop that ran the call (DecodingOptions.loop, after any fallback)
    fallback: str = ""  # why the loop asked for did not take the call (loop.unsupported), if it did not
    prompt_tokens: int = 0
    new_tokens: int = 0
    rounds: list[Round] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    finished: float = 0.0

    def add(self, r: Round) -> None:
        self.rounds.append(r)
        self.finished = time.perf_counter()

    @property
    def wall_time(self) -> float:
        return max(self.finished - self.started, 0.0)

    @property
    def tau(self) -> float:
        return sum(r.committed for r in self.rounds) / len(self.rounds) if self.rounds else 0.0

    @property
    def drafted_rounds(self) -> int:
        return sum(r.drafted > 0 for r in self.rounds)

    @property
    def ngram_rounds(self) -> int:
        return sum(r.source == "ngram" for r in self.rounds)

    @property
    def acceptance_rate(self) -> list[float]:
        out = []
        for k in range(1, self.block_size + 1):
            drafted = sum(r.verified >= k for r in self.rounds)
            out.append(sum(r.accepted >= k for r in self.rounds) / drafted if drafted else float("nan"))
        return out

    @property
    def conditional_acceptance(self) -> list[float]:
        out = []
        for k in range(1, self.block_size + 1):
            reached = sum(r.verified >= k and r.accepted >= k - 1 for r in self.rounds)
            out.append(sum(r.accepted >= k for r in self.rounds) / reached if reached else float("nan"))
        return out

    @property
    def acceptance_histogram(self) -> dict[int, int]:
        return dict(sorted(Counter(r.accepted for r in self.rounds).items()))

    @property
    def verify_lengths(self) -> dict[int, int]:
        return dict(sorted(Counter(r.verified for r in self.rounds).items()))

    @property
    def draft_time(self) -> float:
        return sum(r.draft_time for r in self.rounds)

    @property
    def verify_time(self) -> float:
        return sum(r.verify_time for r in self.rounds)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_time if self.wall_time > 0 else 0.0

    def summary(self) -> dict:
        return {
            "tau": self.tau,
            "rounds": len(self.rounds),
            "drafted_rounds": self.drafted_rounds,
            "ngram_rounds": self.ngram_rounds,
            "new_tokens": self.new_tokens,
            "tokens_per_second": self.tokens_per_second,
            "acceptance_rate": self.acceptance_rate,
            "conditional_acceptance": self.conditional_acceptance,
            "acceptance_histogram": self.acceptance_histogram,
            "verify_lengths": self.verify_lengths,
            "draft_time_s": self.draft_time,
            "verify_time_s": self.verify_time,
            "wall_time_s": self.wall_time,
        }

    def __str__(self) -> str:
        fmt = lambda xs: "[" + ", ".join(f"{x:.2f}" for x in xs) + "]"  # noqa: E731
        return (
            f"DSparkStats(τ={self.tau:.2f} over {len(self.rounds)} rounds ({self.drafted_rounds} drafted"
            f"{f', {self.ngram_rounds} by n-grams' if self.ngram_rounds else ''}), "
            f"{self.new_tokens} new tokens, "
            f"{self.tokens_per_second:.1f} tok/s, draft {self.draft_time:.2f}s / verify {self.verify_time:.2f}s, "
            f"conditional acceptance {fmt(self.conditional_acceptance)}, verify lengths {self.verify_lengths})"
        )
