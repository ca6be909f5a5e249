"""How many of a round's drafts go to verification: the drafter-level knob `drafter.options.verify_policy`.

The drafter carries its default options in `drafter.options` (transformers keeps assistant options on the
assistant); one call can pass others, `generate(..., dspark_options=DecodingOptions(...))`, without changing the
drafter (routing.py):

    drafter.options.verify_policy = "auto"             # default: "scheduler" below where the drafter has a
                                                       # confidence head, else a static length of the profile's
                                                       # reach; both behind the draft gate (the best lossless
                                                       # choice the profile supports)
    drafter.options.verify_policy = "all"              # verify every drafted token (fixed length γ; can be slower
                                                       # than plain generate: nothing gates it)
    drafter.options.verify_policy = 3                  # static length: verify min(3, drafted) tokens (0 allowed)
    drafter.options.verify_policy = ("threshold", .5)  # up to the first position whose calibrated c_k < 0.5
    drafter.options.verify_policy = "scheduler"        # hardware-aware prefix scheduler on the device profile,
                                                       # which also skips drafting while drafts do not pay (DraftGate)
    drafter.options.device_profile = profile           # optional: the DeviceProfile to use (else the cached one
                                                       # for this target/device, measured once on first use)
    drafter.options.ngram_drafts = True                # default, any policy: a round whose last 2-4 tokens occurred
                                                       # before verifies the tokens that followed them instead
                                                       # (ngram.py); under "auto"/"scheduler" as many as the
                                                       # scheduler finds worth it

A callable `policy(conf [n] | None) -> int` is accepted too, for experiments and tests; it must honour the
non-anticipation rule (docs/scheduler.md), which nothing here can check.
Whatever the policy, the candidate generator truncates the draft ids and their logits to the same ℓ, and
drafts no more tokens than the policy can ever verify (`max_drafts`): a static length k drafts k, the scheduler
the bound `scheduler.max_verified` of its profile (2 to 7 of 7 on the CPUs measured), past which it never
verifies.
N-gram drafts cost nothing to draft and carry no confidence. Under "auto" and "scheduler" their survival c_k is
learnt from what rounds commit (scheduler.SurvivalEstimate: a free observation every round a lookup offered drafts,
verified or not) and the scheduler chooses how many to verify on the profile at an n-gram round's overhead (the
roll-back, no drafter), 0 included, over lookups of up to `scheduler.best_prefix_reach` drafts (the most that
rule can choose): a steep step-time curve (bf16 on a CPU without native bf16) verifies fewer of them.
Other policies take them all up to `max_ngram_drafts`: the static k, else γ.

Built not to lose to plain: under "auto" and "scheduler" a DraftGate (scheduler.py) watches what drafter rounds
commit against what they cost on the profile and turns them into plain target steps while they do not pay
(probing again at doubling intervals; a drafter calibrated at the call's temperature starts it from what that
calibration measured, config.calibration, so a call does not relearn it); n-gram drafts are verified only as far as their learnt survival pays on
the same profile (an estimate: the first lookups of a generate() call follow its prior). "all", static k and
thresholds have no profile and no gate: they are for experiments.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch

from .options import DecodingOptions
from .scheduler import (
    DraftGate,
    SurvivalEstimate,
    best_prefix_length,
    best_prefix_reach,
    conditional_survival,
    max_verified,
    static_threshold_length,
)


class VerifyPolicy:
    """The policy of one generate() call, resolved once (profile loaded or measured up front, not mid-decode)."""

    def __init__(self, spec, drafter, target, temperature: float | None = None, device_profile=None,
                 loop: str = "assisted"):
        """temperature: the call's sampling temperature, 0 for greedy, None if unknown (no gate prior);
        device_profile: the DeviceProfile to use (None: the cached one for this target/device and the decoding
        `loop` that runs the call, measured once)."""
        self.spec, self.drafter = spec, drafter
        self.profile = None
        self.needs_confidence = False
        self.max_drafts = drafter.config.block_size  # drafts worth computing per round
        self.max_ngram_drafts = drafter.config.block_size  # n-gram drafts worth verifying per round
        self.gate: DraftGate | None = None  # drafter rounds
        self.ngram_survival: SurvivalEstimate | None = None  # n-gram drafts' c_k, under the scheduler
        if callable(spec):
            self._length: Callable = spec
            self.needs_confidence = drafter.confidence_head is not None
        elif isinstance(spec, str) and spec == "all":
            self._length = lambda conf, n: n
        elif isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
            self._length = lambda conf, n: min(spec, n)
            self.max_drafts = self.max_ngram_drafts = min(spec, self.max_drafts)
        elif isinstance(spec, tuple) and len(spec) == 2 and spec[0] == "threshold" and 0 <= float(spec[1]) <= 1:
            t = float(spec[1])
            self._length, self.needs_confidence = (lambda conf, n: static_threshold_length(conf, t)), True
        elif isinstance(spec, str) and spec in ("scheduler", "auto"):
            self.profile = DecodingOptions(device_profile=device_profile, loop=loop).profile_for(target, drafter)
            sampled = temperature is not None and temperature != 0  # a sampled round also builds and draws from q
            self.overhead = overhead = self.profile.round_overhead_at(sampled)
            reach = max_verified(self.profile.verify_time, overhead)
            self.max_drafts = min(reach, self.max_drafts)
            if spec == "scheduler" or drafter.confidence_head is not None:
                self._length = lambda conf, n: self.profile.verify_length(conf, sampled)
                self.needs_confidence = True
            else:  # "auto" without a confidence head: the most the scheduler could verify, the gate decides if at all
                self._length = lambda conf, n: min(self.max_drafts, n)
            # an n-gram round pays no drafter, only the roll-back; its length is a best prefix, not the walk
            self.max_ngram_drafts = min(best_prefix_reach(self.profile.verify_time, self.profile.rollback_time),
                                        self.max_ngram_drafts)
            self.gate = self._carried_gate(target, temperature) or DraftGate(
                self.profile.verify_time, overhead, prior=self._gate_prior(temperature))
            self.ngram_survival = SurvivalEstimate()
        else:
            raise ValueError(
                f"verify_policy must be 'auto', 'all', an int k >= 0, ('threshold', t) with t in [0, 1], "
                f"'scheduler' or a callable; got {spec!r}"
            )
        if self.needs_confidence and drafter.confidence_head is None and not callable(spec):
            raise ValueError(f"verify_policy={spec!r} needs the drafter's confidence head (confidence_head=True)")

    @classmethod
    def for_call(cls, drafter, target, options=None, temperature: float | None = None) -> "VerifyPolicy":
        """The policy of a call with these DecodingOptions (default: the drafter's `options`)."""
        options = (drafter.options if options is None else options).concrete(target, drafter)
        return cls(options.verify_policy, drafter, target, temperature, options.device_profile, options.loop)

    def _carried_gate(self, target, temperature: float | None) -> DraftGate | None:
        """Greedy calls share one DraftGate per (drafter, target, policy, profile): a call starts with the averages
        the last one left instead of paying its ramp again, and a closed gate probes once at the call's start (a wait
        grown on earlier prompts must not keep a prompt that pays from being tried). Output is unchanged (a gate only decides what to verify, never
        what is committed). Sampled calls each start from the calibration prior: there the gate's decisions steer how
        the random stream is consumed, so carrying it would make a seed give another output on a second call."""
        if temperature != 0:
            return None
        prior = self._gate_prior(temperature)  # a new calibration starts a new gate
        gates = _GREEDY_GATES.setdefault(self.drafter, {})
        key = (id(target), repr(self.spec), repr(self.profile.key), tuple(self.profile.verify_time), prior)
        if key not in gates:
            gates[key] = DraftGate(self.profile.verify_time, self.overhead, prior=prior)
        gate = gates[key]
        gate.skipped = gate.wait  # a closed gate probes once at a call's start: this prompt may pay where the last did not
        return gate

    def _gate_prior(self, temperature: float | None) -> tuple[float, int] | None:
        """(accepted drafts, verified drafts) of a drafted round as this policy would run it, from the survival the
        drafter's calibration measured (config.calibration), if it was calibrated at exactly this call's
        temperature; else None (the gate learns from scratch). The length is the policy's own on the conditional
        rates."""
        cal = self.drafter.config.calibration_at(temperature)
        if cal is None or abs(float(cal["temperature"]) - float(temperature)) > 1e-6:
            return None
        prefix = torch.tensor([float(r) for r in cal["prefix_survival"][: self.max_drafts]], dtype=torch.float64)
        n = int(self._length(conditional_survival(prefix), len(prefix)))
        return float(prefix[:n].sum()), n

    def should_draft(self) -> bool:
        """Whether this round drafts at all (always, except under the scheduler's DraftGate). Call once per round
        that could draft, before drafting, and report the round to `record` afterwards."""
        return self.gate is None or self.gate.should_draft()

    def record(self, drafted: int, verified: int, accepted: int) -> None:
        """A finished round: drafts computed, sent to verification, accepted."""
        if self.gate is not None:
            self.gate.record(drafted > 0, verified, accepted)

    def ngram_length(self, n: int) -> int:
        """Of a lookup's n drafts (n ≤ max_ngram_drafts), how many to verify: all, except under the scheduler, which
        weighs their learnt survival against the profile (0: the round goes on as a drafter round or a plain step)."""
        if self.ngram_survival is None or n == 0:
            return n
        return best_prefix_length(self.ngram_survival.conf(n), self.profile.verify_time, self.profile.rollback_time)

    def observe_ngram(self, drafts: list[int], committed: list[int]) -> None:
        """A finished round whose lookup offered `drafts`: the tokens it committed from the same position."""
        if self.ngram_survival is not None and drafts:
            self.ngram_survival.observe(drafts, committed)

    def length(self, conf: torch.Tensor | None, n: int) -> int:
        """Calibrated c_k [n] of the n drafted positions (None without a confidence head) → ℓ in 0..n. c_k was
        computed before x_k was sampled, and the scheduler's early stop keeps x_k's admission from depending on
        anything later."""
        conf = conf if self.needs_confidence else None
        length = int(self.spec(conf)) if callable(self.spec) else int(self._length(conf, n))
        if not 0 <= length <= n:
            raise ValueError(f"verify policy {self.spec!r} returned {length} for {n} drafts")
        return length


# drafter → {(target id, policy, profile): the DraftGate its greedy calls share}; dropped with the drafter
_GREEDY_GATES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
