"""Losslessness with the scheduler on, end to end through generate(): the goodness-of-fit test of
test_sampling.py with a cost curve that makes the scheduler truncate often and its DraftGate skip drafting, its negative control (the
look-ahead search of §6.4 must fail the same test), greedy token identity, and the zero-draft path."""

import pytest
import torch

from hf_dspark import DSparkDrafter
from hf_dspark.decoding.scheduler import best_prefix_length, max_verified
from tests.conftest import tiny_target
from tests.helpers import spread_confidence, synthetic_profile
from tests.sampling_check import (
    ALPHA,
    GENTLE,
    PROMPT,
    STEPS,
    N,
    exact_distribution,
    fit_pvalue,
    ngram_drafts,
    ngram_share,
    processors,
    sample_counts,
    scheduled_setup,
    setup,
)

# n-gram drafts pay from a survival of 0.1: the prior (0.5) verifies them, the tiny target's learnt survival mostly too
FLAT = [1.0, 1.1, 1.2, 1.3]
COUNTER = [1.0, 2.0, 1 / 0.45, 1 / 0.43]  # the §6.4 curve: only a look-ahead ever verifies anything


def test_sampling_exact_with_scheduler():
    model, drafter = scheduled_setup("scheduler")
    exact = exact_distribution(model, PROMPT, STEPS, processors())
    samples = sample_counts(model, drafter, PROMPT, STEPS, N, seed=123)
    lengths = drafter.last_stats.verify_lengths
    p = fit_pvalue(samples, exact)
    assert p >= ALPHA, f"scheduled speculative samples deviate from the target's law (p={p:.2e})"
    # over one generate the scheduler must both truncate and admit (the last call has only a few rounds)
    # and its DraftGate must skip drafting in some rounds (beyond the one per call the length limit can cause)
    counts, undrafted, calls = {}, 0, 30
    torch.manual_seed(0)
    for _ in range(calls):
        model.generate(PROMPT, do_sample=True, max_new_tokens=STEPS, assistant_model=drafter)
        for k, v in drafter.last_stats.verify_lengths.items():
            counts[k] = counts.get(k, 0) + v
        undrafted += sum(r.drafted == 0 for r in drafter.last_stats.rounds)
    assert counts.get(0, 0) > 0 and sum(v for k, v in counts.items() if k > 0) > 0, (counts, lengths)
    assert undrafted > calls, undrafted


def test_sampling_exact_with_scheduler_and_ngrams():
    """The scheduler, its DraftGate and n-gram drafts (1-grams allowed, so they are frequent) in one run."""
    model, drafter = scheduled_setup("scheduler", FLAT)
    exact = exact_distribution(model, PROMPT, STEPS, processors())
    with ngram_drafts(drafter, 1):
        samples = sample_counts(model, drafter, PROMPT, STEPS, N, seed=123)
        assert ngram_share(model, drafter) > 0.25
        cut, whole = ngram_cuts(model, drafter)
        assert cut > 0 and whole > 0, (cut, whole)  # the scheduler both shortens lookups and verifies them whole
    p = fit_pvalue(samples, exact)
    assert p >= ALPHA, f"scheduler + n-grams: samples deviate from the target's law (p={p:.2e})"


def ngram_cuts(model, drafter, calls=30) -> tuple[int, int]:
    """Sampled n-gram rounds over `calls` generations: (verified fewer drafts than the lookup offered, all of them)."""
    torch.manual_seed(0)
    cut = whole = 0
    for _ in range(calls):
        model.generate(PROMPT, do_sample=True, max_new_tokens=STEPS, assistant_model=drafter)
        rounds = [r for r in drafter.last_stats.rounds if r.source == "ngram"]
        cut += sum(r.verified < r.drafted for r in rounds)
        whole += sum(r.verified == r.drafted for r in rounds)
    return cut, whole


def test_sampling_exact_with_capped_drafts():
    """Static length 1 on a 3-token block: one draft per round from a 2-slot backbone (max_drafts, backbone_slots),
    so q comes from a shorter block than training used; the samples must still follow the target's law."""
    model, drafter = setup(head="markov")
    drafter.options.verify_policy = 1
    exact = exact_distribution(model, PROMPT, STEPS, processors())
    samples = sample_counts(model, drafter, PROMPT, STEPS, N, seed=123)
    assert max(r.drafted for r in drafter.last_stats.rounds) == 1
    p = fit_pvalue(samples, exact)
    assert p >= ALPHA, f"capped drafts: samples deviate from the target's law (p={p:.2e})"


