"""DSpark's own loop (decoding/loop.py, `DecodingOptions(loop="static" | "compiled")`): greedy output equal to plain
generate, sampling on the target's law, stops, EOS and streamers exact, the rollback needed (a negative control),
and the requests it does not take sent to transformers' assisted loop by name."""

import pytest
import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TextIteratorStreamer
from transformers.generation.logits_process import TopKLogitsWarper
from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from hf_dspark import DecodingOptions, DSparkDrafter
from hf_dspark.decoding import loop
from tests.conftest import tiny_target
from tests.helpers import PROMPT, drafter_for, oracle_drafts
from tests.sampling_check import ALPHA, STEPS, N, exact_distribution, fit_pvalue, processors, sample_counts, setup

STATIC = DecodingOptions("all", ngram_drafts=False, loop="static")


class StopAtLength(StoppingCriteria):
    def __init__(self, length):
        self.length = length

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool)


def test_verification_lengths_are_padded_to_a_few_fixed_ones():
    assert [loop.padded(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 16]


def _greedy(model, drafter, options, new=40, **gen):
    plain = model.generate(PROMPT, do_sample=False, max_new_tokens=new, **gen)
    with oracle_drafts(plain):
        out = model.generate(PROMPT, do_sample=False, max_new_tokens=new, assistant_model=drafter,
                             dspark_options=options, **gen)
    return plain, out


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("policy", ["all", 2, 0])
@pytest.mark.parametrize("ngram", [False, True], ids=["drafter", "with-ngrams"])
def test_greedy_equals_plain(family, policy, ngram, monkeypatch):
    """Every acceptance length (oracle drafts right with p 0.7), n-gram rounds, plain steps (k = 0); and the loop
    really ran (not the assisted fallback)."""
    model = tiny_target(family)
    torch.manual_seed(0)
    drafter = DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 2])
    ran = []
    decode = loop.decode
    monkeypatch.setattr(loop, "decode", lambda *a, **k: ran.append(1) or decode(*a, **k))
    plain, out = _greedy(model, drafter, DecodingOptions(policy, ngram, loop="static"))
    assert out.tolist() == plain.tolist() and ran == [1]
    if policy == "all":
        assert len({r.accepted for r in drafter.last_stats.rounds if r.verified}) > 2


