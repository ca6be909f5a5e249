"""The learning-rate schedule of a run: linear warmup then cosine to 0, planned once for the whole run, and
re-planned from the saved step when a resumed run is given another total (--max-steps)."""

from __future__ import annotations

import math


def lr_lambda(total: int, warmup_frac: float = 0.04, replans: list[dict] = ()):
    """Linear warmup, then cosine to 0 at `total`. Each re-plan {"at": step, "total": new total} (a resumed run
    given another --max-steps) continues from the factor it had reached at `at`, cosine to 0 at its new total: no
    jump in the learning rate, and the steps before `at` keep the schedule they were trained under."""
    warmup = max(1, round(warmup_frac * total))

    def f(t: int) -> float:
        if t < warmup:
            return (t + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (t - warmup) / max(1, total - warmup))))

    for r in replans:
        f = _replanned(f, r["at"], r["total"])
    f.total = replans[-1]["total"] if replans else total  # the planned length, saved with the run
    f.replans = list(replans)
    return f


def _replanned(before, at: int, total: int):
    start = before(at)

    def f(t: int) -> float:
        if t < at:
            return before(t)
        return start * 0.5 * (1 + math.cos(math.pi * min(1.0, (t - at) / max(1, total - at))))

    return f


def plan_schedule(saved: dict | None, max_steps: int | None, default: int, log) -> tuple[int, list[dict]]:
    """(first planned total, re-plans) for a run: a new run plans `max_steps` or `default`; a resume keeps the
    saved plan (its progress.json: so a stream that grew since does not re-plan an epoch-based run), or re-plans
    from the saved step when --max-steps names another total."""
    if saved is None:
        return max_steps or default, []
    replans = list(saved.get("replans", []))
    first = replans[0]["from"] if replans else saved["total"]
    if max_steps and max_steps != saved["total"]:
        if max_steps <= saved["step"]:
            raise ValueError(f"--max-steps {max_steps} is not past the saved step {saved['step']} "
                             f"(planned total {saved['total']}); give a larger total or omit --max-steps")
        replans.append({"at": saved["step"], "from": saved["total"], "total": max_steps})
        log(f"re-planned at step {saved['step']}: {saved['total']} → {max_steps} steps (cosine from the current "
            "learning rate to 0 at the new total)")
    return first, replans
