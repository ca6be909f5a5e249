"""A training run's resumable state on disk: safetensors and JSON only, written so that a kill loses nothing.

    <out>/checkpoint-<step>/drafter/         the drafter (float32 master weights; DSparkDrafter.from_pretrained)
    <out>/checkpoint-<step>/optimizer/       AdamW moments and the torch RNG as safetensors, optimizer.json
    <out>/checkpoint-<step>/progress.json    step, planned total, re-plans, the data plan's epochs
    <out>/checkpoint-<step>/train_config.json
    <out>/checkpoint-<step>/manifest.json    written last: the step, and every file's size and sha256

`slim` drops the AdamW moments and the RNG state of a published checkpoint (two thirds of its bytes) to store it
where space counts, e.g. in a repository between machines; a run resumed from it restarts the moments from zero
at its step (it says so), so it no longer matches an uninterrupted run exactly.

A save writes everything into `<out>/.checkpoint-<step>.partial/` and renames that folder into place only once
its manifest is written; earlier checkpoints are removed after that. A kill at any moment therefore leaves the
previous complete checkpoint (and at most a partial folder, which the next save removes). On resume the newest
checkpoint is verified against its manifest before anything is loaded; a damaged one is refused by name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch

PREFIX = "checkpoint-"


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed (missing, truncated or inconsistent files)."""


def latest(out: Path) -> Path | None:
    """The newest published checkpoint folder of a run, or None."""
    found = [p for p in Path(out).glob(PREFIX + "*") if p.is_dir() and p.name[len(PREFIX):].isdigit()]
    return max(found, key=lambda p: int(p.name[len(PREFIX):])) if found else None


def save(out: Path, step: int, drafter, optimizer, scheduler, epochs: list[dict], config: dict,
         max_shard_size: str | None = None) -> Path:
    """Write the run's state at `step` atomically (module docstring): `scheduler` runs a `schedule.lr_lambda`
    (its planned total and re-plans are saved), `epochs` are the data plan's; max_shard_size: split weight files at
    this size ("100MB"; None: transformers' default). Returns the checkpoint folder."""
    out = Path(out)
    plan = scheduler.lr_lambdas[0]
    progress = {"total": plan.total, "epochs": epochs, **({"replans": plan.replans} if plan.replans else {})}
    final, partial = out / f"{PREFIX}{step}", out / f".{PREFIX}{step}.partial"
    for leftover in out.glob(f".{PREFIX}*.partial"):  # an earlier save that was killed
        shutil.rmtree(leftover)
    partial.mkdir(parents=True)
    shard = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    _write_drafter(partial, drafter, shard)
    _write_optimizer(partial, optimizer, scheduler, step, shard)
    _write_json(partial / "progress.json", {"step": step, **progress})
    _write_json(partial / "train_config.json", config)
    _write_manifest(partial, step)
    _publish(partial, final)
    _prune(out, keep=final)
    return final


def _write_drafter(folder: Path, drafter, shard: dict) -> None:
    drafter.save_pretrained(folder / "drafter", **shard)


def _write_optimizer(folder: Path, optimizer, scheduler, step: int, shard: dict) -> None:
    from huggingface_hub import save_torch_state_dict

    sd = optimizer.state_dict()
    tensors = {f"{i}.{k}": v for i, st in sd["state"].items() for k, v in st.items()}
    tensors["torch_rng"] = torch.get_rng_state()
    (folder / "optimizer").mkdir()
    save_torch_state_dict(tensors, folder / "optimizer", filename_pattern="optimizer{suffix}.safetensors",
                          **shard)
    sched = {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
    _write_json(folder / "optimizer" / "optimizer.json", {"step": step, "param_groups": sd["param_groups"],
                                                         "scheduler": sched})


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1))


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_manifest(folder: Path, step: int) -> None:
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    for p in files:  # the data must be on disk before the manifest vouches for it
        with open(p, "rb") as f:
            os.fsync(f.fileno())
    _write_json(folder / "manifest.json", {"step": step, "files": _entries(folder, files)})


def _entries(folder: Path, files) -> dict:
    """A manifest's file list: each file's path in `folder`, size and sha256."""
    return {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": _digest(p)} for p in files}


def _publish(partial: Path, final: Path) -> None:
    if final.exists():  # the same step saved again (a resume that stopped at once): the new copy replaces it
        shutil.rmtree(final)
    os.replace(partial, final)


def _prune(out: Path, keep: Path) -> None:
    for old in Path(out).glob(PREFIX + "*"):
        if old != keep and old.is_dir():
            shutil.rmtree(old)


def slim(folder: Path) -> Path:
    """Drop the optimizer's tensors (moments, RNG) from the published checkpoint `folder`, keeping its weights,
    progress and schedule. The manifest is replaced first (marked "slim", listing what stays), then the tensors
    are deleted: a kill at any point leaves a checkpoint that verifies, slim or whole."""
    folder = Path(folder)
    step = verify(folder)["step"]
    moments = [p for p in (folder / "optimizer").iterdir() if p.name.endswith((".safetensors", ".safetensors.index.json"))]
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p not in moments and p.name != "manifest.json")
    tmp = folder / "manifest.json.partial"
    _write_json(tmp, {"step": step, "files": _entries(folder, files), "slim": True})
    os.replace(tmp, folder / "manifest.json")
    for p in moments:
        p.unlink()
    return folder


def is_slim(folder: Path) -> bool:
    return bool(json.loads((Path(folder) / "manifest.json").read_text()).get("slim"))


def verify(folder: Path) -> dict:
    """Check a checkpoint against its manifest → its progress.json; CheckpointError names what is wrong."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        files, step = manifest["files"], manifest["step"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{folder}: its manifest.json is missing or unreadable ({e})") from e
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path} is missing")
        if path.stat().st_size != entry["bytes"] or _digest(path) != entry["sha256"]:
            raise CheckpointError(f"{path} is damaged (its size or checksum differs from {folder}/manifest.json)")
    progress = json.loads((folder / "progress.json").read_text())
    optimizer = json.loads((folder / "optimizer" / "optimizer.json").read_text())
    if not progress["step"] == optimizer["step"] == step == int(folder.name[len(PREFIX):]):
        raise CheckpointError(f"{folder}: its parts record different steps (manifest {step}, progress "
                              f"{progress['step']}, optimizer {optimizer['step']})")
    return progress


def config_of(folder: Path) -> dict:
    return json.loads((Path(folder) / "train_config.json").read_text())


def load(folder: Path, optimizer, scheduler) -> None:
    """Restore the optimizer, the lr schedule and the torch RNG of a verified checkpoint (the drafter's weights
    are loaded by the caller, with the model's own `init_from`). A slim checkpoint restores the schedule and the
    optimizer's settings; its moments start from zero."""
    from safetensors.torch import load_file

    tensors = {}
    for shard in [] if is_slim(folder) else sorted((Path(folder) / "optimizer").glob("optimizer*.safetensors")):
        tensors.update(load_file(shard))
    meta = json.loads((Path(folder) / "optimizer" / "optimizer.json").read_text())
    state: dict[int, dict] = {}
    for key, v in tensors.items():
        if key != "torch_rng":
            i, name = key.split(".", 1)
            state.setdefault(int(i), {})[name] = v
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    scheduler.load_state_dict({**meta["scheduler"], "lr_lambdas": [None] * len(scheduler.lr_lambdas)})
    if "torch_rng" in tensors:
        torch.set_rng_state(tensors["torch_rng"])
