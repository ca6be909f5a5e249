"""Greedy token identity with plain `generate` (fp32), stopping exactly where it stops, the drafter's context
staying in step with the target, streaming, and routing through transformers."""

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

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
    drafter.ngram_drafts = ngram
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
    drafter.ngram_drafts = ngram
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


class StopAfterToken(StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


class StopAtLength(StoppingCriteria):
    def __init__(self, length):
        self.length = length

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool)


@pytest.mark.parametrize("ngram", [False, True], ids=["drafter", "with-ngrams"])
def test_custom_stopping_criteria_stop_exactly(llama, ngram):
    free = llama.generate(PROMPT, do_sample=False, max_new_tokens=40)
    token = int(free[0, PROMPT.shape[1] + 12])
    drafter = drafter_for(llama)
    drafter.ngram_drafts = ngram
    for crit in (StopAfterToken(token), StopAtLength(PROMPT.shape[1] + 10)):
        out = assert_identical(llama, drafter, max_new_tokens=40, stopping_criteria=StoppingCriteriaList([crit]))
        assert out.shape[1] < free.shape[1]


@pytest.mark.parametrize("ngram", [False, True], ids=["drafter", "with-ngrams"])
def test_stop_strings_stop_exactly(llama, char_tokenizer, ngram):
    free = llama.generate(PROMPT, do_sample=False, max_new_tokens=40)
    a, b = (int(t) for t in free[0, PROMPT.shape[1] + 14 : PROMPT.shape[1] + 16])
    stop = char_tokenizer.decode([a, b])
    drafter = drafter_for(llama)
    drafter.ngram_drafts = ngram
    out = assert_identical(llama, drafter, max_new_tokens=40, stop_strings=[stop], tokenizer=char_tokenizer)
    assert out.shape[1] < free.shape[1]


def test_dict_output_is_truncated_at_a_stop(llama):
    free = llama.generate(PROMPT, do_sample=False, max_new_tokens=30)
    crit = StoppingCriteriaList([StopAtLength(PROMPT.shape[1] + 9)])
    kw = dict(do_sample=False, max_new_tokens=30, stopping_criteria=crit, return_dict_in_generate=True, output_scores=True)
    plain = llama.generate(PROMPT, **kw)
    drafter = drafter_for(llama)
    with oracle_drafts(free, p_right=1.0):
        spec = llama.generate(PROMPT, assistant_model=drafter, **kw)
    assert spec.sequences.tolist() == plain.sequences.tolist()
    assert len(spec.scores) == len(plain.scores) == 9
    assert spec.past_key_values.get_seq_length() == plain.past_key_values.get_seq_length()


def test_streamer_yields_the_final_text(llama, char_tokenizer):
    free = llama.generate(PROMPT, do_sample=False, max_new_tokens=40)
    drafter = drafter_for(llama)
    for stops in (None, [char_tokenizer.decode(free[0, PROMPT.shape[1] + 7 : PROMPT.shape[1] + 9])]):
        streamer = TextIteratorStreamer(char_tokenizer, skip_prompt=True)
        with oracle_drafts(free):
            out = llama.generate(PROMPT, do_sample=False, max_new_tokens=40, assistant_model=drafter,
                                 streamer=streamer, stop_strings=stops, tokenizer=char_tokenizer)
        streamed = "".join(streamer)
        assert streamed == char_tokenizer.decode(out[0, PROMPT.shape[1]:])
        if stops:
            assert out.shape[1] < free.shape[1]


@pytest.mark.parametrize("ngram", [False, True], ids=["drafter", "with-ngrams"])
def test_drafter_context_matches_a_full_forward(llama, ngram):
    """The context K/V the drafter built round by round equals the one built from one forward over the
    final sequence: the right rows were ingested, at the right positions, none twice (n-gram rounds, whose rows
    wait for the next drafter round, included)."""
    drafter = drafter_for(llama)
    drafter.ngram_drafts = ngram
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