N_GATE = 400


def gated_setup(policy, verify_time):
    """The §6.4 counterexample inside a real drafter: a near-uniform target and drafter (so drafts are mostly
    accepted) and a confidence c_k = 1[x_{k-1} ∈ G] (G = tokens 0..5) through W1, so c_{k+1} reveals x_k."""
    model = tiny_target(vocab=8, hidden=16, layers=3, heads=2, kv_heads=1, seed=0)
    torch.manual_seed(1)
    drafter = DSparkDrafter.from_target(model, block_size=3, target_layer_ids=[0, 1], markov_rank=4, mask_token_id=7)
    d = drafter.config.hidden_size
    with torch.no_grad():
        drafter.confidence_head.proj.weight.zero_()
        drafter.confidence_head.proj.weight[0, d] = 20.0  # reads W1[x_{k-1}][0] only
        drafter.confidence_head.proj.bias.zero_()
        drafter.markov_head.W1.weight[:, 0] = torch.tensor([1.0] * 6 + [-1.0] * 2)
    drafter.options.device_profile = synthetic_profile(model, drafter, verify_time)
    drafter.options.verify_policy = policy
    return model, drafter


@pytest.mark.parametrize(
    "name, policy, curve, lossless",
    [
        ("scheduler", "scheduler", GENTLE, True),
        ("lookahead", lambda conf: best_prefix_length(conf, COUNTER), COUNTER, False),
    ],
    ids=["scheduler", "lookahead"],
)
def test_lookahead_negative_control(name, policy, curve, lossless):
    """Keeping x_1 when c_2(x_1) is high and re-drawing it from the target otherwise favours G: the look-ahead
    search (no early stop) must fail the goodness-of-fit test that the early-stopped scheduler passes."""
    model, drafter = gated_setup(policy, curve)
    exact = exact_distribution(model, PROMPT, STEPS, processors())
    p = fit_pvalue(sample_counts(model, drafter, PROMPT, STEPS, N_GATE, seed=123), exact)
    if lossless:
        assert p >= ALPHA, f"{name}: samples deviate from the target's law (p={p:.2e})"
    else:
        assert p < ALPHA, f"the goodness-of-fit test failed to reject the look-ahead scheduler (p={p:.2e})"


@pytest.mark.parametrize("ngram", [False, True], ids=["drafter", "with-ngrams"])
@pytest.mark.parametrize("policy", ["auto", "scheduler", 0, 1, ("threshold", 0.5)])
def test_greedy_identity_with_verify_policies(policy, ngram):
    model = tiny_target()
    torch.manual_seed(1)
    drafter = DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 2], markov_rank=8)
    spread_confidence(drafter)
    drafter.options.device_profile = synthetic_profile(model, drafter, [1.0, 1.3, 1.5, 1.6, 1.7])
    drafter.options.verify_policy, drafter.options.ngram_drafts = policy, ngram
    prompt = torch.tensor([[5, 17, 3, 42, 8, 11]])
    plain = model.generate(prompt, do_sample=False, max_new_tokens=40)
    spec = model.generate(prompt, do_sample=False, max_new_tokens=40, assistant_model=drafter)
    assert spec.tolist() == plain.tolist()
    st = drafter.last_stats
    assert sum(r.committed for r in st.rounds) + 1 == st.new_tokens == 40  # zero-draft rounds commit one token
    if policy == 0:
        assert set(st.verify_lengths) == {0}
    # no more drafts are computed than the policy can ever verify (static k: k; the scheduler: max_verified)
    reach = max_verified(drafter.options.device_profile.verify_time)
    cap = {"auto": reach, "scheduler": reach, 0: 0, 1: 1}.get(policy, 4)
    assert max(r.drafted for r in st.rounds if r.source == "dspark") == cap
    # n-gram drafts: all of them up to the static k, the scheduler's bound for free drafts, else γ
    lookups = [r.drafted for r in st.rounds if r.source == "ngram"]
    assert bool(lookups) == (ngram and policy != 0)
    free = max_verified(drafter.options.device_profile.verify_time, 0.0)
    assert max(lookups, default=0) <= {"auto": free, "scheduler": free}.get(policy, cap)


