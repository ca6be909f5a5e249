"""Scheduler unit tests on synthetic confidences and cost tables (no models), plus an exact enumeration of one
speculative round showing the early-stopped scheduler is lossless and the look-ahead search is not (§6.4)."""

import itertools
import random

import pytest
import torch

from hf_dspark.decoding.scheduler import (
    DraftGate,
    best_prefix_length,
    best_prefix_reach,
    conditional_survival,
    greedy_admission,
    max_verified,
    monotone_envelope,
    pad_length,
    single_stream_length,
    static_threshold_length,
    steps_per_second,
    survival,
)

torch.set_num_threads(1)

# fp32 SmolLM2 step times on this CPU (transformers-integration.md §7a, run 2), ms for 1..8 tokens
CPU_FP32 = [57.3, 93.6, 114.5, 87.7, 76.7, 84.5, 104.8, 80.5]


def theta(conf, step_time, length, overhead=0.0):
    """Expected tokens per second of verifying `length` drafts with the true (not enveloped) cost."""
    a = survival(torch.as_tensor(conf)).tolist()
    return (1 + sum(a[:length])) / (overhead + step_time[length])


# ---- Algorithm 1 -------------------------------------------------------------------------------------------
def test_counterexample_numbers_stop_at_zero():
    sps = [1.0, 0.5, 0.45]  # §6.4: Θ_0 = 1.0, Θ_1 = 1.8 · 0.5 = 0.9 < Θ_0 → stop, whatever x_1 was
    assert greedy_admission(torch.tensor([[0.8, 0.9]]), sps) == [0]
    assert greedy_admission(torch.tensor([[0.8, 0.0]]), sps) == [0]
    step = [1 / s for s in sps]
    assert single_stream_length(torch.tensor([0.8, 0.9]), step) == 0
    # the wrong search looks at Θ_2 = 2.52 · 0.45 = 1.134 (c_2 = 0.9) or 0.81 (c_2 = 0): its answer depends on x_1
    assert best_prefix_length(torch.tensor([0.8, 0.9]), step) == 2
    assert best_prefix_length(torch.tensor([0.8, 0.0]), step) == 0


def test_hand_computed_single_stream_stop():
    # a = .9, .72, .36; Θ = 1/1, 1.9/1.2 = 1.583, 2.62/1.5 = 1.747, 2.98/2.0 = 1.49 → ℓ = 2
    assert single_stream_length(torch.tensor([0.9, 0.8, 0.5]), [1.0, 1.2, 1.5, 2.0]) == 2
    # a fixed per-round drafting cost makes extra tokens relatively cheaper: Θ_3 = 2.98/5 > Θ_2 = 2.62/4.5
    assert single_stream_length(torch.tensor([0.9, 0.8, 0.5]), [1.0, 1.2, 1.5, 2.0], draft_time=3.0) == 3


def test_hand_computed_batch_stop():
    # a: r0 .9 .81, r1 .5 .25; walk B=3: 2.9·.9 = 2.61, B=4: 3.71·.8 = 2.968, B=5: 4.21·.7 = 2.947 → stop
    conf = torch.tensor([[0.9, 0.9], [0.5, 0.5]])
    assert greedy_admission(conf, [9.9, 1.0, 0.9, 0.8, 0.7, 0.6]) == [2, 0]


@pytest.mark.parametrize("seed", range(20))
def test_admitted_sets_are_prefixes_in_survival_order(seed):
    g = torch.Generator().manual_seed(seed)
    R, gamma = 3, 5
    conf = torch.rand(R, gamma, generator=g)
    conf[torch.rand(R, gamma, generator=g) < 0.3] = 1.0  # exact ties in a: the position tie-break must hold
    sps = sorted((torch.rand(R * (gamma + 1), generator=g) + 0.1).tolist(), reverse=True)
    lengths = greedy_admission(conf, sps)
    a = survival(conf)
    admitted = [float(a[r, j]) for r in range(R) for j in range(lengths[r])]
    rejected = [float(a[r, j]) for r in range(R) for j in range(lengths[r], gamma)]
    if admitted and rejected:
        assert min(admitted) >= max(rejected)  # greedy by survival, each request a prefix
    # the chosen point is a local maximum of Θ along the walk
    B, tau = R + sum(lengths), R + sum(admitted)
    assert tau * sps[B - 1] >= R * sps[R - 1]


