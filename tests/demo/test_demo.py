"""The demo's logic without a browser: token fates, HTML rendering (escaping), request limits, verify policy."""

import re

import pytest
import torch

from hf_dspark.decoding.stats import DSparkStats, Round
from hf_dspark.demo import render as demo
from hf_dspark.demo.session import (
    MAX_PROMPT_CHARS,
    Recorder,
    Request,
    check_request,
    on_compute_thread,
    policy_for,
    race,
    sampling_kwargs,
    stream_generate,
)

torch.set_num_threads(1)


def rnd(tokens, verified, new_tokens, conf=None, probs=None):
    accepted = 0
    while accepted < min(verified, len(new_tokens)) and new_tokens[accepted] == tokens[accepted]:
        accepted += 1
    return Round(drafted=len(tokens), verified=verified, accepted=accepted, committed=len(new_tokens),
                 draft_time=0.0, verify_time=0.0, confidence=conf or [0.9, 0.8, 0.7, 0.6][: len(tokens)],
                 target_probs=probs or [0.5] * verified, tokens=tokens, new_tokens=new_tokens)


def fates(rs, block=None):
    return [(f.token_id, f.fate) for f in demo.classify([100], rs, block)]


def test_fates_of_a_round_with_rejection_and_trimming():
    # 4 drafts, 3 verified, 1 accepted: x2 is replaced by the target's 42, x3 rejected unseen, x4 trimmed
    r = rnd([10, 11, 12, 13], verified=3, new_tokens=[10, 42])
    assert fates([r]) == [(100, "target"), (10, "accepted"), (11, "rejected"), (12, "rejected"),
                          (13, "trimmed"), (42, "target")]
    f = demo.classify([], [r])
    assert f[-1].detail == "correction" and f[-1].position == 2
    assert demo.committed_ids(demo.classify([100], [r])) == [100, 10, 42]


def test_all_accepted_gives_a_bonus_and_block_cap_hides_drafts_never_offered():
    r = rnd([10, 11, 12, 13], verified=2, new_tokens=[10, 11, 55])
    f = demo.classify([], [r], block=2)
    assert [(x.token_id, x.fate) for x in f] == [(10, "accepted"), (11, "accepted"), (55, "target")]
    assert f[-1].detail == "bonus"
    # with the block at γ the same round's unverified drafts are the scheduler's trims
    assert [x.fate for x in demo.classify([], [r], block=4)] == ["accepted", "accepted", "trimmed", "trimmed", "target"]


def test_zero_verified_and_stop_without_bonus():
    r0 = rnd([10, 11], verified=0, new_tokens=[7])
    assert fates([r0]) == [(100, "target"), (10, "trimmed"), (11, "trimmed"), (7, "target")]
    eos = rnd([10, 2, 5], verified=3, new_tokens=[10, 2])  # accepted EOS: nothing after it
    assert fates([eos])[1:] == [(10, "accepted"), (2, "accepted"), (5, "rejected")]


def test_hover_text_has_round_position_prediction_and_outcome():
    r = rnd([10, 11], verified=2, new_tokens=[10, 9], conf=[0.91, 0.35], probs=[0.8, 0.1])
    f = demo.classify([], [r])
    assert demo.hover_text(f[0]) == "round 1, draft position 1: predicted survival c=0.91 → accepted, target p=0.80"
    assert "c=0.35 → rejected" in demo.hover_text(f[1])
    assert demo.hover_text(f[2]) == "round 1, position 2: correction token from the target"


def test_rendering_escapes_script_in_prompt_and_answer():
    evil = '<script>alert("x")</script>'
    r = rnd([1, 2], verified=2, new_tokens=[1, 3])
    text = {1: "<script>", 2: "&amp;", 3: '" onmouseover="alert(1)'}
    html = demo.answer_html(evil, demo.classify([], [r]), text.get, done=True)
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "&amp;amp;" in html  # already-escaped-looking text is shown literally, not unescaped
    assert 'onmouseover="' not in html  # no attribute injection from token text
    # every tag in the output is one of ours
    assert set(re.findall(r"<([a-z]+)", html)) <= {"div", "span", "b", "s"}


def test_discarded_drafts_are_struck_through_and_whitespace_is_visible():
    r = rnd([5, 6], verified=1, new_tokens=[7])
    html = demo.render_tokens(demo.classify([], [r]), {5: " ", 6: "\n", 7: "ok"}.get)
    assert '<span class="tok tok-rejected"' in html and "<s>·</s>" in html
    assert "<s>↵</s>" in html and 'class="tok tok-target"' in html