def test_draft_gate_skips_an_expensive_drafter_greedy_identical(monkeypatch):
    """A drafter that costs 5 target steps: the scheduler's gate must fall back to plain steps (probing now and
    then), and the output stays identical to plain greedy decoding."""
    model = tiny_target()
    torch.manual_seed(1)
    drafter = DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 2], markov_rank=8)
    spread_confidence(drafter)
    drafter.options.device_profile = synthetic_profile(model, drafter, [1.0, 1.3, 1.5, 1.6, 1.7])
    drafter.options.device_profile.draft_time = 5.0
    drafter.options.verify_policy, drafter.options.ngram_drafts = "scheduler", False  # the drafter's gate alone first
    prompt = torch.tensor([[5, 17, 3, 42, 8, 11]])
    plain = model.generate(prompt, do_sample=False, max_new_tokens=60)
    spec = model.generate(prompt, do_sample=False, max_new_tokens=60, assistant_model=drafter)
    assert spec.tolist() == plain.tolist()
    drafted = [r.drafted > 0 for r in drafter.last_stats.rounds]
    assert drafted[0] and 2 <= sum(drafted) <= 8, drafted  # the first round, then probes 1, 2, 4, 8, 16 apart
    assert drafter.last_stats.drafted_rounds == sum(drafted) and "drafted)" in str(drafter.last_stats)

    # n-gram rounds neither pay for the drafter nor age the gate's history: only drafter rounds reach it
    from hf_dspark.decoding.scheduler import DraftGate

    calls = []  # the drafter rounds' gate (overhead: the 5 s drafter); n-gram lengths come from their own estimate
    real_record = DraftGate.record
    monkeypatch.setattr(DraftGate, "record",
                        lambda self, *a: (self.draft_time == 5.0 and calls.append(a), real_record(self, *a))[1])
    drafter.options.ngram_drafts = True
    spec = model.generate(prompt, do_sample=False, max_new_tokens=60, assistant_model=drafter)
    assert spec.tolist() == plain.tolist()
    st = drafter.last_stats
    assert st.ngram_rounds > 0 and len(calls) == sum(r.source == "dspark" for r in st.rounds)
    assert 1 <= sum(r.drafted > 0 and r.source == "dspark" for r in st.rounds) <= 8


def test_sampling_exact_with_the_default_options():
    """What a user gets without setting anything (DecodingOptions(): "auto" + n-gram drafts, the gate) follows
    the target's law; drafter rounds and n-gram rounds both carry the test."""
    from hf_dspark.decoding.options import DecodingOptions
    model, drafter = setup(head="markov")
    spread_confidence(drafter)
    drafter.options = DecodingOptions(device_profile=synthetic_profile(model, drafter, FLAT))
    assert (drafter.options.verify_policy, drafter.options.ngram_drafts) == ("auto", True)
    exact = exact_distribution(model, PROMPT, STEPS, processors())
    with ngram_drafts(drafter, 1):
        samples = sample_counts(model, drafter, PROMPT, STEPS, N, seed=123)
        assert ngram_share(model, drafter) > 0.25
    assert any(r.source == "dspark" and r.drafted for r in drafter.last_stats.rounds)
    p = fit_pvalue(samples, exact)
    assert p >= ALPHA, f"default options: samples deviate from the target's law (p={p:.2e})"


def test_wrong_ngram_drafts_stop_being_verified(monkeypatch):
    """N-gram drafts that are always wrong (each token shifted by one) cost a longer forward and commit nothing
    more: under the default options their learnt survival must fall so that the scheduler stops verifying them
    (every later lookup is still observed, for free), and the output stays plain's. Under "all" every such round
    takes them: the control."""
    from hf_dspark.decoding import candidate
    from hf_dspark.decoding.ngram import NgramIndex

    vocab = 64

    class WrongIndex(NgramIndex):
        def __init__(self, **kw):
            super().__init__(min_ngram=1)

        def draft(self, num):
            return [(t + 1) % vocab for t in super().draft(num)]

    monkeypatch.setattr(candidate, "NgramIndex", WrongIndex)
    model = tiny_target(vocab=vocab)
    torch.manual_seed(1)
    drafter = DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 2], markov_rank=8)
    drafter.options.device_profile = synthetic_profile(model, drafter, [1.0, 1.3, 1.5, 1.6, 1.7])
    drafter.options.device_profile.draft_time = 50.0  # and the drafter never pays either: plain steps are what is left
    prompt = torch.tensor([[5, 17, 3, 42, 8, 11]])
    plain = model.generate(prompt, do_sample=False, max_new_tokens=60)
    counts = {}
    for policy in ("auto", "all"):
        drafter.options.verify_policy = policy
        spec = model.generate(prompt, do_sample=False, max_new_tokens=60, assistant_model=drafter)
        assert spec.tolist() == plain.tolist()
        st = drafter.last_stats
        counts[policy] = (st.ngram_rounds, len(st.rounds))
    ngram_auto, rounds_auto = counts["auto"]
    assert 1 <= ngram_auto <= 3 and rounds_auto >= 50, counts  # the prior's first lookups, then never again
    assert counts["all"][0] >= 20, counts  # without the gate the wrong lookups keep coming


