"""The prefix scheduler: how many of the drafted tokens are worth verifying.

Pure functions over confidences and cost tables, no model code. Notation: R requests, γ drafted positions,
c [R, γ] the calibrated *conditional* survival c_k = P(x_k accepted | x_1..x_{k-1} accepted), a = cumprod(c)
the prefix survival, ℓ the number of drafts sent to verification (0 allowed), B = Σ_r (1 + ℓ_r) the tokens in
the verification forward (each request always verifies its anchor row, which yields the bonus token).

Losslessness (non-anticipation): whether x_k is verified may depend on c_1..c_k and x_1..x_{k-1}, never on x_k
or anything computed from it (c_{k+1} reads W1[x_k]). The early stop of Algorithm 1 guarantees it: the walk
admits x_k only after looking at values ≥ a_k, and stops at the first candidate that does not raise the
throughput, before any later (x_k-dependent) value can influence x_k. A search without the stop is biased.
"""

from __future__ import annotations

from typing import Sequence

import torch


def survival(conf: torch.Tensor) -> torch.Tensor:
    """Conditional survival c [..., γ] → prefix survival a_k = ∏_{i≤k} c_i [..., γ] (float64, clamped to [0, 1])."""
    return torch.cumprod(torch.as_tensor(conf, dtype=torch.float64).clamp(0.0, 1.0), dim=-1)


def conditional_survival(prefix: torch.Tensor) -> torch.Tensor:
    """The inverse of `survival`: prefix survival a [..., γ] → conditional c_k = a_k / a_{k-1} [..., γ] (float64;
    0 past a prefix that has died, a_{k-1} = 0)."""
    a = torch.as_tensor(prefix, dtype=torch.float64).clamp(0.0, 1.0)
    before = torch.cat([torch.ones_like(a[..., :1]), a[..., :-1]], dim=-1)
    return torch.where(before > 0, a / before.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(a))


def greedy_admission(conf: torch.Tensor, sps_table: Sequence[float]) -> list[int]:
    """Algorithm 1: greedy admission with early stop. Maximises Θ = τ_tot · SPS(B) along the walk.

    conf [R, γ] calibrated conditional survival; sps_table[B - 1] = engine steps per second for a verification
    forward of B tokens (B = 1..len(sps_table); a B beyond the table is never reached). → ℓ_r for each request.
    Candidates (r, j) are visited by a_{r,j} descending, ties by position j then request r, so every request's
    admitted drafts are a prefix; the walk stops at the first candidate that does not strictly raise Θ.
    """
    a = survival(conf)
    if a.dim() != 2:
        raise ValueError(f"conf must be [R, γ], got shape {tuple(a.shape)}")
    R, gamma = a.shape
    if len(sps_table) < R:
        raise ValueError(f"sps_table covers {len(sps_table)} tokens, fewer than the {R} anchor rows")
    cands = sorted(
        ((float(a[r, j]), j, r) for r in range(R) for j in range(gamma) if a[r, j] > 0),
        key=lambda t: (-t[0], t[1], t[2]),
    )
    lengths, best = [0] * R, [0] * R
    B, tau = R, float(R)
    theta_best = tau * sps_table[B - 1]
    for a_rj, j, r in cands:
        if B + 1 > len(sps_table):
            break
        assert lengths[r] == j, "admission must extend a prefix"  # guaranteed by the sort (a non-increasing in j)
        lengths[r], B, tau = j + 1, B + 1, tau + a_rj
        theta = tau * sps_table[B - 1]
        if theta > theta_best:
            theta_best, best = theta, list(lengths)
        else:
            break  # REQUIRED: looking past this point would let x_k-dependent values decide about x_k (docs/scheduler.md)
    return best


def monotone_envelope(step_time: Sequence[float]) -> list[float]:
    """Step times T [n] (T[i] = cost of verifying i+1 tokens) → T*(k) = min_{j≥k} T(j) [n], non-decreasing.

    Verifying more tokens than chosen never changes the output distribution, so a length k can always be run
    as the cheaper longer forward j ≥ k: the envelope is the true cost of "at least k" (see `pad_length`).
    """
    out, running = [], float("inf")
    for t in reversed(list(step_time)):
        running = min(running, float(t))
        out.append(running)
    return out[::-1]


