"""training/checkpoint.py: a run killed before or after any phase of a save resumes as if uninterrupted; a damaged
checkpoint is refused by name and nothing is removed."""

import json
import re

import pytest
import torch

from hf_dspark.training import checkpoint
from hf_dspark.training.checkpoint import CheckpointError
from tests._tiny import target_records, tiny_target

torch.set_num_threads(1)


class Killed(BaseException):
    """What SIGKILL leaves: the process stops between two instructions, no handler runs."""


SAVE_PHASES = ["_write_drafter", "_write_optimizer", "_write_json", "_write_manifest", "_publish", "_prune"]


@pytest.mark.parametrize("phase", SAVE_PHASES)
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_kill_at_any_phase_of_a_save_loses_nothing(tmp_path, monkeypatch, phase, when):
    """The trainer is killed before or after each phase of the step-4 save (the step-2 one is complete): the
    resume equals the uninterrupted run's weights and metrics, from whichever checkpoint is complete."""
    from hf_dspark.training.trainer import TrainConfig, train

    t = tiny_target()
    recs = target_records(t, 16, resp_len=16)
    kw = {"data": "", "num_layers": 1, "markov_rank": 8, "batch_size": 4, "num_anchors": 4, "val_size": 4,
          "eval_every": 1, "save_every": 2, "lr": 3e-3, "max_steps": 6}
    whole = train(TrainConfig(output_dir=str(tmp_path / "whole"), **kw), target=t, records=recs)["drafter"]
    real = getattr(checkpoint, phase)

    def killing(*a, **k):
        if not any("checkpoint-4" in str(x) for x in (*a, *k.values())):  # the step-2 save completes
            return real(*a, **k)
        if when == "after":
            real(*a, **k)
        raise Killed

    monkeypatch.setattr(checkpoint, phase, killing)
    with pytest.raises(Killed):
        train(TrainConfig(output_dir=str(tmp_path / "cut"), **kw), target=t, records=recs)
    monkeypatch.setattr(checkpoint, phase, real)
    done = checkpoint.latest(tmp_path / "cut")
    assert done.name in ("checkpoint-2", "checkpoint-4"), done
    resumed = train(TrainConfig(output_dir=str(tmp_path / "cut"), **kw), target=t, records=recs)["drafter"]
    a, b = whole.state_dict(), resumed.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    steps = [json.loads(line)["step"] for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4, 5, 6]  # the killed run's steps after its checkpoint are redone, not doubled
    assert [p.name for p in (tmp_path / "cut").iterdir() if p.is_dir()] == ["checkpoint-6"]


@pytest.mark.parametrize("damage", ["truncate-progress", "truncate-weights", "delete-optimizer", "manifest"])
def test_a_damaged_checkpoint_is_refused_by_name_and_kept(tmp_path, damage):
    from hf_dspark.training.trainer import TrainConfig, train

    t = tiny_target()
    recs = target_records(t, 12, resp_len=16)
    cfg = TrainConfig(data="", output_dir=str(tmp_path / "run"), num_layers=1, markov_rank=8, batch_size=4,
                      num_anchors=4, val_size=4, eval_every=0, save_every=0, max_steps=2)
    train(cfg, target=t, records=recs)
    ckpt = checkpoint.latest(tmp_path / "run")
    target = {"truncate-progress": ckpt / "progress.json", "truncate-weights": ckpt / "drafter" / "model.safetensors",
              "delete-optimizer": ckpt / "optimizer" / "optimizer.json", "manifest": ckpt / "manifest.json"}[damage]
    if damage == "delete-optimizer":
        target.unlink()
    else:
        target.write_bytes(target.read_bytes()[:10])
    files = sorted(str(p) for p in (tmp_path / "run").rglob("*"))
    with pytest.raises(CheckpointError, match=re.escape(str(target.name if damage != "manifest" else "manifest.json"))):
        train(TrainConfig(**{**cfg.__dict__, "max_steps": 4}), target=t, records=recs)
    assert sorted(str(p) for p in (tmp_path / "run").rglob("*")) == files  # nothing removed


@pytest.mark.parametrize("killed_after", [None, "manifest", "one tensor file"])
def test_a_slim_checkpoint_resumes_with_fresh_moments_and_the_same_schedule(tmp_path, monkeypatch, killed_after,
                                                                            capsys):
    """slim keeps weights, progress and schedule and drops the moments; a kill while slimming leaves a checkpoint
    that resumes (slim once its manifest is replaced). The resumed run takes the uninterrupted run's learning rates
    and data; only the moments differ, so its weights do too."""
    from pathlib import Path

    from hf_dspark.training.trainer import TrainConfig, train

    t = tiny_target()
    recs = target_records(t, 16, resp_len=16)
    kw = {"data": "", "num_layers": 1, "markov_rank": 8, "batch_size": 4, "num_anchors": 4, "val_size": 4,
          "eval_every": 0, "save_every": 2, "lr": 3e-3, "max_steps": 4}
    whole = train(TrainConfig(output_dir=str(tmp_path / "whole"), **kw), target=t, records=recs)
    train(TrainConfig(output_dir=str(tmp_path / "cut"), time_limit=1e-9, **{**kw, "save_every": 0}), target=t,
          records=recs)
    ckpt = checkpoint.latest(tmp_path / "cut")
    full_bytes = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
    if killed_after is not None:
        real_unlink = Path.unlink

        def killing(self, *a, **k):
            real_unlink(self, *a, **k)
            raise Killed

        if killed_after == "manifest":
            monkeypatch.setattr(Path, "unlink", lambda self, *a, **k: (_ for _ in ()).throw(Killed()))
        else:
            monkeypatch.setattr(Path, "unlink", killing)
        with pytest.raises(Killed):
            checkpoint.slim(ckpt)
        monkeypatch.undo()
    else:
        checkpoint.slim(ckpt)
    assert checkpoint.is_slim(ckpt) and checkpoint.verify(ckpt)["step"] == 1
    if killed_after is None:
        assert not list((ckpt / "optimizer").glob("*.safetensors"))
        assert sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file()) < 0.5 * full_bytes
    capsys.readouterr()
    res = train(TrainConfig(output_dir=str(tmp_path / "cut"), **kw), target=t, records=recs)
    assert "a slim checkpoint: AdamW's moments restart from zero" in capsys.readouterr().out
    assert [h["lr"] for h in res["history"]] == pytest.approx([h["lr"] for h in whole["history"][1:]])
    a, b = whole["drafter"].state_dict(), res["drafter"].state_dict()
    assert not all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)  # the moments mattered: not an exact resume
