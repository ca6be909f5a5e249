"""DSparkCandidateGenerator (decoding/candidate.py): greedy token identity with plain `generate` (fp32) for every
head and block edge, EOS inside a draft, logits processors, the drafter's context staying in step with the
target, drafts computed only as far as the policy can verify, n-gram rounds. Stop strings, stopping criteria and
streaming (routing's StopScanner) are in test_routing.py; what reaches the generator, in test_routing.py too."""

import pytest
import torch

from hf_dspark import DSparkDrafter
from hf_dspark.decoding.candidate import DSparkCandidateGenerator
from hf_dspark.decoding.options import DecodingOptions
from hf_dspark.decoding.profile import DeviceProfile, profile_key
from tests.conftest import tiny_target
from tests.helpers import BLOCK, PROMPT, assert_identical, drafter_for, oracle_drafts


def with_default_options(model, drafter):
    """The library's default options (DecodingOptions()) on a profile where drafting can pay (a gentle cost curve,
    no fixed cost), so the default's drafter rounds, n-gram rounds and gate all run."""
    profile = DeviceProfile(key=profile_key(model, drafter), verify_time=[1.0, 1.1, 1.2, 1.3, 1.4][: BLOCK + 1],
                            draft_time=0.0, rollback_time=0.0, cache_len=0, warmup=0, repeats=0)
    drafter.options = DecodingOptions(device_profile=profile)
    return drafter


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("head", ["markov", "rnn", "none"])
@pytest.mark.parametrize("max_new", [1, 2, BLOCK - 1, BLOCK, BLOCK + 1, 40])
@pytest.mark.parametrize("options", ["all", "default"])
def test_greedy_identity(family, head, max_new, options):
    model = tiny_target(family)
    drafter = drafter_for(model, head)
    if options == "default":
        with_default_options(model, drafter)
    assert_identical(model, drafter, max_new_tokens=max_new)
    if max_new > 2:
        hist = drafter.last_stats.acceptance_histogram
        assert sum(hist.values()) == len(drafter.last_stats.rounds)


def test_oracle_exercises_every_acceptance_length():
    model = tiny_target()
    drafter = drafter_for(model)
    assert_identical(model, drafter, max_new_tokens=120)
    st = drafter.last_stats
    assert set(st.acceptance_histogram) == set(range(BLOCK + 1))
    assert st.tau > 1.5
    assert sum(r.committed for r in st.rounds) + 1 == st.new_tokens == 120


def test_random_drafter_identity_without_oracle(llama):
    assert_identical(llama, drafter_for(llama), oracle=False, max_new_tokens=30)


@pytest.mark.parametrize("ngram", [False, True], ids=["drafter", "with-ngrams"])
def test_eos_inside_a_draft(ngram):
    free = tiny_target().generate(PROMPT, do_sample=False, max_new_tokens=40)
    eos = int(free[0, PROMPT.shape[1] + 9])  # a token plain decoding emits 10 tokens in
    model = tiny_target(eos=eos)
    drafter = drafter_for(model)
    drafter.options.ngram_drafts = ngram
    out = assert_identical(model, drafter, max_new_tokens=40)
    assert out.shape[1] < free.shape[1] and out[0, -1] == eos


@pytest.mark.parametrize("eos_list", [False, True], ids=["eos", "eos-list"])
@pytest.mark.parametrize("ngram", [False, True], ids=["drafter", "with-ngrams"])
def test_no_draft_after_a_drafted_stop_token_is_verified(eos_list, ngram):
    """Drafts after a drafted EOS (any of the call's EOS ids) can never be committed: the block is cut there before
    the policy chooses ℓ; output stays plain's."""
    free = tiny_target().generate(PROMPT, do_sample=False, max_new_tokens=40)
    eos = int(free[0, PROMPT.shape[1] + 20])
    model = tiny_target(eos=[63, eos] if eos_list else eos)
    drafter = drafter_for(model)
    drafter.options.ngram_drafts = ngram
    real = DSparkDrafter.draft

    def eos_second(self, *a, **k):  # every block drafts EOS at position 2, then more tokens
        block = real(self, *a, **k)
        if len(block.tokens) > 2:
            block.tokens[1] = eos
        return block

    DSparkDrafter.draft = eos_second
    try:
        assert_identical(model, drafter, oracle=False, max_new_tokens=40)
    finally:
        DSparkDrafter.draft = real
    drafted = [r for r in drafter.last_stats.rounds if r.source == "dspark" and r.drafted > 2]
    assert drafted and all(r.verified <= 2 for r in drafted)
    stops = {eos, 63} if eos_list else {eos}
    for r in drafter.last_stats.rounds:  # n-gram rounds too: nothing verified past a stop token
        verified = r.tokens[: r.verified]
        assert not any(t in stops for t in verified[:-1]), r


@pytest.mark.parametrize("gen", [
    dict(repetition_penalty=1.3),
    dict(no_repeat_ngram_size=2),
    dict(suppress_tokens=[1, 2, 3]),
    dict(min_new_tokens=20, max_new_tokens=30),
])
def test_processors(llama, gen):
    gen.setdefault("max_new_tokens", 40)
    assert_identical(llama, drafter_for(llama), **gen)