def pad_length(length: int, step_time: Sequence[float]) -> int:
    """Drafts chosen `length` → drafts to verify: the smallest j ≥ length whose forward of j+1 tokens costs
    the envelope T*(length+1). Depends only on `length` and the table, so it stays lossless."""
    target = monotone_envelope(step_time)[length]
    return next(j for j in range(length, len(step_time)) if float(step_time[j]) <= target)


def steps_per_second(step_time: Sequence[float], overhead: float = 0.0) -> list[float]:
    """SPS(B) = 1 / (overhead + T(B)) [n]; overhead is the fixed per-round cost (drafting, cache roll-back)."""
    return [1.0 / (overhead + float(t)) for t in step_time]


def single_stream_length(conf: torch.Tensor, step_time: Sequence[float], draft_time: float = 0.0) -> int:
    """Batch-1 scheduler: drafts to verify for one request.

    conf [n] calibrated conditional survival of the n drafted positions; step_time [≥ n+1] seconds of a target
    verification forward of 1..n+1 tokens (only the first n+1 are used); draft_time: fixed per-round seconds.
    Runs Algorithm 1 with R = 1 on SPS(B) = 1/(draft_time + T*(B)) (monotone envelope, so timing noise or a
    non-monotone GEMM curve cannot trap the early stop), then pads to the cheaper longer forward. → ℓ in 0..n.
    """
    conf = torch.as_tensor(conf).reshape(-1)
    n = conf.numel()
    if len(step_time) < n + 1:
        raise ValueError(f"step_time has {len(step_time)} entries; {n} drafts need {n + 1}")
    table = [float(t) for t in step_time[: n + 1]]
    (length,) = greedy_admission(conf[None], steps_per_second(monotone_envelope(table), draft_time))
    return pad_length(length, table)


def best_prefix_length(conf: Sequence[float], step_time: Sequence[float], draft_time: float = 0.0) -> int:
    """Batch-1 length for drafts whose survival c [n] was fixed before the round and does not depend on the drafts
    (n-gram lookups, c learnt from earlier rounds): the argmax over every prefix of Θ(ℓ) = (1 + Σ_{k≤ℓ} a_k) /
    (draft_time + T*(1+ℓ)) on the monotone envelope, then padded like `single_stream_length`. Algorithm 1's early
    stop exists because a drafter's c_{k+1} reads x_k; here no c reads any draft, so looking past a dip (a 2-token
    forward dearer per token than a 5-token one, as small-batch CPU matmuls can be) biases nothing. → ℓ in 0..n.
    On a drafter's confidences this is the look-ahead search, which is biased: the tests' negative control."""
    a = survival(torch.as_tensor(conf, dtype=torch.float64).reshape(-1)).tolist()
    n = len(a)
    if len(step_time) < n + 1:
        raise ValueError(f"step_time has {len(step_time)} entries; {n} drafts need {n + 1}")
    table = [float(t) for t in step_time[: n + 1]]
    env = monotone_envelope(table)
    theta = [(1.0 + sum(a[:k])) / (draft_time + env[k]) for k in range(n + 1)]
    return pad_length(max(range(n + 1), key=lambda k: (theta[k], -k)), table)


def best_prefix_reach(step_time: Sequence[float], draft_time: float = 0.0) -> int:
    """The most drafts `best_prefix_length(c, step_time, draft_time)` returns for any c [γ] (γ = len(step_time) - 1):
    its choice when every draft is sure to survive. With C_k = draft_time + T*(1+k), K that choice before padding
    and any survival a (non-increasing, a_0 = 1): Σ_{K<j≤k} a_j ≤ (k−K)·a_K and 1 + Σ_{j≤K} a_j ≥ 1 + K·a_K, so
    Θ_a(k)/Θ_a(K) ≤ ((1+k)/(1+K))·(C_K/C_k) = Θ_1(k)/Θ_1(K) ≤ 1 for k > K: no longer prefix wins (ties go to the
    shorter), and padding is monotone. Computing lookups longer than this is wasted work."""
    return best_prefix_length([1.0] * (len(step_time) - 1), step_time, draft_time)


def static_threshold_length(conf: torch.Tensor, threshold: float) -> int:
    """conf [n] conditional survival → index of the first position with c_k < threshold (n if none; 0 allowed)."""
    below = (torch.as_tensor(conf).reshape(-1) < threshold).nonzero()
    return int(below[0]) if len(below) else int(torch.as_tensor(conf).numel())