def test_eager_forwards_attend_only_the_cache_positions_in_use(monkeypatch):
    """The prefill and every eager verification attend the cache up to the positions in use (a multiple of 64),
    not its 512 reserved positions, and the output is still plain generate's."""
    model = tiny_target()
    torch.manual_seed(0)
    drafter = DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 2])
    widths = []  # (positions in use, positions attended) per layer forward
    update = loop.WindowedLayer.update

    def spy(self, *args, **kwargs):
        keys, values = update(self, *args, **kwargs)
        widths.append((int(self.cumulative_length), keys.shape[2]))
        return keys, values
    monkeypatch.setattr(loop.WindowedLayer, "update", spy)
    plain = model.generate(PROMPT, do_sample=False, max_new_tokens=90)
    with oracle_drafts(plain):
        out = model.generate(PROMPT, do_sample=False, max_new_tokens=90, assistant_model=drafter,
                             dspark_options=DecodingOptions("all", ngram_drafts=False, loop="static"))
    assert out.tolist() == plain.tolist()
    assert model.__dict__["_dspark_static_cache"][2] == 512 and widths
    assert all(width == -(-used // 64) * 64 for used, width in widths), widths
    assert {width for _, width in widths} == {64, 128}


def test_compiled_verification_equals_plain_with_one_graph_saved_and_loaded(tmp_path, monkeypatch, caplog):
    """Verifications of 2, 4 and 8 tokens over windows of 64, 128 and 192 cache positions run one graph (length and
    window are symbolic), compiled once (over a corrupt file, which is overwritten) and saved; a later model of the
    same config loads it from disk instead of compiling, and runs its own weights through it (weights are inputs),
    on a longer cache too (the cache size is symbolic). inductor's kernels are kept beside the graph (a reboot that
    empties the temporary folder would rebuild them at the next load)."""
    from torch._dynamo.utils import counters

    from hf_dspark.decoding import graphs

    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))
    options = DecodingOptions("all", ngram_drafts=False, loop="compiled")
    compiles = []
    compile_ = graphs.VerificationGraphs._compile
    monkeypatch.setattr(graphs.VerificationGraphs, "_compile",
                        lambda self, *a: compiles.append(1) or compile_(self, *a))
    def target(seed):
        model = tiny_target(seed=seed)
        model.config.max_position_embeddings = 2048  # room for a 1,024-position cache
        return model

    model = target(0)
    torch.manual_seed(0)
    drafter = DSparkDrafter.from_target(model, block_size=7, target_layer_ids=[0, 2])
    (tmp_path / "graphs").mkdir()
    for path in (tmp_path / "graphs" / "llama-a.pt2", graphs.graph_path(_key_after_prefill(model, drafter))):
        path.write_bytes(b"not a graph")
    keys = []  # a graph's key is built once per setup, not per verification (it costs ~16 ms on SmolLM2)
    key = graphs.graph_key
    monkeypatch.setattr(graphs, "graph_key", lambda *a: keys.append(1) or key(*a))
    before = counters["stats"]["unique_graphs"]
    plain, out = _greedy(model, drafter, options, new=150)
    assert out.tolist() == plain.tolist() and not drafter.last_stats.fallback
    assert {key[0] for key in model.__dict__["_dspark_compiled_lengths"]} == {2, 4, 8}
    # looked up once without inductor's vector-ISA probe, then (the file there unreadable) once with it
    assert counters["stats"]["unique_graphs"] - before == 1 and compiles == [1] and len(keys) == 2
    assert list((tmp_path / "inductor").rglob("*.so"))  # its kernels beside it, not in a temporary folder
    assert sum(r.verified > 0 for r in drafter.last_stats.rounds) > 20
    assert "could not load the compiled graph" in caplog.text
    from torch._inductor.cpu_vec_isa import VecISA, valid_vec_isa_list

    probes = []  # inductor's ISA probe (a test kernel loaded in a child process, ~1 s a process): not for a saved graph
    monkeypatch.setattr(VecISA, "_probe_load", lambda self, path: probes.append(str(self)) or True)
    valid_vec_isa_list.cache_clear()  # as in a new process: no ISA probed yet
    VecISA._VecISA__bool__impl.cache_clear()
    for seed in (0, 1):  # a new process's model, then another checkpoint of the same config
        other = target(seed)
        torch.manual_seed(0)
        drafter = DSparkDrafter.from_target(other, block_size=7, target_layer_ids=[0, 2])
        plain, out = _greedy(other, drafter, options, new=150)
        assert out.tolist() == plain.tolist() and not drafter.last_stats.fallback
    assert other.__dict__["_dspark_static_cache"][2] == 512
    prompt = torch.randint(3, 60, (1, 600), generator=torch.Generator().manual_seed(600))
    plain = other.generate(prompt, do_sample=False, max_new_tokens=30)
    with oracle_drafts(plain):
        out = other.generate(prompt, do_sample=False, max_new_tokens=30, assistant_model=drafter, dspark_options=options)
    assert out.tolist() == plain.tolist() and not drafter.last_stats.fallback
    assert other.__dict__["_dspark_static_cache"][2] == 1024
    assert counters["stats"]["unique_graphs"] - before == 1 and compiles == [1]  # loaded, not compiled
    assert not probes
    assert len(list((tmp_path / "graphs").glob("*.json"))) == 1