def test_flat_cost_verifies_everything_with_positive_survival():
    flat = [1.0] * 8
    assert single_stream_length(torch.full((7,), 0.05), flat) == 7
    assert single_stream_length(torch.tensor([0.9, 0.9, 0.0, 0.9, 0.9, 0.9, 0.9]), flat) == 2
    assert greedy_admission(torch.full((2, 3), 0.3), [1.0] * 8) == [3, 3]


def test_steep_cost_verifies_less():
    conf = torch.full((7,), 0.7)
    gentle = [1.0 + 0.05 * k for k in range(8)]
    steep = [1.0 + 0.6 * k for k in range(8)]
    assert single_stream_length(conf, gentle) > single_stream_length(conf, steep)


def test_zero_drafts_allowed():
    assert single_stream_length(torch.full((7,), 0.1), [1.0 + k for k in range(8)]) == 0
    assert greedy_admission(torch.full((4, 7), 0.1), [1.0 / (1 + k) for k in range(32)]) == [0, 0, 0, 0]
    assert single_stream_length(torch.zeros(0), [1.0]) == 0  # nothing drafted (length limit)
    assert static_threshold_length(torch.tensor([0.2, 0.9]), 0.5) == 0


def test_static_threshold_uses_conditional_confidence():
    assert static_threshold_length(torch.tensor([0.9, 0.8, 0.4, 0.9]), 0.5) == 2
    assert static_threshold_length(torch.tensor([0.9, 0.8, 0.6, 0.6]), 0.5) == 4  # a_4 = .26, c_k never < .5


# ---- the monotone envelope -----------------------------------------------------------------------------------
def test_envelope_and_padding():
    env = monotone_envelope(CPU_FP32)
    assert env == [57.3, 76.7, 76.7, 76.7, 76.7, 80.5, 80.5, 80.5]
    assert all(x <= y for x, y in zip(env, env[1:]))
    assert [pad_length(k, CPU_FP32) for k in range(8)] == [0, 4, 4, 4, 4, 7, 7, 7]


def test_non_monotone_curve_is_not_a_trap():
    conf = torch.full((7,), 0.6)
    # on the raw curve the walk stops at once: Θ_1 = 1.6/93.6 < Θ_0 = 1/57.3
    assert greedy_admission(conf[None], steps_per_second(CPU_FP32)) == [0]
    # on the envelope, 1..4 drafts cost 76.7 ms (5 tokens): a = .6 .36 .216 .13 → ℓ = 4; a_5 = .078 < break-even
    assert single_stream_length(conf, CPU_FP32) == 4


@pytest.mark.parametrize("seed", range(30))
def test_envelope_never_loses_to_the_raw_walk(seed):
    rng = random.Random(seed)
    step = [rng.uniform(0.5, 2.0) for _ in range(8)]
    conf = torch.tensor([rng.uniform(0.2, 1.0) for _ in range(7)])
    raw = greedy_admission(conf[None], steps_per_second(step))[0]
    assert theta(conf, step, single_stream_length(conf, step)) >= theta(conf, step, raw) - 1e-12


# ---- drafting only what can be verified ------------------------------------------------------------------------
SMOLLM2_2T = [48.5, 55.8, 59.8, 96.0, 97.4, 94.8, 114.3, 114.9]  # `hf-dspark profile --threads 2`, research/record/benchmarks.md


def test_max_verified_on_the_measured_cpu_curve():
    # ℓ = 3 would need a_3/τ_2 > (94.8 − 59.8)/(23 + 59.8) = 0.42 > 1/3: never, whatever the confidences
    assert max_verified(SMOLLM2_2T, 23.0) == 2
    assert single_stream_length(torch.ones(7), SMOLLM2_2T, 23.0) == 2
    assert max_verified([1.0] * 8) == 7  # free verification: everything can be worth verifying
    assert max_verified(CPU_FP32) == 7  # ℓ = 1 pads to the 5-token forward, ℓ = 5 to the 8-token one