def test_other_assistants_still_use_transformers(llama):
    """Prompt lookup and ordinary assistant models are untouched by the routing."""
    ids = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4, 1, 2]])
    drafter_for(llama)  # enables the class swap
    plain = llama.generate(ids, do_sample=False, max_new_tokens=12)
    assert llama.generate(ids, do_sample=False, max_new_tokens=12, prompt_lookup_num_tokens=3).tolist() == plain.tolist()
    small = tiny_target(layers=1, seed=3)
    assert llama.generate(ids, do_sample=False, max_new_tokens=12, assistant_model=small).tolist() == plain.tolist()


def test_stats_are_consistent(llama):
    drafter = drafter_for(llama)
    free = llama.generate(PROMPT, do_sample=False, max_new_tokens=60)
    with oracle_drafts(free):
        llama.generate(PROMPT, do_sample=False, max_new_tokens=60, assistant_model=drafter)
    st = drafter.last_stats
    assert all(r.accepted <= r.verified <= r.drafted <= BLOCK for r in st.rounds)
    assert all(r.committed in (r.accepted, r.accepted + 1) for r in st.rounds)
    assert all(len(r.target_probs) == r.verified for r in st.rounds)
    assert all(len(r.confidence) == r.drafted for r in st.rounds)
    # Greedy: every accepted draft is the target's argmax, and a rejected one is not.
    assert st.tau == pytest.approx(sum(r.committed for r in st.rounds) / len(st.rounds))
    cond = st.conditional_acceptance
    assert all(0.0 <= c <= 1.0 for c in cond)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(num_beams=2), NotImplementedError, "beam"),
    (dict(prompt_lookup_num_tokens=3), ValueError, "prompt_lookup_num_tokens"),
    (dict(num_assistant_tokens=5), ValueError, "num_assistant_tokens"),
    (dict(assistant_confidence_threshold=0.2), ValueError, "assistant_confidence_threshold"),
    (dict(cache_implementation="static"), NotImplementedError, "static"),
    (dict(max_new_tokens=300), ValueError, "context"),
])
def test_unsupported_requests_are_named(llama, kwargs, error, message):
    drafter = drafter_for(llama)
    kwargs.setdefault("max_new_tokens", 5)
    with pytest.raises(error, match=message):
        llama.generate(PROMPT, assistant_model=drafter, **kwargs)


def test_batch_and_padding_are_refused(llama):
    drafter = drafter_for(llama)
    with pytest.raises(NotImplementedError, match="batch of 2"):
        llama.generate(PROMPT.repeat(2, 1), max_new_tokens=5, assistant_model=drafter)
    mask = torch.ones_like(PROMPT)
    mask[0, 0] = 0
    with pytest.raises(NotImplementedError, match="padded"):
        llama.generate(PROMPT, attention_mask=mask, max_new_tokens=5, assistant_model=drafter)


def test_a_pad_token_inside_the_prompt_is_named_and_ones_make_it_a_token(llama):
    """generate() derives a mask from pad_token_id: a prompt holding that id is not 'padded' by the user; the
    refusal says why, and an explicit all-ones mask gives plain's output."""
    drafter = drafter_for(llama)
    pad = int(PROMPT[0, 2])
    with pytest.raises(NotImplementedError, match=f"holds the pad token id {pad} at positions \\[2\\]"):
        llama.generate(PROMPT, max_new_tokens=5, pad_token_id=pad, assistant_model=drafter)
    ones = torch.ones_like(PROMPT)
    plain = llama.generate(PROMPT, attention_mask=ones, max_new_tokens=8, pad_token_id=pad, do_sample=False)
    spec = llama.generate(PROMPT, attention_mask=ones, max_new_tokens=8, pad_token_id=pad, do_sample=False,
                          assistant_model=drafter)
    assert spec.tolist() == plain.tolist()


def test_drafter_bound_to_another_model(llama):
    from hf_dspark import enable

    drafter = drafter_for(tiny_target(seed=5))
    with pytest.raises(RuntimeError, match="not enabled"):  # a target nobody enabled: transformers' stock path
        llama.generate(PROMPT, max_new_tokens=5, assistant_model=drafter)
    enable(llama)
    with pytest.raises(ValueError, match="bound to another model"):
        llama.generate(PROMPT, max_new_tokens=5, assistant_model=drafter)