def _key_after_prefill(model, drafter):
    """The key the compiled loop's graph gets for `model` with `drafter` on a 150-token call (the cache it
    reserves, the taps it reads, the products it installs: stock on a profile-less fixed policy)."""
    from hf_dspark.decoding import graphs

    cache = loop._static_cache(model, PROMPT.shape[1] + 150 + loop.padded(8), reset=False)
    return graphs.graph_key(model, cache, [i + 1 for i in drafter.config.target_layer_ids], loop.padded(8))


@pytest.mark.parametrize("reserved", [False, True])
def test_reserve_sizes_the_cache_once_so_a_longer_call_compiles_nothing_again(reserved, monkeypatch):
    """Without `loop.reserve`, a call longer than any before allocates a new cache, and the compiled loop compiles
    its graph again for it (graphs are keyed by cache); reserved for the longest call, every call shares one."""
    model = tiny_target()
    model.config.max_position_embeddings = 2048
    torch.manual_seed(0)
    drafter = DSparkDrafter.from_target(model, block_size=3, target_layer_ids=[0, 2])
    monkeypatch.setattr(loop, "_compiled_forward", lambda m, most: m.forward)  # the compiled path, eagerly
    options = DecodingOptions("all", ngram_drafts=False, loop="compiled")
    if reserved:
        loop.reserve(model, 700)
    for length in (10, 600):
        prompt = torch.randint(3, 60, (1, length), generator=torch.Generator().manual_seed(length))
        plain = model.generate(prompt, do_sample=False, max_new_tokens=12)
        out = model.generate(prompt, do_sample=False, max_new_tokens=12, assistant_model=drafter,
                             dspark_options=options)
        assert out.tolist() == plain.tolist() and drafter.last_stats.loop == "compiled"
    caches = {key[1] for key in model.__dict__["_dspark_compiled_lengths"]}
    assert len(caches) == (1 if reserved else 2)
    with pytest.raises(ValueError, match="positions"):
        loop.reserve(model, 0)


def test_a_compile_that_fails_leaves_the_loop_eager_and_exact(tmp_path, monkeypatch, caplog):
    """No compiler, an op torch.compile cannot take: the compiled loop says so once and verifies eagerly, in this
    process and in later ones (the failure is recorded beside where the graph would be)."""
    model = tiny_target()
    torch.manual_seed(0)
    drafter = DSparkDrafter.from_target(model, block_size=3, target_layer_ids=[0, 2])
    tries = []

    class FailingCompile:
        def __init__(self, fn, **kwargs):
            pass

        def aot_compile(self, example_inputs):
            tries.append(1)
            raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")

    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))
    monkeypatch.setattr(torch, "compile", FailingCompile)
    options = DecodingOptions("all", ngram_drafts=False, loop="compiled")
    for _ in range(2):
        plain, out = _greedy(model, drafter, options)
        assert out.tolist() == plain.tolist() and drafter.last_stats.loop == "compiled"
    assert len(tries) == 1 and "InvalidCxxCompiler" in model._dspark_compile_error  # tried once, not per call
    # a later process (a new model of the same setup) reads the failure recorded beside the graph: not tried again
    again = tiny_target()
    plain, out = _greedy(again, DSparkDrafter.from_target(again, block_size=3, target_layer_ids=[0, 2]), options)
    assert out.tolist() == plain.tolist() and len(tries) == 1 and "InvalidCxxCompiler" in again._dspark_compile_error


def test_eos_stop_strings_criteria_and_streamer_are_exact(llama, char_tokenizer):
    free = llama.generate(PROMPT, do_sample=False, max_new_tokens=40)
    drafter = drafter_for(llama)
    eos = int(free[0, PROMPT.shape[1] + 11])  # a token the answer reaches: EOS there, inside a drafted block
    plain, out = _greedy(llama, drafter, STATIC, eos_token_id=eos)
    assert out.tolist() == plain.tolist() and out.shape[1] < free.shape[1]
    plain, out = _greedy(llama, drafter, STATIC, stopping_criteria=StoppingCriteriaList([StopAtLength(PROMPT.shape[1] + 9)]))
    assert out.tolist() == plain.tolist() and out.shape[1] == PROMPT.shape[1] + 9
    stop = char_tokenizer.decode(free[0, PROMPT.shape[1] + 14: PROMPT.shape[1] + 16])
    streamer = TextIteratorStreamer(char_tokenizer, skip_prompt=True)
    plain, out = _greedy(llama, drafter, STATIC, stop_strings=[stop], tokenizer=char_tokenizer, streamer=streamer)
    assert out.tolist() == plain.tolist() and out.shape[1] < free.shape[1]
    assert "".join(streamer) == char_tokenizer.decode(out[0, PROMPT.shape[1]:])