def test_stats_panel_and_plots():
    st = DSparkStats(block_size=3)
    st.add(rnd([1, 2, 3], 3, [1, 2, 9], conf=[0.9, 0.8, 0.5]))
    st.add(rnd([1, 2, 3], 2, [1, 8], conf=[0.7, 0.6, 0.1]))
    html = demo.stats_html(st, n_tokens=5, elapsed=2.0, block=3, policy="<static>")
    assert "2.50" in html and "2.5" in html and "&lt;static&gt;" in html  # τ = 5/2, 5 tok / 2 s
    assert html.count("<svg") == 2 and 'class="dot"' in html
    assert demo.predicted_survival(st.rounds, 3) == pytest.approx([0.8, 0.7, 0.5])
    assert "waiting" in demo.stats_html(None, 0, 0.0, 3, "all")
    assert "identical ✓" in demo.race_html(10.0, 5.0, True) and "2.00×" in demo.race_html(10.0, 5.0, True)
    assert "independent draws" in demo.race_html(1.0, 1.0, None)


def test_request_limits():
    with pytest.raises(ValueError, match="limit"):
        check_request(Request("x" * (MAX_PROMPT_CHARS + 1)), 7)
    with pytest.raises(ValueError):
        check_request(Request("   "), 7)
    req = check_request(Request("hi", max_new_tokens=10_000, temperature=9, top_p=0, block=99), 7, max_new_tokens=128)
    assert (req.max_new_tokens, req.temperature, req.top_p, req.block) == (128, 2.0, 0.05, 7)
    assert sampling_kwargs(Request("hi"))["do_sample"] is False


class _Drafter:
    def __init__(self, gamma=7, confidence=True):
        self.config = type("C", (), {"block_size": gamma})()
        self.confidence_head = object() if confidence else None


class _Profile:
    def verify_length(self, conf, sampled=False):
        return 5


def test_policy_for_the_controls():
    d = _Drafter()
    assert (Request("p").scheduler, Request("p").ngram) == (True, True)  # the library's defaults
    assert policy_for(Request("p", block=7), d)[:2] == ("auto", "scheduler + draft gate (default)")
    assert policy_for(Request("p", block=7, scheduler=False), d)[0] == "all"
    assert policy_for(Request("p", block=3, scheduler=False), d)[0] == 3
    measured = []
    assert policy_for(Request("p", block=7), d, lambda dr: measured.append(dr))[0] == "auto"
    assert measured == [d]  # the profile is measured before generate, not inside its timing
    capped, desc, _ = policy_for(Request("p", block=3, scheduler=True), d, lambda _: _Profile())
    assert capped(torch.ones(7)) == 3 and "≤ 3" in desc
    # no confidence head: "auto" still works at the full block (the profile's reach behind the gate) ...
    assert policy_for(Request("p", block=7), _Drafter(confidence=False)) == ("auto", "scheduler + draft gate (default)", "")
    # ... a capped scheduler cannot: static length, said so
    policy, _, note = policy_for(Request("p", block=3, scheduler=True), _Drafter(confidence=False))
    assert policy == 3 and "no confidence head" in note


def test_stream_generate_on_a_tiny_target_matches_plain_generate():
    from hf_dspark import DSparkDrafter
    from hf_dspark.demo.models import tiny_target

    t = tiny_target(40)
    d = DSparkDrafter.from_target(t, num_hidden_layers=1, markov_rank=8, mask_token_id=2)
    d.options.verify_policy, d.options.ngram_drafts = "all", False  # the drafter's own options: each run passes its own instead
    ids = torch.tensor([[5, 6, 7, 8]])
    gen = {"max_new_tokens": 12, "do_sample": False}
    *_, p = stream_generate(t, {"input_ids": ids}, gen, drafter=d, policy=3, poll=0.01)
    assert p.done and p.error is None and d.options.verify_policy == "all"  # the drafter's options are untouched
    f = demo.classify(p.recorder.first_ids, p.rounds, 3)
    ref = t.generate(ids, **gen)
    assert demo.committed_ids(f) == p.recorder.ids == ref[0, 4:].tolist()
    assert all(r.verified <= 3 for r in p.rounds)
    *_, plain = stream_generate(t, {"input_ids": ids}, gen)
    assert torch.equal(plain.output, ref)
    # n-gram drafts on for this run only: the same tokens, and the drafter's option untouched
    *_, p = stream_generate(t, {"input_ids": torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8]])}, gen, drafter=d, policy="all",
                            poll=0.01, ngram=True)
    assert p.done and p.error is None and d.options.ngram_drafts is False
    ref = t.generate(torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8]]), **gen)
    assert demo.committed_ids(demo.classify(p.recorder.first_ids, p.rounds)) == ref[0, 8:].tolist()
    assert any(r.source == "ngram" for r in p.rounds)


