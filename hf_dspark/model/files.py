"""Where a checkpoint's files are, in a local folder or a Hub repository: its weights are `model.safetensors` or
the shards its index names (never pickles). The one weight-file listing of the package."""

from __future__ import annotations

import json
from pathlib import Path

from transformers.utils import cached_file

WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
HUB_KWARGS = ("revision", "cache_dir", "token", "local_files_only", "force_download", "subfolder")


class CheckpointFilesError(ValueError):
    """A checkpoint without its weight files (no model.safetensors, or shards its index names are missing)."""


def hub_kwargs(kwargs: dict) -> dict:
    return {k: kwargs[k] for k in HUB_KWARGS if kwargs.get(k) is not None}


def resolve(path, filename: str, kwargs: dict) -> Path | None:
    """A file of a local folder or a Hub repo (cache only when HF_HUB_OFFLINE); None if it does not exist."""
    local = Path(str(path))
    if local.is_dir():
        f = local / kwargs.get("subfolder", "") / filename
        return f if f.is_file() else None
    try:
        found = cached_file(str(path), filename, _raise_exceptions_for_missing_entries=False, **hub_kwargs(kwargs))
    except OSError:
        return None
    return Path(found) if found else None


def index_shards(index: Path) -> list[str]:
    """The shard file names a weights index (`model.safetensors.index.json`) maps its tensors to, sorted."""
    return sorted(set(json.loads(Path(index).read_text())["weight_map"].values()))


def weight_files(path, **kwargs) -> list[Path]:
    """`model.safetensors`, or the shards named by `model.safetensors.index.json`. Never pickles."""
    single = resolve(path, WEIGHTS, kwargs)
    if single is not None:
        return [single]
    index = resolve(path, INDEX, kwargs)
    if index is None:
        raise CheckpointFilesError(f"{path}: no {WEIGHTS} and no {INDEX} (weights are read from safetensors only)")
    shards = index_shards(index)
    files = [resolve(path, s, kwargs) for s in shards]
    missing = [s for s, f in zip(shards, files) if f is None]
    if missing:
        raise CheckpointFilesError(f"{path}: shards named in {INDEX} are missing: {missing}")
    return files