@pytest.mark.parametrize("seed", range(200))
def test_max_verified_bounds_the_scheduler_and_truncation_changes_nothing(seed):
    rng = random.Random(seed)
    gamma = rng.randint(1, 8)
    if seed % 2:  # rising curves with jumps, like CPU GEMMs
        step = list(itertools.accumulate(rng.choice([0.02, 0.1, 0.6, 1.5]) for _ in range(gamma + 1)))
    else:  # arbitrary non-monotone curves
        step = [rng.uniform(0.5, 3.0) for _ in range(gamma + 1)]
    overhead = rng.choice([0.0, 0.1, 1.0])
    bound = max_verified(step, overhead)
    for _ in range(20):
        conf = torch.tensor([rng.choice([1.0, rng.random(), rng.uniform(0.9, 1.0)]) for _ in range(gamma)])
        full = single_stream_length(conf, step, overhead)
        assert full <= bound
        assert single_stream_length(conf[:bound], step[: bound + 1], overhead) == full


def _run_gate(gate, accepted_if_drafted, rounds, verified=2):
    """Drive a gate for `rounds` rounds; → the list of rounds (0-based) in which it drafted."""
    drafted = []
    for r in range(rounds):
        if gate.should_draft():
            drafted.append(r)
            gate.record(True, verified, accepted_if_drafted(r))
        else:
            gate.record(False)
    return drafted


def test_gate_keeps_drafting_while_drafts_pay():
    gate = DraftGate(SMOLLM2_2T, 23.0)  # 2 drafts verified: 82.8 ms per round, so it needs A > 0.71
    assert _run_gate(gate, lambda r: 2, 50) == list(range(50))


def test_gate_backs_off_when_drafts_do_not_pay_and_probes():
    # a failed probe loses 23 + 59.8 - 48.5 = 34.3 ms; at a 10 % budget the wait stops doubling at 8 (34.3 < 38.8)
    gate = DraftGate(SMOLLM2_2T, 23.0, budget=0.1)
    drafted = _run_gate(gate, lambda r: 0, 60)
    # round 0 drafts (no history), then waits 1, 2, 4, 8, 8, ... skipped rounds between probes
    assert drafted == [0, 2, 5, 10, 19, 28, 37, 46, 55]


def test_gate_probing_costs_at_most_its_budget():
    gate = DraftGate(SMOLLM2_2T, 23.0)  # default budget 1 % of a plain step
    rounds = 3000
    drafted = _run_gate(gate, lambda r: 0, rounds)
    waits = [b - a - 1 for a, b in zip(drafted, drafted[1:])]
    # doubling stops at the first wait where 34.3 ms per probe is ≤ 1 % of the plain steps waited: 128 (64 is 1.1 %)
    assert waits[:8] == [1, 2, 4, 8, 16, 32, 64, 128] and set(waits[8:]) == {128}
    lost = (23.0 + 59.8 - 48.5) * len(drafted)
    assert lost / (rounds * 48.5) < 0.01  # the whole run, ramp included, is within 1 % of plain decoding


def test_gate_budget_must_be_a_fraction():
    for bad in (0.0, 1.0, -0.5):
        with pytest.raises(ValueError, match="budget"):
            DraftGate(SMOLLM2_2T, 23.0, budget=bad)


def test_gate_resumes_when_a_probe_pays():
    """A drafter that starts paying (6 of 6 accepted from round 30) drafts every round again from the second probe
    after the change: one probe counts ¼ (A 0 → 1.5, below the 1.83 this curve needs), the next makes it pay."""
    gate = DraftGate(SMOLLM2_2T, 23.0)
    drafted = _run_gate(gate, lambda r: 0 if r < 30 else 6, 100, verified=6)
    first, second = [r for r in drafted if r >= 30][:2]
    assert all(r in drafted for r in range(second, 100)) and first - 30 <= 16 and second - 30 <= 40, drafted


def test_gate_zero_verified_rounds_count_as_cost():
    gate = DraftGate(SMOLLM2_2T, 23.0)
    gate.record(True, 0, 0)  # drafted, verified nothing: paid 23 + 48.5 for one token
    assert not gate.profitable()


# ---- exact losslessness of one round ---------------------------------------------------------------------------
def _dist(rng, V):
    w = [rng.random() ** 3 for _ in range(V)]  # peaky, so acceptance varies a lot with the drafted token
    return [x / sum(w) for x in w]