def test_every_demo_generation_runs_on_the_one_compute_thread():
    """libgomp cuts its spin-wait once it manages more threads than CPUs, so a generate() on a fresh thread beside
    the loading thread's OpenMP team ran DSpark's rounds up to 2x slower: every generate (plain, DSpark, a race's
    two) runs on session's one compute thread, and stream_generate refuses to poll from that thread itself."""
    import threading

    from transformers import LogitsProcessor, LogitsProcessorList

    from hf_dspark import DSparkDrafter
    from hf_dspark.demo.models import tiny_target

    class Where(LogitsProcessor):
        def __init__(self):
            self.threads = set()

        def __call__(self, input_ids, scores):
            self.threads.add(threading.get_ident())
            return scores

    t = tiny_target(40)
    d = DSparkDrafter.from_target(t, num_hidden_layers=1, markov_rank=8, mask_token_id=2)
    where = Where()
    ids = {"input_ids": torch.tensor([[5, 6, 7, 8]])}
    gen = {"max_new_tokens": 6, "do_sample": False, "logits_processor": LogitsProcessorList([where])}
    for _ in range(2):
        *_, p = stream_generate(t, ids, gen, drafter=d, policy=3, poll=0.01)
        *_, plain = stream_generate(t, ids, gen)
        dspark, raced = race(t, ids, gen, d, "all", False)
        assert p.error is None and torch.equal(p.output, plain.output) and torch.equal(dspark.output, raced.output)
    compute = on_compute_thread(threading.get_ident)
    assert where.threads == {compute} and compute != threading.get_ident()
    assert on_compute_thread(on_compute_thread, threading.get_ident) == compute  # a nested call runs in place
    with pytest.raises(RuntimeError, match="compute thread"):
        on_compute_thread(lambda: list(stream_generate(t, ids, gen)))


def test_a_race_times_each_generate_alone_and_the_panel_shows_that_time():
    """race(): one final Progress per side (live=False: nothing yielded while decoding), each timed inside its
    generate() call, outputs equal plain generate (greedy); the stats panel's tokens/s is the race line's."""
    import time

    from hf_dspark import DSparkDrafter
    from hf_dspark.demo.models import tiny_target

    t = tiny_target(40)
    d = DSparkDrafter.from_target(t, num_hidden_layers=1, markov_rank=8, mask_token_id=2)
    ids = torch.tensor([[5, 6, 7, 8]])
    gen = {"max_new_tokens": 12, "do_sample": False}
    assert len(list(stream_generate(t, {"input_ids": ids}, gen, drafter=d, policy=3, poll=0.0, live=False))) == 1
    t0 = time.perf_counter()
    dspark, plain = race(t, {"input_ids": ids}, gen, d, 3, False)
    wall = time.perf_counter() - t0
    assert dspark.done and plain.done and dspark.error is None and plain.error is None
    assert torch.equal(dspark.output, plain.output) and torch.equal(plain.output, t.generate(ids, **gen))
    assert 0 < dspark.elapsed and 0 < plain.elapsed and dspark.elapsed + plain.elapsed <= wall
    n = len(dspark.recorder.ids)
    panel = demo.stats_html(dspark.stats, n, dspark.elapsed, 3, "static")
    shown = re.search(r'data-key="tokens/s">([0-9.]+)<', panel).group(1)
    assert f"DSpark {shown} tok/s" in demo.race_html(n / dspark.elapsed, len(plain.recorder.ids) / plain.elapsed, True)


def test_ngram_drafts_are_marked_and_explained():
    r = Round(drafted=3, verified=3, accepted=1, committed=2, draft_time=0, verify_time=0, tokens=[5, 6, 7],
              new_tokens=[5, 9], source="ngram")
    f = demo.classify([], [r])
    assert [(x.fate, x.source) for x in f[:3]] == [("accepted", "ngram"), ("rejected", "ngram"), ("rejected", "ngram")]
    assert f[3].fate == "target"
    assert "n-gram draft position 2 (copied from the context) → rejected" in demo.hover_text(f[1])
    html = demo.render_tokens(f, {5: "a", 6: "b", 7: "c", 9: "d"}.get)
    assert html.count("tok-ngram") == 3  # the drafts, not the target's token
    assert "tok-ngram" not in demo.render_tokens(demo.classify([], [Round(**{**vars(r), "source": "dspark"})]),
                                                 {5: "a", 6: "b", 7: "c", 9: "d"}.get)
    assert demo.NGRAM_LEGEND in demo.legend_html()