@pytest.mark.parametrize("ngram", [False, True], ids=["drafter", "with-ngrams"])
def test_drafter_context_matches_a_full_forward(llama, ngram):
    """The context K/V the drafter built round by round equals the one built from one forward over the
    final sequence: the right rows were ingested, at the right positions, none twice (n-gram rounds, whose rows
    wait for the next drafter round, included)."""
    drafter = drafter_for(llama)
    drafter.options.ngram_drafts = ngram
    seen = {}
    real_init = DSparkCandidateGenerator.__init__

    def spy(self, *a, **k):
        real_init(self, *a, **k)
        seen["gen"] = self

    DSparkCandidateGenerator.__init__ = spy
    try:
        free = llama.generate(PROMPT, do_sample=False, max_new_tokens=50)
        with oracle_drafts(free):
            out = llama.generate(PROMPT, do_sample=False, max_new_tokens=50, assistant_model=drafter)
    finally:
        DSparkCandidateGenerator.__init__ = real_init
    gen = seen["gen"]
    assert (drafter.last_stats.ngram_rounds > 0) == ngram
    gen._fuse()  # rows collected in rounds that did not draft (here: the last, at the length limit)
    n = gen.ctx_len
    # everything but the final round's tokens and its anchor: their states are never requested
    assert n == out.shape[1] - 1 - drafter.last_stats.rounds[-1].committed
    with torch.no_grad():
        hs = llama(out[:, :n], output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i + 1] for i in drafter.config.target_layer_ids], dim=-1)
        full = drafter.context_kv(feats, torch.arange(n)[None])
    for (k0, v0), (k1, v1) in zip(gen.context_kv, full):
        torch.testing.assert_close(k0, k1, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(v0, v1, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("policy, drafts", [("all", BLOCK), (1, 1), (2, 2), (0, 0)])
def test_drafts_only_what_the_policy_can_verify(llama, policy, drafts, monkeypatch):
    """The backbone runs the anchor plus one mask slot per draft the policy can verify (at most the block), and
    the sequential head drafts exactly that many; the output stays identical to plain decoding."""
    drafter = drafter_for(llama)
    drafter.options.verify_policy = policy
    slots = []
    real = type(drafter).backbone
    monkeypatch.setattr(type(drafter), "backbone", lambda self, e, *a, **k: slots.append(e.shape[1]) or real(self, e, *a, **k))
    plain = llama.generate(PROMPT, do_sample=False, max_new_tokens=30)
    spec = llama.generate(PROMPT, do_sample=False, max_new_tokens=30, assistant_model=drafter)
    assert spec.tolist() == plain.tolist()
    rounds = drafter.last_stats.rounds
    if drafts == 0:
        assert slots == [] and all(r.drafted == 0 for r in rounds)
        return
    far = [r for r in rounds if r.drafted]  # rounds near the length limit draft fewer
    assert max(r.drafted for r in far) == drafts
    assert max(slots) == min(BLOCK, drafts + 1) and len(slots) == len(far)


@pytest.mark.parametrize("policy, cap", [("all", BLOCK), (2, 2), (0, 0)])
def test_ngram_drafts_greedy_identity(llama, policy, cap, monkeypatch):
    """drafter.options.ngram_drafts: every round whose last 2-4 answer tokens occurred before verifies exactly the
    tokens that followed their latest earlier occurrence (tests/decoding/test_ngram.py's brute force), up to the
    policy's cap and the length limit, and only the other rounds consult the draft gate; the output stays identical."""
    from hf_dspark.decoding.policy import VerifyPolicy
    from tests.decoding.test_ngram import brute_force

    from hf_dspark.decoding.ngram import NgramIndex

    recorded, starts = [], set()
    real_record, real_draft = VerifyPolicy.record, NgramIndex.draft
    monkeypatch.setattr(VerifyPolicy, "record", lambda self, *a: (recorded.append(a), real_record(self, *a))[1])
    monkeypatch.setattr(NgramIndex, "draft", lambda self, n: (starts.add(self.answer_start), real_draft(self, n))[1])
    drafter = drafter_for(llama)
    drafter.options.verify_policy, drafter.options.ngram_drafts = policy, True
    max_new = 60
    plain = assert_identical(llama, drafter, oracle=False, max_new_tokens=max_new)
    st = drafter.last_stats
    seq = plain[0, : PROMPT.shape[1] + 1].tolist()  # the prompt and the prefill's token
    for r in st.rounds:
        room = PROMPT.shape[1] + max_new - len(seq) - 1
        expected = brute_force(seq, min(cap, room), answer_start=PROMPT.shape[1])  # the suffix lies in the answer
        assert (r.source == "ngram") == bool(expected), (r, expected)
        if expected:
            assert r.tokens == expected and r.verified == r.drafted == len(expected) and r.confidence == []
        seq += r.new_tokens
    assert seq == plain[0].tolist() and starts == {PROMPT.shape[1]}  # the index knows where the answer starts
    assert len(recorded) == sum(r.source == "dspark" for r in st.rounds)
    assert (st.ngram_rounds > 0) == (cap > 0)
    assert (sum(r.accepted for r in st.rounds if r.source == "ngram") > 0) == (cap > 0)  # and some are kept