@pytest.mark.parametrize("name", ["static", "compiled"])
def test_sampling_follows_the_targets_law(name, tmp_path, monkeypatch):
    """G-test on the enumerable V = 8 pair: rejection sampling on the static loop, drafts rejected often; and on the
    compiled loop, its verifications run by a real compiled graph (saved in a temporary folder)."""
    from tests.sampling_check import PROMPT as SMALL

    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))
    model, drafter = setup(head="markov")
    exact = exact_distribution(model, SMALL, STEPS, processors())
    options = DecodingOptions("all", ngram_drafts=False, loop=name)
    samples = sample_counts(model, drafter, SMALL, STEPS, N, seed=11, dspark_options=options)
    assert any(r.verified > r.accepted for r in drafter.last_stats.rounds)
    if name == "compiled":
        assert "_dspark_compile_error" not in model.__dict__ and list((tmp_path / "graphs").glob("*.pt2"))
    p = fit_pvalue(samples, exact)
    assert p >= ALPHA, f"{name} loop: samples deviate from the target's law (p={p:.2e})"


def test_negative_control_a_loop_that_keeps_a_rejected_draft_differs(monkeypatch):
    """The greedy test can fail: a loop that leaves one rejected draft in the cache, once, gives other tokens."""
    model = tiny_target()
    torch.manual_seed(0)
    drafter = DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 2])
    keep, spoiled = loop.StaticVerifier.keep, []

    def keep_one_rejected_draft_once(self, kept):  # once: the cache's room for padding is not overrun
        if kept < self.real and not spoiled:
            spoiled.append(kept)
            kept += 1
        keep(self, kept)

    monkeypatch.setattr(loop.StaticVerifier, "keep", keep_one_rejected_draft_once)
    plain, out = _greedy(model, drafter, STATIC)
    assert out.tolist() != plain.tolist()


def test_requests_it_does_not_take_go_to_the_assisted_loop_by_name(llama, caplog, monkeypatch):
    drafter = drafter_for(llama)
    ran = []
    decode = loop.decode
    monkeypatch.setattr(loop, "decode", lambda *a, **k: ran.append(1) or decode(*a, **k))
    plain = llama.generate(PROMPT, do_sample=False, max_new_tokens=20, return_dict_in_generate=True,
                           output_hidden_states=True)
    out = llama.generate(PROMPT, do_sample=False, max_new_tokens=20, return_dict_in_generate=True,
                         output_hidden_states=True, assistant_model=drafter, dspark_options=STATIC)
    assert out.sequences.tolist() == plain.sequences.tolist() and ran == []
    assert "output_hidden_states" in drafter.last_stats.fallback
    config = llama.generation_config.__class__(max_length=30)  # as generate() prepares it
    assert loop.unsupported(llama, PROMPT, config, {}, 4) is None
    asked = llama.generation_config.__class__(max_length=30, return_dict_in_generate=True, output_attentions=True)
    assert "output_attentions" in loop.unsupported(llama, PROMPT, asked, {}, 4)
    assert "inputs_embeds" in loop.unsupported(llama, PROMPT, config, {"inputs_embeds": torch.zeros(1, 3, 8)}, 4)
    with pytest.raises(ValueError, match="loop must be one of"):
        llama.generate(PROMPT, max_new_tokens=3, assistant_model=drafter, dspark_options=DecodingOptions(loop="fast"))


