"""Where hf_dspark stores what it converts and measures (`$HF_DSPARK_CACHE`, else ~/.cache/hf_dspark), and how it
writes a file there that others may read or write at the same time."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def storage_dir() -> Path:
    """Where converted models, device profiles and compiled graphs live (`$HF_DSPARK_CACHE`, else ~/.cache/hf_dspark)."""
    root = os.environ.get("HF_DSPARK_CACHE") or Path.home() / ".cache" / "hf_dspark"
    return Path(root)


def write_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file of this writer's own in the same folder, then an atomic
    replace: a concurrent reader never sees half a file, and writers of one path at once (two processes measuring
    the same setup, parallel test workers) never share a temporary."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=path.name + ".", suffix=".tmp", delete=False) as f:
        f.write(text)
    Path(f.name).replace(path)
    return path