def test_recorder_skips_the_prompt():
    r = Recorder()
    r.put(torch.tensor([[1, 2, 3]]))
    r.put(torch.tensor([4]))
    r.put(torch.tensor([5, 6]))
    r.end()
    assert r.first_ids == [4] and r.ids == [4, 5, 6] and r.done


def test_use_loop_puts_every_drafter_on_the_loop_with_one_cache_for_the_longest_request(monkeypatch):
    """`hf-dspark demo --loop static|compiled`: the race's DSpark side runs on that loop, greedy-identical to plain,
    on a cache reserved at startup (no request allocates one); a bad $HF_DSPARK_LOOP is refused by name."""
    from hf_dspark import DSparkDrafter
    from hf_dspark.cli.demo import parse_app_args
    from hf_dspark.decoding import loop
    from hf_dspark.demo.models import DemoModels, tiny_target, use_loop

    t = tiny_target(40)
    d = DSparkDrafter.from_target(t, num_hidden_layers=1, markov_rank=8, mask_token_id=2)
    models = DemoModels(t, None, {"Markov": d, "none": None}, "tiny")
    use_loop(models, "static", 100)
    assert d.options.loop == "static" and "decoding loop: static" in models.info[-1]
    cache = t.__dict__["_dspark_static_cache"][0]
    monkeypatch.setattr(loop, "StaticCache", None)  # any new cache from here on would fail the race
    ids = torch.tensor([[5, 6, 7, 8]])
    gen = {"max_new_tokens": 12, "do_sample": False}
    dspark, plain = race(t, {"input_ids": ids}, gen, d, "all", ngram=False)
    assert dspark.error is None and torch.equal(dspark.output, plain.output)
    assert dspark.stats.loop == "static" and t.__dict__["_dspark_static_cache"][0] is cache
    assert parse_app_args(["--tiny", "--loop", "compiled"]).loop == "compiled"
    monkeypatch.setenv("HF_DSPARK_LOOP", "fast")
    with pytest.raises(SystemExit):
        parse_app_args(["--tiny"])


def test_the_demo_s_default_loop_is_the_library_s_auto(tmp_path, monkeypatch):
    """`hf-dspark demo` with no --loop: the assisted loop, no cache reserved, and the page says how to set up the
    compiled loop; once its profile is saved here, the compiled loop (its forward a stand-in), a cache reserved,
    and the race runs on it, greedy-identical to plain."""
    from hf_dspark import DSparkDrafter
    from hf_dspark.cli.demo import parse_app_args
    from hf_dspark.decoding import loop
    from hf_dspark.decoding.profile import DeviceProfile, profile_key, profile_path
    from hf_dspark.demo.models import DemoModels, tiny_target, use_loop

    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_DSPARK_LOOP", raising=False)
    monkeypatch.setattr(loop, "_compiled_forward", lambda m, most: m.forward)
    assert parse_app_args(["--tiny"]).loop == "auto"
    t = tiny_target(40)
    d = DSparkDrafter.from_target(t, num_hidden_layers=1, markov_rank=8, mask_token_id=2)
    models = DemoModels(t, None, {"Markov": d, "none": None}, "tiny")
    use_loop(models, "auto", 100)
    assert d.options.loop == "auto" and "_dspark_static_cache" not in t.__dict__
    assert "decoding loop: auto: assisted" in models.info[-1] and "hf-dspark profile --dtype float32" in models.info[-1]
    key = profile_key(t, d, "compiled")
    DeviceProfile(key, verify_time=[1.0] * 8, draft_time=0.1, rollback_time=0.0, cache_len=8, warmup=0,
                  repeats=1).save(profile_path(key))
    use_loop(models, "auto", 100)
    assert models.info[-1].startswith("decoding loop: auto: compiled") and "_dspark_static_cache" in t.__dict__
    ids = torch.tensor([[5, 6, 7, 8]])
    dspark, plain = race(t, {"input_ids": ids}, {"max_new_tokens": 12, "do_sample": False}, d, "all", ngram=False)
    assert dspark.error is None and torch.equal(dspark.output, plain.output) and dspark.stats.loop == "compiled"