def test_logits_processor_leaves_scores_bit_identical():
    from hf_dspark import DSparkLogitsProcessor

    obs = DSparkLogitsProcessor()
    obs.begin_round(torch.tensor([[1, 2, 3, 4]]), 2)
    scores = torch.randn(1, 64)
    before = scores.clone()
    out = obs(torch.tensor([[1, 2]]), scores)
    assert out is scores and torch.equal(out, before)
    assert set(obs.target_probs) == {1} and 0 < obs.target_probs[1] < 1


@pytest.mark.parametrize("head", ["markov", "rnn"])
def test_pruned_draft_vocabulary_keeps_greedy_identity(llama, head):
    drafter = drafter_for(llama, head)
    free = llama.generate(PROMPT, do_sample=False, max_new_tokens=40)
    drafter.set_draft_vocab(free[0].unique().tolist()[::2])  # half of the tokens it will need: many misses
    assert drafter.config.draft_vocab_size == len(drafter.draft_vocab)
    assert_identical(llama, drafter, oracle=False, max_new_tokens=40)
    st = drafter.last_stats
    drafted = {t for r in st.rounds for t in r.tokens}
    assert drafted <= set(drafter.draft_vocab.tolist())


def test_pruned_draft_vocabulary_round_trips(llama, tmp_path):
    drafter = drafter_for(llama)
    drafter.set_draft_vocab([9, 3, 3, 40, 7])
    drafter.save_pretrained(tmp_path)
    again = DSparkDrafter.from_pretrained(tmp_path, target=llama)
    assert again.draft_vocab.tolist() == [3, 7, 9, 40] and again.config.draft_vocab_size == 4


def test_nan_target_logits_are_a_named_error(llama):
    drafter = drafter_for(llama)
    hook = llama.lm_head.register_forward_hook(lambda mod, inp, out: out * float("nan"))
    try:
        with pytest.raises(ValueError, match="NaN"):
            llama.generate(PROMPT, max_new_tokens=5, assistant_model=drafter)
    finally:
        hook.remove()


@pytest.mark.parametrize("policy, drafts", [("all", BLOCK), (1, 1), (2, 2), (0, 0)])
def test_drafts_only_what_the_policy_can_verify(llama, policy, drafts, monkeypatch):
    """The backbone runs the anchor plus one mask slot per draft the policy can verify (at most the block), and
    the sequential head drafts exactly that many; the output stays identical to plain decoding."""
    drafter = drafter_for(llama)
    drafter.verify_policy = policy
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
    """drafter.ngram_drafts: every round whose last 2-4 tokens occurred before verifies exactly the tokens that
    followed their latest earlier occurrence (tests/decoding/test_ngram.py's brute force), up to the policy's cap and the
    length limit, and only the other rounds consult the draft gate; the output stays identical."""
    from hf_dspark.decoding.policy import VerifyPolicy
    from tests.decoding.test_ngram import brute_force

    recorded = []
    real_record = VerifyPolicy.record
    monkeypatch.setattr(VerifyPolicy, "record", lambda self, *a: (recorded.append(a), real_record(self, *a))[1])
    drafter = drafter_for(llama)
    drafter.verify_policy, drafter.ngram_drafts = policy, True
    max_new = 60
    plain = assert_identical(llama, drafter, oracle=False, max_new_tokens=max_new)
    st = drafter.last_stats
    seq = plain[0, : PROMPT.shape[1] + 1].tolist()  # the prompt and the prefill's token
    for r in st.rounds:
        room = PROMPT.shape[1] + max_new - len(seq) - 1
        expected = brute_force(seq, min(cap, room))
        assert (r.source == "ngram") == bool(expected), (r, expected)
        if expected:
            assert r.tokens == expected and r.verified == r.drafted == len(expected) and r.confidence == []
        seq += r.new_tokens
    assert seq == plain[0].tolist()
    assert len(recorded) == sum(r.source == "dspark" for r in st.rounds)
    assert (st.ngram_rounds > 0) == (cap > 0)
    assert (sum(r.accepted for r in st.rounds if r.source == "ngram") > 0) == (cap > 0)  # and some are kept
