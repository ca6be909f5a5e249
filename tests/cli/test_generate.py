"""`hf-dspark generate`, the README's main job, end to end on a tiny target folder: it streams the answer first,
then prints both speeds, what it measured, the verify policy's rounds and the identity sentence, and returns 0
(greedy, fp32) — for every kind of verify policy and the defaults; the order it times in (profile, warm-up,
interleaved runs) with a fake clock."""

import re

import pytest
import torch

from hf_dspark import cli
from hf_dspark.cli import generate
from hf_dspark.decoding import options
from hf_dspark.io import loading


@pytest.fixture
def one_prompt(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("hello there\n")
    return path


@pytest.mark.parametrize("verify, ngram", [(None, None), ("scheduler", False), ("all", False), ("2", False),
                                            ("threshold:0.5", False), ("scheduler", True)])
def test_generate_prints_speeds_rounds_and_identity(folders, capsys, verify, ngram):
    """verify/ngram None: the defaults (auto + n-gram drafts); the timing set: the prompt + the built-in six."""
    target, drafter = folders
    argv = ["generate", "hello there hello there", "--target", str(target), "--drafter", str(drafter),
            "--max-new-tokens", "12", "--device", "cpu", "--threads", "1", "--dtype", "float32"]
    argv += [] if verify is None else ["--verify", verify, "--ngram-drafts" if ngram else "--no-ngram-drafts"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    out = captured.out
    answer, _, report = out.partition("-" * 72)
    assert answer.strip() and "plain generate :" not in answer  # the streamed answer comes before any timing
    assert re.search(r"\[12 tokens in [\d.]+ s = [\d.]+ tok/s with DSpark; τ = [\d.]+", captured.err), captured.err
    assert "plain generate :" in report and "DSpark         :" in report and "tok/s" in report
    n = 1 + len(generate.PROMPTS)
    assert f"measured: {n} prompt(s) × up to 12 new tokens, 1 timed repeat(s)" in out
    assert "1 warm-up run(s) per method (the built-in math/code/chat set + your prompt)" in out
    shown = verify or "auto"
    ngram = True if ngram is None else ngram
    assert f"verify policy: {shown}{' + n-gram drafts' if ngram else ''};" in out and " drafted, " in out
    assert "; loop: assisted (auto)" in out  # the default loop, resolved: nothing set up here
    if not ngram:
        assert " 0 of them n-gram drafts" in out
    assert f"greedy output identical to plain generate on all {n} prompts." in out


def test_generate_runs_on_dspark_own_loop(folders, capsys):
    target, drafter = folders
    argv = ["generate", "hello there hello there", "--target", str(target), "--drafter", str(drafter),
            "--max-new-tokens", "12", "--device", "cpu", "--threads", "1", "--dtype", "float32", "--loop", "static"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "; loop: static" in out  # the loop that ran the timed calls
    assert f"greedy output identical to plain generate on all {1 + len(generate.PROMPTS)} prompts." in out


def test_timing_warms_up_after_the_profile_then_times_interleaved(folders, monkeypatch):
    """The order a first run must keep, with a fake clock and a call log (no timed assertion): the device profile,
    then one untimed run of each method, then only timed runs (each between two clock reads), plain and DSpark
    alternating which goes first; the seconds reported are the clock's around timed runs only."""
    from hf_dspark.decoding.profile import DeviceProfile, profile_key

    target, drafter_dir = folders
    model, tok, drafter, _ = loading.load_target_and_drafter(str(target), str(drafter_dir), torch.float32, "cpu")
    log, cached = [], []

    def get_profile(target, drafter, measure=True, loop="assisted"):  # measured on first use, then cached (as the real one)
        if not cached:
            log.append("profile")
            cached.append(DeviceProfile(key=profile_key(target, drafter), verify_time=[1.0, 1.1, 1.2, 1.3, 1.4],
                                        draft_time=0.0, rollback_time=0.0, cache_len=0, warmup=0, repeats=0))
        return cached[0]

    monkeypatch.setattr(options, "get_profile", get_profile)
    real_generate = model.generate

    def logged_generate(*a, **kw):
        log.append("dspark" if "assistant_model" in kw else "plain")
        return real_generate(*a, **kw)

    monkeypatch.setattr(model, "generate", logged_generate)
    ticks = iter(range(1000))

    def clock():
        log.append("tick")
        return float(next(ticks))

    prompts = [tok(t, return_tensors="pt") for t in ("hello there", "a b c", "abc abc")]
    res = generate.time_methods(model, drafter, prompts, dict(max_new_tokens=6, do_sample=False), repeats=2,
                                warmup=1, clock=clock)
    assert log[:3] == ["profile", "plain", "dspark"]
    timed = log[3:]
    assert len(timed) == 3 * 2 * 2 * 3  # prompts × repeats × methods × (tick, run, tick)
    runs = [timed[i:i + 3] for i in range(0, len(timed), 3)]
    assert all(r[0] == r[2] == "tick" and r[1] in ("plain", "dspark") for r in runs)
    order = [r[1] for r in runs]
    assert order[:4] == ["plain", "dspark", "dspark", "plain"]  # alternating which method goes first
    assert order.count("plain") == order.count("dspark") == 6
    assert res["plain"]["seconds"] == res["dspark"]["seconds"] == 6.0  # 1 fake second per timed run, none for warm-ups
    assert res["runs"] == 6 and len(res["outputs"]) == 3
    assert all(torch.equal(a, b) for a, b in res["outputs"])


def test_busy_machine_is_named_next_to_the_ratio(folders, capsys, monkeypatch, one_prompt):
    target, drafter = folders
    monkeypatch.setattr(generate.os, "getloadavg", lambda: (5.0, 1.0, 1.0))
    assert "machine busy: load 5.0 > 2 threads" in generate.busy_note(2)
    argv = ["generate", "--prompts", str(one_prompt), "--target", str(target), "--drafter", str(drafter),
            "--max-new-tokens", "6", "--device", "cpu", "--threads", "1", "--dtype", "float32", "--verify", "all"]
    assert cli.main(argv) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("DSpark "))
    assert "x)  (machine busy: load 5.0 > 1 threads" in line
    monkeypatch.setattr(generate.os, "getloadavg", lambda: (0.5, 1.0, 1.0))
    assert generate.busy_note(2) == ""


def test_dtype_auto_names_its_choice_and_why(folders, capsys, monkeypatch, one_prompt):
    """--dtype auto times a prefill and decode steps of the target in both dtypes (really: the tiny target), once,
    and prints the choice with both figures."""
    target, drafter = folders
    asked = []
    cost = loading.decode_cost
    monkeypatch.setattr(loading, "decode_cost", lambda m, d, **kw: asked.append(d) or cost(m, d, **kw))
    argv = ["generate", "--prompts", str(one_prompt), "--target", str(target), "--drafter", str(drafter),
            "--max-new-tokens", "4", "--device", "cpu", "--threads", "1", "--verify", "all"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().err
    assert re.search(r"\[(float32|bfloat16) \(auto: a 256-token prompt and 256 new tokens take [\d.e-]+ s in bf16", out), out
    assert sorted(map(str, asked)) == ["torch.bfloat16", "torch.float32"]


@pytest.mark.parametrize("near_tie", [True, False])
def test_bf16_mismatch_is_judged_by_a_float32_referee(folders, capsys, monkeypatch, near_tie, one_prompt):
    """bf16: a greedy difference from plain passes only if the float32 referee calls it a near-tie (the judging
    itself is tested in test_bench.py); the referee is the target loaded again in float32."""
    import hf_dspark.eval.referee as referee

    target, drafter = folders
    real_generate, calls, seen = generate._timed_generate, [], {}

    def corrupt_spec(model, inputs, **kw):  # the DSpark run (with assistant_model) loses its last token
        out, secs = real_generate(model, inputs, **kw)
        if "assistant_model" in kw:
            out = out.clone()
            out[0, -1] = (out[0, -1] + 1) % 64
        calls.append(model.dtype)
        return out, secs

    def judge(plain, spec, prompt_len, referee, tolerance=0.5):
        seen["referee"] = referee.dtype
        return {"position": spec.shape[1] - 1 - prompt_len, "near_tie": near_tie, "max_gap": 0.01 if near_tie else 3.0}

    monkeypatch.setattr(generate, "_timed_generate", corrupt_spec)
    monkeypatch.setattr(referee, "judge_divergence", judge)
    argv = ["generate", "--prompts", str(one_prompt), "--target", str(target), "--drafter", str(drafter),
            "--max-new-tokens", "8", "--device", "cpu", "--threads", "1", "--dtype", "bfloat16"]
    assert cli.main(argv) == (0 if near_tie else 1)
    out = capsys.readouterr().out
    assert calls == [torch.bfloat16, torch.bfloat16] and seen["referee"] == torch.float32
    assert ("identical to plain generate on 0 of 1 prompts; the other 1 differ only at bfloat16 near-ties (every "
            "token within 0.010 logits of the float32 target's best)" in out) == near_tie
    assert ("differs from plain generate on prompts [0] beyond near-ties" in out) != near_tie


def test_float32_mismatch_fails_without_a_referee(folders, capsys, monkeypatch, one_prompt):
    """float32: any greedy difference is a failure (exit 1), and no referee is loaded to excuse it."""
    target, drafter = folders
    real_generate, loads = generate._timed_generate, []
    real_load = loading.load_target

    def corrupt_spec(model, inputs, **kw):
        out, secs = real_generate(model, inputs, **kw)
        if "assistant_model" in kw:
            out = out.clone()
            out[0, -1] = (out[0, -1] + 1) % 64
        return out, secs

    monkeypatch.setattr(generate, "_timed_generate", corrupt_spec)
    monkeypatch.setattr(loading, "load_target", lambda *a: loads.append(a) or real_load(*a))
    argv = ["generate", "--prompts", str(one_prompt), "--target", str(target), "--drafter", str(drafter),
            "--max-new-tokens", "8", "--device", "cpu", "--threads", "1", "--dtype", "float32"]
    assert cli.main(argv) == 1
    assert len(loads) == 1  # the target itself, no referee
    assert "greedy output DIFFERS from plain generate on 1 of 1 prompts ([0]) in float32" in capsys.readouterr().out