@pytest.mark.parametrize("do_sample", [False, True])
def test_ngram_lengths_follow_the_profile(do_sample):
    """Under the scheduler an n-gram round verifies what its learnt survival pays for on the profile: on a flat
    curve the whole lookup, on a steep one (bf16 on a CPU without native bf16) fewer. Repetitive text (a prompt
    that repeats, 1-grams allowed) makes lookups frequent; greedy output stays plain's, token for token."""
    model, drafter = setup(head="markov", block=4)
    prompt = torch.tensor([[1, 5, 2, 3, 6] * 4])
    plain = model.generate(prompt, do_sample=False, max_new_tokens=40)
    lengths = {}
    for name, curve in {"flat": [1.0, 1.01, 1.02, 1.03, 1.04], "steep": [1.0, 1.3, 1.6, 1.9, 2.2]}.items():
        drafter.options.device_profile, drafter.options.verify_policy = synthetic_profile(model, drafter, curve), "auto"
        with ngram_drafts(drafter, 1):
            torch.manual_seed(0)
            out = model.generate(prompt, do_sample=do_sample, max_new_tokens=40, assistant_model=drafter)
        if not do_sample:
            assert out.tolist() == plain.tolist(), name
        rounds = [r for r in drafter.last_stats.rounds if r.source == "ngram"]
        assert rounds, name
        lengths[name] = sum(r.verified for r in rounds) / sum(r.drafted for r in rounds)
    assert lengths["flat"] > lengths["steep"], lengths


def test_ngram_drafts_come_back_when_lookups_start_to_match(monkeypatch):
    """Lookups that are wrong for the first rounds, then right (an oracle: plain generate's own continuation):
    verifying stops while they are wrong, and because every round's committed tokens are observed (verified or
    not), the estimate recovers and n-gram rounds return. Were only verified lookups observed, the estimate would
    stay low and none would come back."""
    from hf_dspark.decoding import candidate
    from hf_dspark.decoding.ngram import NgramIndex

    vocab, wrong_rounds = 64, 20
    model = tiny_target(vocab=vocab)
    prompt = torch.tensor([[5, 17, 3, 42, 8, 11]])
    plain = model.generate(prompt, do_sample=False, max_new_tokens=80)
    calls = []

    class LateIndex(NgramIndex):
        def draft(self, num):
            calls.append(1)
            right = plain[0, len(self.seq):len(self.seq) + num].tolist()
            return [(t + 1) % vocab for t in right] if len(calls) <= wrong_rounds else right

    monkeypatch.setattr(candidate, "NgramIndex", LateIndex)
    torch.manual_seed(1)
    drafter = DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 2], markov_rank=8)
    drafter.options.device_profile = synthetic_profile(model, drafter, [1.0, 1.3, 1.5, 1.6, 1.7])  # pays from c_1 > 0.3
    drafter.options.device_profile.draft_time = 50.0  # the drafter never pays: rounds are n-gram rounds or plain steps
    spec = model.generate(prompt, do_sample=False, max_new_tokens=80, assistant_model=drafter)
    assert spec.tolist() == plain.tolist()
    kinds = [r.source == "ngram" for r in drafter.last_stats.rounds]
    early, late = kinds[:wrong_rounds], kinds[wrong_rounds:]
    assert 1 <= sum(early) <= 3, kinds  # the prior's first lookups, then no more while they are wrong
    assert sum(late) >= 5, kinds  # ... and n-gram rounds again once they match


def calibrated_per_temperature(drafter, greedy_scale: float, t1_scale: float):
    """Entries at T = 0 and T = 1 whose scalings differ by far (T = 1's with biases), so the scheduler's lengths
    depend on which one a call uses."""
    g = drafter.config.block_size
    drafter.config.calibration = [
        {"temperature": 0.0, "confidence_temperatures": [greedy_scale] * g, "prefix_survival": [0.5] * g},
        {"temperature": 1.0, "confidence_temperatures": [t1_scale] * g, "confidence_biases": [0.5, -0.5, 1.0][:g],
         "prefix_survival": [0.3] * g}]


