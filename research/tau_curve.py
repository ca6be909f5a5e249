"""The training record as users want to see it: validation τ (simulated, T = 1 and greedy) against the training
spent, in steps of 8 answers × 64 blocks (a next stage, `init_from`, continues its parent's curve). A step's
seconds depend on the CPU and on whether features are cached (docs/training.md); the legend gives each run's
trainer wall-hours on one thread, summed over its sessions from `elapsed_s` (each process restarts it at 0), so
they include time a run sat paused (SIGSTOP) during quiet benchmarks.

    .venv/bin/python research/tau_curve.py runs/smollm2-markov runs/smollm2-markov-2 runs/smollm2-dflash \
        -o docs/results/tau_curve.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def curve(run: Path) -> tuple[list[float], list[float], list[float], list[int]]:
    """metrics.jsonl → (hours, τ T=1, τ greedy, step) at every evaluation."""
    hours, t1, greedy, steps = [], [], [], []
    total, last = 0.0, 0.0
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "elapsed_s" in rec:
            e = rec["elapsed_s"]
            total += e - last if e >= last else e  # a new trainer process starts its clock at 0
            last = e
        if "tau_t1" in rec:
            hours.append(total / 3600)
            t1.append(rec["tau_t1"])
            greedy.append(rec["tau_greedy"])
            steps.append(rec["step"])
    return hours, t1, greedy, steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    ends: dict[str, float] = {}
    for run in map(Path, args.runs):
        cfg = json.loads((run / "train_config.json").read_text())
        parent = Path(cfg["init_from"]).parent.as_posix() if cfg.get("init_from") else None
        offset = ends.get(parent, 0)
        hours, t1, greedy, steps = curve(run)
        x = [s + offset for s in steps]
        ends[run.as_posix()] = x[-1]
        label = f"{run.name}: {cfg['head']} head, {steps[-1]} steps, {hours[-1]:.1f} h"
        for ax, tau in zip(axes, (t1, greedy)):
            ax.plot(x, tau, "o-", ms=3, label=label)
        print(f"{run}: {len(steps)} evaluations, last step {steps[-1]} at {hours[-1]:.2f} trainer-hours: "
              f"τ T=1 {t1[-1]:.3f}, greedy {greedy[-1]:.3f}")
    for ax, title in zip(axes, ("T = 1", "greedy")):
        ax.set_title(f"validation τ ({title}), 64 held-out answers, γ = 7")
        ax.set_xlabel("training steps (8 answers × 64 blocks of γ each)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("simulated τ (tokens per round)")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