def max_verified(step_time: Sequence[float], draft_time: float = 0.0) -> int:
    """The most drafts `single_stream_length(conf, step_time, draft_time)` can return for any conf [γ]
    (γ = len(step_time) - 1), padding included. Drafting more than this is wasted work.

    Admitting draft k+1 needs a_{k+1} / τ_k > r_k = (T*(k+2) − T*(k+1)) / (draft_time + T*(k+1)); since
    a_{k+1} ≤ a_i for i ≤ k, τ_k = 1 + Σ_{i≤k} a_i ≥ 1 + k·a_{k+1}, so the left side is at most 1/(1+k). The walk
    therefore never passes the first k with r_k ≥ 1/(1+k). Calling the scheduler with only the first
    `max_verified` drafts (and step_time[:max_verified + 1]) returns the same length: tests/test_scheduler.py.
    """
    env = monotone_envelope(step_time)
    gamma = len(env) - 1
    reach = gamma
    for k in range(gamma):
        if (env[k + 1] - env[k]) / (draft_time + env[k]) >= 1.0 / (1 + k):
            reach = k
            break
    return max(pad_length(length, step_time) for length in range(reach + 1))


class DraftGate:
    """Batch-1 decision, before a round drafts anything, whether drafting is worth it at all (scheduler policy).

    A drafted round costs draft_time + T*(1 + ℓ) and commits 1 + (accepted drafts) tokens; a round without
    drafts is a plain decode step, T(1) for one token. The gate keeps exponential averages over drafted rounds
    (weight `weight` on the newest; a skipped round is no observation and changes nothing) of the accepted drafts
    and of that cost, and drafts while (1 + A)·T(1) > C. Skipped rounds do not age the history: when one probe
    counted alone, a single lucky draw reopened the gate, and at temperature 1, where whether a draft survives is a
    coin flip, a drafter below break-even was drafting a third of the rounds and ran slower than plain. When it stops drafting it probes again
    after 1, 2, 4, ... skipped rounds: the wait doubles after each probe that does not pay, until a probe's loss
    (C - (1 + A)·T(1): what the drafted round cost beyond plain steps for the same tokens) spread over the wait
    is at most `budget` (default 1 %) of a plain step, and resets after a probe that pays. So a drafter that has
    stopped paying makes decoding at most ~`budget` slower than plain, once the wait has grown (log2 of it probes).
    That ramp is paid by every generate() call; a `prior` (how many drafts a drafted round accepted and how many it
    verified when the drafter was calibrated at this temperature) starts the averages there instead, and, if it
    does not pay, the wait where PRIOR_PROBES failed probes would have left it (a prompt that does pay still
    reopens the gate, a little later).

    Lossless: the decision for a round depends only on the prior and earlier rounds' outcomes, never on the round's own drafts,
    so every round's output law is the target's (a round without drafts is exactly a target step). It reads only
    token counts and the profile's fixed costs, never a clock, so a seeded run makes the same decisions again.
    """

    PRIOR_PROBES = 3  # a prior that does not pay counts as this many failed probes: the wait starts at 8, not 1

    def __init__(self, step_time: Sequence[float], draft_time: float, weight: float = 0.25, budget: float = 0.01,
                 prior: tuple[float, int] | None = None):
        self.env = monotone_envelope(step_time)
        if not 0 < budget < 1:
            raise ValueError(f"budget must be in (0, 1), got {budget}")
        self.draft_time, self.weight, self.budget = float(draft_time), float(weight), float(budget)
        self.accepted: float | None = None  # EMA of drafts accepted per drafted round
        self.cost: float | None = None  # EMA of seconds per drafted round
        self.skipped, self.wait, self.probing = 0, 1, False
        if prior is not None:
            # (accepted drafts, verified drafts) of a drafted round, known before the call (the drafter's
            # calibration at this temperature), priced like any round: the averages start there, and a prior that
            # does not pay counts as PRIOR_PROBES failed probes (the wait they would have reached, at most the
            # budget's), so a call skips that much of the ramp, yet a prompt on which the drafter does pay is
            # found within a few probes.
            accepted, verified = prior
            if not (float(accepted) >= 0 and isinstance(verified, int) and 0 <= verified and accepted <= verified):
                raise ValueError(f"prior must be (accepted drafts >= 0, verified drafts: an int >= accepted), "
                                 f"got {prior}")
            self.accepted, self.cost = float(accepted), self.round_cost(verified)
            for _ in range(self.PRIOR_PROBES):
                if self._probe_loss() > self.budget * self.wait * self.env[0]:
                    self.wait *= 2

    def round_cost(self, verified: int) -> float:
        """Seconds of a drafted round that verifies `verified` drafts: drafting plus the (1 + verified)-token pass."""
        return self.draft_time + self.env[min(verified, len(self.env) - 1)]

    def _probe_loss(self) -> float:
        """Seconds a drafted round loses against plain steps for the same tokens, on the averages (< 0: it pays)."""
        return self.cost - (1.0 + self.accepted) * self.env[0]

    def profitable(self) -> bool:
        return self.accepted is None or (1.0 + self.accepted) * self.env[0] > self.cost

    def should_draft(self) -> bool:
        self.probing = not self.profitable()
        return not self.probing or self.skipped >= self.wait

    def record(self, drafted: bool, verified: int = 0, accepted: int = 0) -> None:
        """After a round: whether it drafted, and if so how many drafts it verified and how many were accepted."""
        if not drafted:
            self.skipped += 1
            return
        cost = self.round_cost(verified)
        if self.accepted is None:
            self.accepted, self.cost = float(accepted), cost
        else:
            w = self.weight
            self.accepted = (1 - w) * self.accepted + w * accepted
            self.cost = (1 - w) * self.cost + w * cost
        if self.probing:
            if self.profitable():
                self.wait = 1
            elif self._probe_loss() > self.budget * self.wait * self.env[0]:  # probing every `wait` still costs too much
                self.wait *= 2
        self.skipped, self.probing = 0, False