def test_a_sliding_window_shorter_than_the_cache_goes_to_the_assisted_loop_and_stays_exact():
    """A static cache with sliding-window layers shorter than it cannot be rolled back: the call runs on the
    assisted loop (which keeps the window's past), exact, and the stats say why."""
    from tests import arch_matrix

    model = arch_matrix.build("mistral")  # sliding window 16
    drafter = DSparkDrafter.from_target(model, block_size=4, num_hidden_layers=1, markov_rank=8)
    plain = model.generate(PROMPT, do_sample=False, max_new_tokens=24)
    with oracle_drafts(plain):
        out = model.generate(PROMPT, do_sample=False, max_new_tokens=24, assistant_model=drafter,
                             dspark_options=STATIC)
    assert out.tolist() == plain.tolist()
    stats = drafter.last_stats
    assert stats.loop == "assisted" and "sliding window" in stats.fallback and "cannot be rolled back" in stats.fallback


def test_stats_name_the_loop_that_ran(llama):
    drafter = drafter_for(llama)
    llama.generate(PROMPT, do_sample=False, max_new_tokens=6, assistant_model=drafter, dspark_options=STATIC)
    assert (drafter.last_stats.loop, drafter.last_stats.fallback) == ("static", "")
    llama.generate(PROMPT, do_sample=False, max_new_tokens=6, assistant_model=drafter)
    assert (drafter.last_stats.loop, drafter.last_stats.fallback) == ("assisted", "")


def test_the_default_loop_is_compiled_once_its_profile_is_measured_and_a_seed_samples_as_that_loop(tmp_path,
                                                                                                   monkeypatch):
    """Default options (loop "auto"): transformers' assisted loop until the compiled loop's profile is measured here
    (`hf-dspark profile`; measuring it compiles the graph: a stand-in here), then the compiled loop; greedy equal to
    plain either way, and a seed's samples are those of the loop that ran (the same call pinned to it by name)."""
    import transformers

    from hf_dspark import prepare

    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))
    monkeypatch.setattr(loop, "_compiled_forward", lambda m, most: m.forward)  # the compiled path, eagerly
    transformers.utils.logging.warning_once.cache_clear()  # a once-per-process hint, seen by this test
    model = tiny_target()
    torch.manual_seed(0)
    drafter = DSparkDrafter.from_target(model, block_size=3, target_layer_ids=[0, 2])

    def sampled(**options):
        torch.manual_seed(5)
        extra = {"dspark_options": DecodingOptions(**options)} if options else {}
        out = model.generate(PROMPT, do_sample=True, max_new_tokens=24, assistant_model=drafter, **extra)
        return out.tolist(), drafter.last_stats.loop

    for ran in ("assisted", "compiled"):
        if ran == "compiled":
            assert prepare(model, drafter).key.loop == "compiled"
        plain = model.generate(PROMPT, do_sample=False, max_new_tokens=24)
        with CaptureLogger(logging.get_logger("hf_dspark.decoding.routing")) as log:
            out = model.generate(PROMPT, do_sample=False, max_new_tokens=24, assistant_model=drafter)
        assert out.tolist() == plain.tolist() and drafter.last_stats.loop == ran
        assert ("hf_dspark.prepare(model, drafter)" in log.out) == (ran == "assisted")  # said until set up
        (auto, auto_ran), (named, _) = sampled(), sampled(loop=ran)
        assert auto == named and auto_ran == ran
    assert drafter.options.loop == "auto"


def test_a_sliding_window_as_long_as_the_cache_takes_the_static_loop_and_stays_exact():
    from tests import arch_matrix

    config = arch_matrix.tiny_config("mistral")
    config.sliding_window = loop.CACHE_STEP
    torch.manual_seed(0)
    model = type(arch_matrix.build("mistral"))(config).eval()
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = None
    drafter = DSparkDrafter.from_target(model, block_size=4, num_hidden_layers=1, markov_rank=8)
    plain = model.generate(PROMPT, do_sample=False, max_new_tokens=24)
    with oracle_drafts(plain):
        out = model.generate(PROMPT, do_sample=False, max_new_tokens=24, assistant_model=drafter,
                             dspark_options=STATIC)
    assert out.tolist() == plain.tolist() and drafter.last_stats.loop == "static"