def exact_first_two_tokens(policy, seed, V=3, gamma=3):
    """Exact distribution of the first two committed tokens of one speculative round (chain rejection sampling,
    §6.2), when the verified length is policy(conf); conf_k depends on the drafts before k only, as the
    confidence head does. Rounds after the first are assumed exact, so a committed token not from this round's
    accepted drafts is followed by a draw from the target. Returns (got, want) dicts over (t1, t2)."""
    rng = random.Random(seed)
    memo = {}

    def table(kind, prefix):
        key = (kind, prefix)
        if key not in memo:
            memo[key] = _dist(rng, V) if kind != "c" else rng.choice([0.05, 0.3, 0.6, 0.95])
        return memo[key]

    p = lambda prefix: table("p", prefix)  # noqa: E731  target
    q = lambda prefix: table("q", prefix)  # noqa: E731  drafter
    want = {(a, b): p(())[a] * p((a,))[b] for a in range(V) for b in range(V)}
    got = dict.fromkeys(want, 0.0)

    def residual(prefix):
        r = [max(0.0, pt - qt) for pt, qt in zip(p(prefix), q(prefix))]
        return [x / sum(r) for x in r] if sum(r) > 1e-12 else p(prefix)

    def add_from(prefix, dist, weight):  # commit t ~ dist after `prefix`, then complete to two tokens
        for t in range(V):
            seq = prefix + (t,)
            if len(seq) == 2:
                got[seq] += weight * dist[t]
            else:
                add_from(seq, p(seq), weight * dist[t])

    for drafts in itertools.product(range(V), repeat=gamma):
        w = 1.0
        for k in range(gamma):
            w *= q(drafts[:k])[drafts[k]]
        conf = torch.tensor([table("c", drafts[:k]) for k in range(gamma)])
        length = policy(conf)
        prefix = ()
        for k in range(min(length, 2)):  # only the first two positions matter for (t1, t2)
            x = drafts[k]
            alpha = min(1.0, p(prefix)[x] / q(prefix)[x])
            add_from(prefix, residual(prefix), w * (1 - alpha))
            w, prefix = w * alpha, prefix + (x,)
        if len(prefix) < 2:
            add_from(prefix, p(prefix), w)  # the bonus token (or ℓ = 0: a plain target step)
        else:
            got[prefix] += w
    return got, want


COUNTER_STEPS = [1.0, 2.0, 1 / 0.45, 1 / 0.43]  # the §6.4 curve, one more point


@pytest.mark.parametrize(
    "policy",
    [
        lambda c: single_stream_length(c, COUNTER_STEPS),
        lambda c: single_stream_length(c, [1.0, 1.1, 1.3, 1.35]),
        lambda c: single_stream_length(c, CPU_FP32[:4]),
        lambda c: static_threshold_length(c, 0.5),
        lambda c: 2,
    ],
    ids=["scheduler-counterexample-curve", "scheduler-gentle", "scheduler-cpu-fp32", "threshold", "static-2"],
)
def test_scheduler_is_exactly_lossless(policy):
    for seed in range(5):
        got, want = exact_first_two_tokens(policy, seed)
        assert max(abs(got[k] - want[k]) for k in want) < 1e-12


def test_lookahead_scheduler_is_biased():
    """Negative control: the same enumeration catches the search without early stop."""
    worst = max(
        max(abs(g - w) for g, w in zip(*(d.values() for d in exact_first_two_tokens(
            lambda c: best_prefix_length(c, COUNTER_STEPS), seed))))
        for seed in range(5)
    )
    assert worst > 1e-2


def test_counterexample_distribution():
    """§6.4 verbatim: p_t = (.7, .3), p_d = (.5, .5); x_1 = A → c_2 = .9, x_1 = B → c_2 = 0. P(A) is .85, not .7."""
    p, q = [0.7, 0.3], [0.5, 0.5]
    step = [1.0, 2.0, 1 / 0.45]

    def p_first_is_a(policy):
        total = 0.0
        for x1, c2 in ((0, 0.9), (1, 0.0)):
            length = policy(torch.tensor([0.8, c2]))
            if length == 0:
                total += q[x1] * p[0]
            else:  # accept x1 w.p. min(1, p/q); the residual (p - q)+ = (.2, 0) is all on A
                alpha = min(1.0, p[x1] / q[x1])
                total += q[x1] * (alpha * (x1 == 0) + (1 - alpha))
        return total

    assert p_first_is_a(lambda c: single_stream_length(c, step)) == pytest.approx(0.7)
    assert p_first_is_a(lambda c: best_prefix_length(c, step)) == pytest.approx(0.85)


