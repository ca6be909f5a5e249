"""How many of a round's drafts go to verification: the drafter-level knob `drafter.verify_policy`.

Options live on the drafter (transformers keeps assistant options on the assistant), so `generate()` keeps
its signature:

    drafter.verify_policy = "auto"             # default: "scheduler" below where the drafter has a confidence
                                               # head, else a static length of the profile's reach; both behind
                                               # the draft gate (the best lossless choice the profile supports)
    drafter.verify_policy = "all"              # verify every drafted token (fixed length γ; can be slower
                                               # than plain generate: nothing gates it)
    drafter.verify_policy = 3                  # static length: verify min(3, drafted) tokens (0 allowed)
    drafter.verify_policy = ("threshold", .5)  # up to the first position whose calibrated c_k < 0.5 (§4.4)
    drafter.verify_policy = "scheduler"        # hardware-aware prefix scheduler on the device profile (§6.3),
                                               # which also skips drafting while drafts do not pay (DraftGate)
    drafter.device_profile = profile           # optional: the DeviceProfile to use (else the cached one for
                                               # this target/device, measured once on first use)
    drafter.ngram_drafts = True                # default, any policy: a round whose last 2-4 tokens occurred
                                               # before verifies the tokens that followed them instead (ngram.py);
                                               # under "auto"/"scheduler" behind a gate of their own

A callable `policy(conf [n] | None) -> int` is accepted too, for experiments and tests; it must honour the
non-anticipation rule (docs/scheduler.md), which nothing here can check.
Whatever the policy, the candidate generator truncates the draft ids and their logits to the same ℓ, and
drafts no more tokens than the policy can ever verify (`max_drafts`): a static length k drafts k, the scheduler
the bound `scheduler.max_verified` of its profile (2 of 7 on the 2-core CPU), past which it never verifies.
N-gram drafts cost nothing to draft and carry no confidence, so a round takes all of them up to `max_ngram_drafts`:
the static k; under the scheduler `max_verified` at an n-gram round's overhead (the roll-back, no drafter), which
is at most its bound for drafter rounds (a smaller fixed cost makes each longer forward relatively dearer); else γ.

Never slower than plain, by construction: under "auto" and "scheduler" two DraftGates (scheduler.py) watch what
rounds commit against what they cost on the profile, one for drafter rounds, one for n-gram rounds, and turn
either kind into plain target steps while it does not pay (probing again at doubling intervals). "all", static
k and thresholds have no profile and no gate: they are for experiments.
"""

from __future__ import annotations

from typing import Callable

import torch

from .profile import ProfileMismatchError, get_profile, profile_key
from .scheduler import DraftGate, max_verified, static_threshold_length


class VerifyPolicy:
    """The policy of one generate() call, resolved once (profile loaded or measured up front, not mid-decode)."""

    def __init__(self, spec, drafter, target):
        self.spec, self.drafter = spec, drafter
        self.profile = None
        self.needs_confidence = False
        self.max_drafts = drafter.config.block_size  # drafts worth computing per round
        self.max_ngram_drafts = drafter.config.block_size  # n-gram drafts worth verifying per round
        self.gate: DraftGate | None = None  # drafter rounds
        self.ngram_gate: DraftGate | None = None  # n-gram rounds
        if callable(spec):
            self._length: Callable = spec
            self.needs_confidence = drafter.confidence is not None
        elif isinstance(spec, str) and spec == "all":
            self._length = lambda conf, n: n
        elif isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
            self._length = lambda conf, n: min(spec, n)
            self.max_drafts = self.max_ngram_drafts = min(spec, self.max_drafts)
        elif isinstance(spec, tuple) and len(spec) == 2 and spec[0] == "threshold" and 0 <= float(spec[1]) <= 1:
            t = float(spec[1])
            self._length, self.needs_confidence = (lambda conf, n: static_threshold_length(conf, t)), True
        elif isinstance(spec, str) and spec in ("scheduler", "auto"):
            self.profile = _profile_for(drafter, target)
            overhead = self.profile.round_overhead
            reach = max_verified(self.profile.verify_time, overhead)
            self.max_drafts = min(reach, self.max_drafts)
            if spec == "scheduler" or drafter.confidence is not None:
                self._length, self.needs_confidence = (lambda conf, n: self.profile.verify_length(conf)), True
            else:  # "auto" without a confidence head: the most the scheduler could verify, the gate decides if at all
                self._length = lambda conf, n: min(self.max_drafts, n)
            # an n-gram round pays no drafter, only the roll-back: the scheduler's reach at that overhead
            self.max_ngram_drafts = min(max_verified(self.profile.verify_time, self.profile.rollback_time),
                                        self.max_ngram_drafts)
            self.gate = DraftGate(self.profile.verify_time, overhead)
            self.ngram_gate = DraftGate(self.profile.verify_time, self.profile.rollback_time)
        else:
            raise ValueError(
                f"drafter.verify_policy must be 'auto', 'all', an int k >= 0, ('threshold', t) with t in [0, 1], "
                f"'scheduler' or a callable; got {spec!r}"
            )
        if self.needs_confidence and drafter.confidence is None and not callable(spec):
            raise ValueError(f"verify_policy={spec!r} needs the drafter's confidence head (confidence_head=True)")

    @classmethod
    def for_drafter(cls, drafter, target) -> "VerifyPolicy":
        return cls(drafter.options.verify_policy, drafter, target)

    def should_draft(self) -> bool:
        """Whether this round drafts at all (always, except under the scheduler's DraftGate). Call once per round
        that could draft, before drafting, and report the round to `record` afterwards."""
        return self.gate is None or self.gate.should_draft()

    def record(self, drafted: int, verified: int, accepted: int) -> None:
        """A finished round: drafts computed, sent to verification, accepted."""
        if self.gate is not None:
            self.gate.record(drafted > 0, verified, accepted)

    def should_ngram(self) -> bool:
        """Whether a round that has n-gram drafts takes them (always, except under the n-gram DraftGate). If not,
        report `record_ngram(None)`; the round then goes on as a drafter round or a plain step."""
        return self.ngram_gate is None or self.ngram_gate.should_draft()

    def record_ngram(self, verified: int | None, accepted: int = 0) -> None:
        """A round that had n-gram drafts: how many it verified and how many were accepted (None: not taken)."""
        if self.ngram_gate is not None:
            self.ngram_gate.record(verified is not None, verified or 0, accepted)

    def length(self, conf: torch.Tensor | None, n: int) -> int:
        """Calibrated c_k [n] of the n drafted positions (None without a confidence head) → ℓ in 0..n. c_k was
        computed before x_k was sampled, and the scheduler's early stop keeps x_k's admission from depending on
        anything later."""
        conf = conf if self.needs_confidence else None
        length = int(self.spec(conf)) if callable(self.spec) else int(self._length(conf, n))
        if not 0 <= length <= n:
            raise ValueError(f"verify policy {self.spec!r} returned {length} for {n} drafts")
        return length


def _profile_for(drafter, target):
    profile = drafter.options.device_profile
    if profile is None:
        return get_profile(target, drafter, measure=True)
    key = profile_key(target, drafter)
    if profile.key != key:
        raise ProfileMismatchError(
            f"drafter.device_profile was measured for {profile.key}, but this generate runs {key}; "
            "set drafter.device_profile = None to use (or measure) the profile for this setup"
        )
    return profile