def _close_per_token(mine, theirs, vocab):
    assert len(mine) == len(theirs)
    for x, y in zip(mine, theirs):
        assert x.shape == y.shape == (1, vocab)
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)


def test_dict_outputs_with_scores_and_logits_match_the_assisted_loop(llama):
    """return_dict_in_generate on the own loop, greedy: the same sequences, and per new token the same processed
    scores and raw logits as transformers' assisted loop gives (same drafts)."""
    drafter = drafter_for(llama)
    kw = dict(do_sample=False, max_new_tokens=16, return_dict_in_generate=True, output_scores=True,
              output_logits=True, repetition_penalty=1.3, assistant_model=drafter)
    runs = {}
    for name in ("assisted", "static"):
        runs[name] = llama.generate(PROMPT, **kw, dspark_options=DecodingOptions("all", ngram_drafts=False,
                                                                                 loop=name))
        assert drafter.last_stats.loop == name
    a, s = runs["assisted"], runs["static"]
    assert s.sequences.tolist() == a.sequences.tolist()
    assert len(s.scores) == s.sequences.shape[1] - PROMPT.shape[1]
    _close_per_token(s.scores, a.scores, llama.config.vocab_size)
    _close_per_token(s.logits, a.logits, llama.config.vocab_size)
    assert s.cache is None


def test_sampled_dict_outputs_are_the_targets_logits_of_the_sampled_tokens(llama):
    """Sampled, the own loop draws with one uniform per token (rejection_sample), so a seed gives other tokens than
    transformers' assisted loop; its scores and logits per new token are still the target's on the sequence it
    sampled: the raw logits of a teacher-forced forward, processed as generate() processes them (the repetition
    penalty, then transformers' default top-k of 50)."""
    drafter = drafter_for(llama)
    torch.manual_seed(3)
    out = llama.generate(PROMPT, do_sample=True, max_new_tokens=16, return_dict_in_generate=True,
                         output_scores=True, output_logits=True, repetition_penalty=1.3, assistant_model=drafter,
                         dspark_options=STATIC)
    assert drafter.last_stats.loop == "static" and any(r.verified > r.accepted for r in drafter.last_stats.rounds)
    seq, start = out.sequences, PROMPT.shape[1]
    with torch.no_grad():
        logits = llama(seq).logits[0, start - 1 : -1].float()
    procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.3), TopKLogitsWarper(50)])
    scores = [procs(seq[:, : start + i], logits[i : i + 1].clone()) for i in range(len(logits))]
    _close_per_token(out.logits, [row[None] for row in logits], llama.config.vocab_size)
    _close_per_token(out.scores, scores, llama.config.vocab_size)