def test_survival_estimate_learns_from_committed_tokens():
    """c_1 (a lookup's first draft) and c for every later draft (one shared estimate) start at the prior, rise
    where lookups match what was committed, fall where they do not; nothing after the first mismatch is observed
    (it was never reached)."""
    from hf_dspark.decoding.scheduler import SurvivalEstimate

    est = SurvivalEstimate(prior=0.5, weight=2.0, decay=1.0)
    assert est.conf(3) == [0.5, 0.5, 0.5] and est.conf(1) == [0.5] and est.conf(0) == []
    est.observe([1, 2, 3], [1, 2, 9])  # 1 and 2 survive, 3 does not: later drafts 1 hit of 2
    assert est.conf(3) == [2 / 3, 2 / 4, 2 / 4]
    est.observe([4, 5, 6], [7])  # mismatch at 1: nothing later is observed
    assert est.conf(2) == [2 / 4, 2 / 4]
    est.observe([4, 5, 6, 7], [4, 5, 6])  # only what was committed is observed: 1 hit, then 2 later hits
    assert est.conf(5) == [3 / 5] + [4 / 6] * 4
    decayed = SurvivalEstimate(decay=0.5)
    for _ in range(20):
        decayed.observe([1], [2])
    decayed.observe([1], [1])
    assert decayed.conf(1)[0] > 0.3  # the latest observation weighs as much as all older ones together
    with pytest.raises(ValueError):
        SurvivalEstimate(prior=1.0)


def test_best_prefix_length_looks_past_a_dip():
    """Fixed survival (n-gram lookups): a 2-token forward that costs 1.7 steps but a 5-token one barely more (a
    small-batch matmul dip, as measured on a Zen 3 in float32) must not stop the walk at 0 drafts, as Algorithm 1's
    early stop would; and where no length pays, 0."""
    dip = [1.0, 1.7, 2.0, 1.8, 1.72, 1.8, 2.1, 1.95]
    conf = [0.6] + [0.85] * 6
    assert single_stream_length(torch.tensor(conf), dip) == 0  # the early stop: 1.6 tokens for 1.7 steps
    assert best_prefix_length(conf, dip) == 7  # Θ(7) = 3.72 tokens / 1.95 steps beats every shorter prefix
    assert best_prefix_length([0.05] * 7, dip) == 0
    assert best_prefix_length([0.6], dip) == 0 and best_prefix_length([], dip) == 0


@pytest.mark.parametrize("seed", range(200))
def test_best_prefix_reach_bounds_every_survival_and_truncation_changes_nothing(seed):
    """No survival makes `best_prefix_length` verify more than `best_prefix_reach` (its choice at c ≡ 1), and a
    lookup cut to that reach gets the same length: so n-gram lookups are computed no longer than the reach."""
    rng = random.Random(seed)
    gamma = rng.randint(1, 8)
    if seed % 2:
        step = list(itertools.accumulate(rng.choice([0.02, 0.1, 0.6, 1.5]) for _ in range(gamma + 1)))
    else:
        step = [rng.uniform(0.5, 3.0) for _ in range(gamma + 1)]
    overhead = rng.choice([0.0, 0.1, 1.0])
    reach = best_prefix_reach(step, overhead)
    for _ in range(20):
        conf = [rng.choice([1.0, rng.random(), rng.uniform(0.9, 1.0)]) for _ in range(gamma)]
        full = best_prefix_length(conf, step, overhead)
        assert full <= reach
        assert best_prefix_length(conf[:reach], step[: reach + 1], overhead) == full


