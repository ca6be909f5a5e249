"""Two training runs on the same batches (same data, seed, plan and mix; e.g. two arms from one checkpoint that
differ in the drafter's shape), compared step by step: the mean per-window difference of their training losses
(B − A), a paired measure far less noisy than validation τ, since both arms see the very same sequences and anchors.

    .venv/bin/python research/paired_runs.py runs/stage4-2layers runs/stage4-3layers --window 100
"""

import argparse
import json
import statistics
from pathlib import Path


def steps(run: str) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (Path(run) / "metrics.jsonl").read_text().splitlines())
            if "ce" in r}


ap = argparse.ArgumentParser()
ap.add_argument("a")
ap.add_argument("b")
ap.add_argument("--window", type=int, default=100)
args = ap.parse_args()
a, b = steps(args.a), steps(args.b)
common = sorted(a.keys() & b.keys())
print(f"steps | n | A ce | B − A: ce (± standard error) | l1 | loss   (A = {args.a}, B = {args.b})")
for lo in range(min(common, default=0), max(common, default=-1) + 1, args.window):
    s = [k for k in common if lo <= k < lo + args.window]
    if s:
        diff = {m: statistics.mean(b[k][m] - a[k][m] for k in s) for m in ("ce", "l1", "loss")}
        se = statistics.stdev(b[k]["ce"] - a[k]["ce"] for k in s) / len(s) ** 0.5 if len(s) > 1 else float("nan")
        print(f"{lo}-{s[-1]} | {len(s)} | {statistics.mean(a[k]['ce'] for k in s):.3f} | {diff['ce']:+.4f} ± {se:.4f} | "
              f"{diff['l1']:+.4f} | {diff['loss']:+.4f}")