def test_rejection_sample_commits_tokens_on_the_targets_law():
    """loop.rejection_sample alone, V = 6, two drafts drawn from q: the first committed token follows p_0 (accepted
    draft or residual) and, given a first token accepted, the second follows p_1 (G-tests). A sampler that draws the
    replacement from p instead of the residual max(p − q, 0) fails the same test (the negative control)."""
    import numpy as np

    from tests.sampling_check import _g_test

    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 6, generator=gen) * 1.5
    q_logits = torch.randn(2, 6, generator=gen) * 1.5
    p = scores.softmax(-1).double().numpy()

    def first_tokens(sampler, n=20_000):
        torch.manual_seed(1)
        firsts, seconds = [], []
        for _ in range(n):
            drafts = torch.multinomial(q_logits.softmax(-1), 1).view(-1)
            out = sampler(drafts, q_logits, scores)[0].tolist()
            firsts.append(out[0])
            if len(out) > 1 and out[0] == int(drafts[0]):  # x_1 accepted: the next token is judged on p_1
                seconds.append(out[1])
        return np.bincount(firsts, minlength=6), np.bincount(seconds, minlength=6)

    first, second = first_tokens(loop.rejection_sample)
    assert _g_test(first, p[0]) > ALPHA and _g_test(second, p[1]) > ALPHA

    def from_p_not_residual(drafts, q_logits, scores):
        probs, q = scores.softmax(-1), q_logits.softmax(-1)
        for i, x in enumerate(drafts.tolist()):
            if torch.rand(()) > probs[i, x] / q[i, x]:
                return torch.tensor([drafts[:i].tolist() + [int(torch.multinomial(probs[i], 1))]])
        return torch.tensor([drafts.tolist() + [int(torch.multinomial(probs[-1], 1))]])

    wrong, _ = first_tokens(from_p_not_residual)
    assert _g_test(wrong, p[0]) < ALPHA


def test_a_step_runs_as_the_longer_forward_the_profile_found_cheaper_and_stays_exact(monkeypatch):
    """Where the loop's profile measured a 2-token forward as cheaper than the 1-token step (compiled, bf16, on a
    Zen 5), a round without drafts feeds its one token padded to 2; the output is unchanged."""
    from hf_dspark.decoding.profile import DeviceProfile, profile_key

    model = tiny_target()
    torch.manual_seed(0)
    drafter = DSparkDrafter.from_target(model, block_size=3, target_layer_ids=[0, 2])
    cheaper_two = DeviceProfile(key=profile_key(model, drafter, "static"), verify_time=[1.0, 0.8, 5.0, 5.0],
                                draft_time=9.0, rollback_time=0.0, cache_len=0, warmup=0, repeats=0)
    fed = []
    verify = loop.StaticVerifier.verify
    monkeypatch.setattr(loop.StaticVerifier, "verify",
                        lambda self, tokens: (fed.append((tokens.shape[1], verify(self, tokens))) or fed[-1][1]))
    options = DecodingOptions("auto", ngram_drafts=False, device_profile=cheaper_two, loop="static")
    plain, out = _greedy(model, drafter, options)
    assert out.tolist() == plain.tolist()
    assert drafter.last_stats.loop == "static"
    steps = [o for n, o in fed if n == 1]  # rounds without drafts (drafting never pays here: the gate probes)
    assert len(steps) > 10 and {o.logits.shape[1] for o in steps} == {2}  # each ran as a 2-token forward


def test_sampling_follows_the_targets_law_when_steps_run_as_longer_forwards(monkeypatch):
    """The G-test again, on a profile that makes the loop feed each one-token step as a 2-token forward."""
    from hf_dspark.decoding.profile import DeviceProfile, profile_key
    from tests.sampling_check import PROMPT as SMALL

    model, drafter = setup(head="markov")
    profile = DeviceProfile(key=profile_key(model, drafter, "static"), verify_time=[1.0, 0.8, 5.0, 5.0],
                            draft_time=9.0, rollback_time=0.0, cache_len=0, warmup=0, repeats=0)
    fed = []
    verify = loop.StaticVerifier.verify
    monkeypatch.setattr(loop.StaticVerifier, "verify",
                        lambda self, tokens: fed.append((tokens.shape[1], self.run_as)) or verify(self, tokens))
    options = DecodingOptions("auto", ngram_drafts=False, device_profile=profile, loop="static")
    exact = exact_distribution(model, SMALL, STEPS, processors())
    samples = sample_counts(model, drafter, SMALL, STEPS, N, seed=12, dspark_options=options)
    assert sum(n == 1 and run_as.get(1) == 2 for n, run_as in fed) > N  # most steps ran as 2-token forwards
    p = fit_pvalue(samples, exact)
    assert p >= ALPHA, f"static loop, steps run as 2 tokens: samples deviate from the target's law (p={p:.2e})"
