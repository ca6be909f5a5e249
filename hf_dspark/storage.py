"""Where hf_dspark stores what it converts and measures: `$HF_DSPARK_CACHE`, else ~/.cache/hf_dspark."""

from __future__ import annotations

import os
from pathlib import Path


def storage_dir() -> Path:
    """Where converted models and device profiles live (`$HF_DSPARK_CACHE`, else ~/.cache/hf_dspark)."""
    root = os.environ.get("HF_DSPARK_CACHE") or Path.home() / ".cache" / "hf_dspark"
    return Path(root)