def test_best_prefix_reach_passes_the_walks_on_a_steep_curve():
    """bf16 on a Zen 3 (no native bf16): the early-stopping walk never passes 3 drafts, but a lookup whose drafts
    survive at 0.95 pays its whole 7-token forward, so n-gram lookups are not cut at the walk's reach."""
    zen3_bf16 = [57.3, 80.9, 98.5, 108.6, 138.0, 151.8, 172.0, 185.6]  # ms, 2 threads, profile of 2026-12-02
    assert max_verified(zen3_bf16, 0.4) == 3
    assert best_prefix_reach(zen3_bf16, 0.4) == 7
    assert best_prefix_length([0.95] * 7, zen3_bf16, 0.4) == 7
    assert best_prefix_length([0.8] * 7, zen3_bf16, 0.4) == 3


def _coin_flip_calls(p: float, calls: int = 300, rounds: int = 100, seed: int = 0,
                     prior: tuple[float, int] | None = None) -> tuple[float, float]:
    """One verified draft per drafted round, surviving with probability p (temperature 1), on the Zen 3's bf16 curve
    (a drafted round costs 24.6 + 70.3 ms, a plain step 54.65: break-even at 0.74 accepted). A fresh gate per
    100-round call, as each generate() starts one. → (drafted rounds per call, time lost as a fraction of plain)."""
    rng = random.Random(seed)
    step, draft = [54.65, 70.3, 90.8], 24.6
    drafted = lost = 0.0
    for _ in range(calls):
        gate = DraftGate(step, draft, prior=prior)
        for _ in range(rounds):
            if gate.should_draft():
                accepted = int(rng.random() < p)
                drafted += 1
                lost += draft + step[1] - (1 + accepted) * step[0]
                gate.record(True, 1, accepted)
            else:
                gate.record(False)
    return drafted / calls, lost / (calls * rounds * step[0])


def test_gate_is_not_reopened_by_lucky_coin_flips():
    """Below break-even (0.49 accepted where 0.74 pays) a lucky probe must not reopen the gate: with skipped rounds
    ageing the history a probe counted alone, and a third of the rounds drafted (8.9 % slower than plain). Above it
    (0.9) the gate stays open."""
    drafted, lost = _coin_flip_calls(0.49)
    assert drafted < 15 and lost < 0.035, (drafted, lost)
    drafted, lost = _coin_flip_calls(0.9)
    assert drafted > 75 and lost < -0.1, (drafted, lost)


def test_a_calibrated_prior_skips_most_of_each_calls_ramp():
    """The drafter's calibration said 0.49 accepted drafts a round at this temperature (below the 0.74 this curve
    needs): the gate starts closed, its wait where three failed probes leave it, and each call loses ~1 % where it
    lost 2.8 %. The same prior on a prompt where drafts do pay (0.9) still reopens the gate and gains, less than
    without the prior (it reopens later); a prior that pays leaves the gate open from the first round."""
    drafted, lost = _coin_flip_calls(0.49, prior=(0.49, 1))
    _, lost_without = _coin_flip_calls(0.49)
    assert lost < 0.0125 and lost_without - lost > 0.015, (lost, lost_without)
    drafted, lost = _coin_flip_calls(0.9, prior=(0.49, 1))
    assert drafted > 25 and lost < -0.04, (drafted, lost)
    gate = DraftGate([54.65, 70.3, 90.8], 24.6, prior=(0.49, 1))
    assert gate.cost == pytest.approx(24.6 + 70.3)  # priced like a drafted round that verified one draft
    assert not gate.should_draft() and gate.wait == 8
    gate = DraftGate([54.65, 70.3, 90.8], 24.6, prior=(0.9, 1))
    assert _run_gate(gate, lambda r: 1, 20, verified=1) == list(range(20))


def test_gate_prior_must_be_accepted_and_verified_counts():
    for bad in ((-0.1, 1), (0.5, 1.0), (0.5, -1), (2.0, 1), (float("nan"), 1)):
        with pytest.raises(ValueError, match="prior"):
            DraftGate(SMOLLM2_2T, 23.0, prior=bad)


def test_conditional_survival_inverts_survival():
    conf = torch.tensor([[0.9, 0.5, 0.25, 1.0], [0.3, 0.0, 0.7, 0.2]])
    back = conditional_survival(survival(conf))
    assert torch.allclose(back[0], conf[0].double())
    assert back[1].tolist() == pytest.approx([0.3, 0.0, 0.0, 0.0])  # nothing survives past a dead prefix