class SurvivalEstimate:
    """Conditional survival c_k [γ] of drafts that carry no confidence of their own (n-gram drafts), learnt from
    what the target committed, so the scheduler can choose how many of them to verify like any other drafts.

    Two estimates: c_1 for a lookup's first draft (does the context repeat here at all?) and one shared by every
    later position (once it does, each copied token survives about alike). Sharing is what lets long lookups be
    learnt: a position is observed only when the round's committed tokens reach it, so per-position estimates past
    the usual verified length would stay at the prior and cut long copies short. Each keeps decayed counts (×
    `decay` per observation, so the estimate follows the text) on top of a Beta prior of mean `prior` and weight
    `weight` pseudo-observations: c = (hits + prior·weight) / (seen + weight). Observations are free: whether the
    committed tokens of a round match the drafts a lookup offered at its start tells whether those drafts would
    have survived, whatever the round verified (a point-mass draft x_k survives with probability p(x_k), and the
    committed token, given the same prefix, equals x_k with that probability). The estimate reads only finished
    rounds, so a length chosen from it never depends on the round's own outcome.
    """

    def __init__(self, prior: float = 0.5, weight: float = 2.0, decay: float = 0.95):
        if not (0 < prior < 1 and weight > 0 and 0 < decay <= 1):
            raise ValueError(f"need 0 < prior < 1, weight > 0, 0 < decay <= 1; got {prior}, {weight}, {decay}")
        self.prior, self.weight, self.decay = float(prior), float(weight), float(decay)
        self.hits, self.seen = [0.0, 0.0], [0.0, 0.0]  # [first draft, later drafts]

    def _c(self, i: int) -> float:
        return (self.hits[i] + self.prior * self.weight) / (self.seen[i] + self.weight)

    def conf(self, n: int) -> list[float]:
        """c_1..c_n [n] for a lookup of n drafts."""
        return [self._c(0)] + [self._c(1)] * (n - 1) if n > 0 else []

    def observe(self, drafts: Sequence[int], committed: Sequence[int]) -> None:
        """drafts [n] a lookup offered; committed: the tokens the round committed from the same position. Positions
        1..min(n, len(committed)) are observed up to and including the first mismatch (later ones were not reached)."""
        for k, (d, t) in enumerate(zip(drafts, committed)):
            i = min(k, 1)
            self.hits[i] = self.decay * self.hits[i] + (d == t)
            self.seen[i] = self.decay * self.seen[i] + 1.0
            if d != t:
                break
