"""`hf-dspark generate`, the README's main job, end to end on a tiny target folder: it prints both speeds, the
verify policy's rounds and the identity check, and returns 0 (greedy, fp32) — for every kind of verify policy."""

import pytest
import torch

from hf_dspark import DSparkDrafter, cli
from hf_dspark.cli import generate
from hf_dspark.io import loading
from tests.conftest import tiny_target


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path / "cache"))  # the scheduler's profile is measured there


@pytest.fixture
def folders(tmp_path, char_tokenizer):
    model = tiny_target()
    model.save_pretrained(tmp_path / "target")
    char_tokenizer.save_pretrained(tmp_path / "target")
    torch.manual_seed(0)
    DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 2]).save_pretrained(tmp_path / "drafter")
    return tmp_path / "target", tmp_path / "drafter"


@pytest.mark.parametrize("verify, ngram", [("scheduler", False), ("all", False), ("2", False),
                                            ("threshold:0.5", False), ("scheduler", True)])
def test_generate_prints_speeds_rounds_and_identity(folders, capsys, verify, ngram):
    target, drafter = folders
    argv = ["generate", "hello there hello there", "--target", str(target), "--drafter", str(drafter),
            "--max-new-tokens", "12", "--device", "cpu", "--threads", "1", "--verify", verify]
    assert cli.main(argv + ["--ngram-drafts"] * ngram) == 0
    out = capsys.readouterr().out
    assert "plain generate :" in out and "DSpark         :" in out and "tok/s" in out
    assert f"verify policy: {verify}{' + n-gram drafts' if ngram else ''};" in out and " drafted, " in out
    assert (" 0 of them n-gram drafts" in out) != ngram
    assert "greedy output identical to plain generate: True" in out


@pytest.mark.parametrize("near_tie", [True, False])
def test_bf16_mismatch_is_judged_by_a_float32_referee(folders, capsys, monkeypatch, near_tie):
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
    argv = ["generate", "hello there", "--target", str(target), "--drafter", str(drafter), "--max-new-tokens", "8",
            "--device", "cpu", "--threads", "1", "--dtype", "bf16"]
    assert cli.main(argv) == (0 if near_tie else 1)
    out = capsys.readouterr().out
    assert calls == [torch.bfloat16, torch.bfloat16] and seen["referee"] == torch.float32
    assert "greedy output identical to plain generate: False" in out
    assert ("a near-tie; every DSpark token from there is within 0.010" in out) == near_tie
    assert ("NOT explained by near-ties: max_gap 3.000" in out) != near_tie


def test_float32_mismatch_fails_without_a_referee(folders, capsys, monkeypatch):
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
    argv = ["generate", "hello there", "--target", str(target), "--drafter", str(drafter), "--max-new-tokens", "8",
            "--device", "cpu", "--threads", "1"]
    assert cli.main(argv) == 1
    assert len(loads) == 1  # the target itself, no referee
    assert "greedy output identical to plain generate: False" in capsys.readouterr().out
