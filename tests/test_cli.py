"""`hf-dspark generate`, the README's main job, end to end on a tiny target folder: it prints both speeds, the
verify policy's rounds and the identity check, and returns 0 (greedy, fp32) — for every kind of verify policy."""

import pytest
import torch

from hf_dspark import DSparkDrafter, cli
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
