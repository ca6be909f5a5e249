"""Scheduler unit tests on synthetic confidences and cost tables (no models), plus an exact enumeration of one
speculative round showing the early-stopped scheduler is lossless and the look-ahead search is not (§6.4)."""

import itertools
import random

import pytest
import torch

from hf_dspark.scheduler import (
    _lookahead_length,
    greedy_admission,
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
    assert _lookahead_length(torch.tensor([0.8, 0.9]), step) == 2
    assert _lookahead_length(torch.tensor([0.8, 0.0]), step) == 0


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
            lambda c: _lookahead_length(c, COUNTER_STEPS), seed))))
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
    assert p_first_is_a(lambda c: _lookahead_length(c, step)) == pytest.approx(0.85)
