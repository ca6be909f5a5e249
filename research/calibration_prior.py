"""How strongly should each position's calibration map be tied to a shared one? (issue 34, ECE)

`fit_sts` fits one (T, b) for every position, then each position's (T_k, b_k) under a Gaussian prior of std σ
(in ln T and b) around it. This sweeps σ on replayed greedy rounds (`research/calibration_features.py
--save-rounds`): 4-fold cross-validation on the fit set (the 64 held-out training prompts; folds are contiguous
runs of rounds, so whole answers but at most one fall in one fold), log loss and worst ECE cell out of fold, and,
for the record only, the worst ECE cell on each evaluation set with the map fitted on the whole fit set.
σ "none" is every position on its own (centred on (1, 0) with std 0.5, the fit before the shared map).

    .venv/bin/python research/calibration_prior.py out/calibration_rounds.npz --output prior.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from hf_dspark.training.calibration import cumulative, ece, fit_sts, log_loss

SIGMAS = [None, 0.5, 0.25, 0.2, 0.15, 0.1, 0.05, 0.02]


def mean_log_loss(z, y, valid, temps, biases) -> float:
    return float((log_loss(cumulative(z, temps, biases), y) * valid).sum() / valid.sum())


def worst_cell(a, y, valid) -> float:
    return max(ece(a[valid[:, k], k], y[valid[:, k], k]) for k in range(a.shape[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rounds", help=".npz from research/calibration_features.py --save-rounds")
    ap.add_argument("--folds", type=int, default=4)
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    d = np.load(args.rounds)
    names = sorted({k.rsplit("_", 1)[0] for k in d.files if k.endswith("_z")}, key=lambda n: n != "fit")
    sets = {n: (d[f"{n}_z"], d[f"{n}_y"], d[f"{n}_valid"].astype(bool)) for n in names}
    z, y, valid = sets["fit"]
    folds = np.array_split(np.arange(len(z)), args.folds)
    rows = []
    for sigma in SIGMAS:
        out_of_fold, losses = np.zeros_like(z), []
        for f, test in enumerate(folds):
            train = np.concatenate([g for j, g in enumerate(folds) if j != f])
            temps, biases = fit_sts(z[train], y[train], valid[train], position_prior=sigma)
            out_of_fold[test] = cumulative(z[test], temps, biases)
            losses.append(mean_log_loss(z[test], y[test], valid[test], temps, biases) * valid[test].sum())
        temps, biases = fit_sts(z, y, valid, position_prior=sigma)
        row = {"sigma": sigma, "cv_log_loss": float(sum(losses) / valid.sum()),
               "cv_worst_ece": worst_cell(out_of_fold, y, valid), "temperatures": temps, "biases": biases,
               "worst_ece": {n: worst_cell(cumulative(zs, temps, biases), ys, vs) for n, (zs, ys, vs) in sets.items()}}
        rows.append(row)
        print(f"σ {str(sigma):5s} CV log loss {row['cv_log_loss']:.5f}, CV worst ECE {row['cv_worst_ece']:.3f} | "
              + " ".join(f"{n} {e:.3f}" for n, e in row["worst_ece"].items())
              + " | T " + " ".join(f"{t:.2f}" for t in temps) + " b " + " ".join(f"{b:+.2f}" for b in biases),
              flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"folds": args.folds, "rounds": {n: len(s[0]) for n, s in sets.items()}, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
