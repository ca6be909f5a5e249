"""A run's record for people: `<out>/metrics.jsonl`, one JSON line per logged step. It is appended to as the run
goes, and cut back to the resumed checkpoint's step when a run restarts, so a killed run's steps after its last
checkpoint are redone, not doubled."""

from __future__ import annotations

import json
import os
from pathlib import Path

FILE = "metrics.jsonl"


def _lines(out: Path) -> list[tuple[int, str]]:
    """(step, line) of each readable record in `<out>/metrics.jsonl` (a line cut by a kill is skipped)."""
    path = Path(out) / FILE
    records = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            records.append((int(json.loads(line)["step"]), line))
        except (ValueError, KeyError, TypeError):
            pass
    return records


def logged_steps(out: Path) -> list[int]:
    """The steps `<out>/metrics.jsonl` holds a record of."""
    return [step for step, _ in _lines(out)]


def keep_until(out: Path, step: int) -> None:
    """Rewrite metrics.jsonl with the records up to `step` only (0 for a fresh run)."""
    path = Path(out) / FILE
    if path.is_file():
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for s, line in _lines(out) if s <= step))
        os.replace(tmp, path)


def append(out: Path, record: dict) -> None:
    with open(Path(out) / FILE, "a") as f:
        f.write(json.dumps(record) + "\n")