def test_greedy_identity_with_per_temperature_calibration():
    """Greedy calls scale confidences with the greedy entry, not the T = 1 one, and stay identical."""
    first = {}
    for greedy_scale in (0.1, 10.0):
        model, drafter = scheduled_setup("scheduler")
        calibrated_per_temperature(drafter, greedy_scale, t1_scale=1.0)
        plain = model.generate(PROMPT, do_sample=False, max_new_tokens=40)
        spec = model.generate(PROMPT, do_sample=False, max_new_tokens=40, assistant_model=drafter)
        assert spec.tolist() == plain.tolist()
        first[greedy_scale] = next(r.confidence for r in drafter.last_stats.rounds if r.drafted)
    # the same first round (same context and drafts), scaled by 1/0.1 and by 1/10: far from 0.5, and close to it
    sharp, flat = (torch.tensor(first[k]) for k in (0.1, 10.0))
    assert len(sharp) == len(flat) > 0 and (sharp - 0.5).abs().min() > (flat - 0.5).abs().max(), first


def test_sampling_exact_with_per_temperature_calibration():
    """T = 1 calls scale with the T = 1 entry (sharp: long prefixes and short ones) and start the gate from its
    survival; the samples must follow the target's law."""
    model, drafter = scheduled_setup("scheduler")
    calibrated_per_temperature(drafter, greedy_scale=10.0, t1_scale=0.2)
    exact = exact_distribution(model, PROMPT, STEPS, processors())
    samples = sample_counts(model, drafter, PROMPT, STEPS, N, seed=321)
    p = fit_pvalue(samples, exact)
    assert p >= ALPHA, f"per-temperature calibration: samples deviate from the target's law (p={p:.2e})"


def test_sampling_exact_with_a_gate_that_starts_closed():
    """A calibration prior that does not pay: every call starts with plain steps and probes from round 9; the
    samples must still follow the target's law, and some calls must both skip and draft."""
    model, drafter = scheduled_setup("scheduler", [1.0, 1.6, 1.9, 2.1])
    drafter.options.device_profile.draft_time = 0.5  # a drafted round costs more than a plain step even verifying nothing
    drafter.config.calibration = [{"temperature": 1.0, "confidence_temperatures": [1.0] * 3,
                                   "prefix_survival": [0.05, 0.01, 0.0]}]
    exact = exact_distribution(model, PROMPT, STEPS, processors())
    samples = sample_counts(model, drafter, PROMPT, STEPS, N, seed=123)
    p = fit_pvalue(samples, exact)
    assert p >= ALPHA, f"gate with a prior: samples deviate from the target's law (p={p:.2e})"
    torch.manual_seed(0)
    model.generate(PROMPT, do_sample=True, max_new_tokens=40, assistant_model=drafter)
    drafted = [r.drafted > 0 for r in drafter.last_stats.rounds if r.source == "dspark"]
    assert not any(drafted[:8]) and any(drafted), drafted


def test_greedy_calls_carry_the_gate_and_sampled_calls_stay_reproducible():
    """A drafter that never pays: the first greedy call drafts until the gate closes; the next greedy call starts
    with the gate where the first left it (fewer drafted rounds), output unchanged. Sampled calls start afresh,
    so a seed gives the same output on every call."""
    from tests.sampling_check import PROMPT as P

    model, drafter = scheduled_setup("auto", [1.0, 1.3, 1.5, 1.6])
    drafter.options.ngram_drafts = False
    drafter.options.device_profile.draft_time = 0.5  # each drafted round costs half a step: random drafts never pay
    plain = model.generate(P, do_sample=False, max_new_tokens=40)
    drafted = []
    for _ in range(3):
        out = model.generate(P, do_sample=False, max_new_tokens=40, assistant_model=drafter)
        assert out.tolist() == plain.tolist()
        drafted.append(drafter.last_stats.drafted_rounds)
        first = next(r for r in drafter.last_stats.rounds if r.source == "dspark")
        assert first.drafted > 0  # a closed shared gate probes at the call's start: this prompt may pay
    assert drafted[1] < drafted[0] and drafted[2] <= drafted[1], drafted
    sampled = []
    for _ in range(2):
        torch.manual_seed(5)
        sampled.append(model.generate(P, do_sample=True, max_new_tokens=40, assistant_model=drafter).tolist())
        sampled_rounds = drafter.last_stats.drafted_rounds
    assert sampled[0] == sampled[1] and sampled_rounds > drafted[2]
