"""Sequential temperature scaling (STS) of the confidence head, behind `hf-dspark calibrate`.

From rounds of real, fixed-length speculative decoding on held-out prompts we take, per drafted position k, the raw
confidence logit z_k and the prefix-survival label y_k = 1[first k drafts all accepted]. A grid search first picks
one shared (T, b) for every position, minimising the summed log loss of the cumulative predictions â_k = Π_{i≤k}
σ(z_i / T + b) under a weak prior at (1, 0); then position by position (k = 1..γ, earlier positions fixed) it picks
T_k, and a bias b_k, minimising the log loss of â_k = Π_{i≤k} σ(z_i / T_i + b_i) against y_k, within bounds (T in
[0.5, 4], |b| ≤ 1.5) and under a prior centred on the shared map (`POSITION_PRIOR`). The positions' maps fitted each
on its own wandered (T from 0.64 to 1.32 on the shipped drafter's greedy rounds) on the few rounds that reach the
later positions with mid-range scores, and a set whose rounds sit there (GSM8K's, where more drafts survive) read
those maps' noise as miscalibration. The log loss is a proper score, smooth in (T, b); ECE, which an earlier fit
minimised, is a 20-bin histogram statistic that a few hundred rounds let a fit drive into a grid corner (T = 0.26, b
= +2 at one position) that did not hold on other prompts. ECE is what we report. The bias is ours, not the paper's:
the head's label is the T = 1 survival of drafts on the training answers' contexts, and where a call's law differs
(greedy; T = 1 on the noisier contexts its own samples make) the head is off by a shift, which a temperature,
stretching logits around 0, cannot undo (research/record/benchmarks.md). Both maps are monotone, so the ranking of
scores (AUROC) at each position is unchanged.

Shapes: R rounds, γ positions. `z`, `y`, `valid` are [R, γ]; `valid` marks positions that were verified
and not past an accepted stop (those carry no label).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..decoding.options import DecodingOptions
from ..io.prompts import chat_inputs
from ..model.config import calibration_entries
from .data import answer_prompts, check_excluded, done_ids, is_holdout, prompt_of

GRID = np.exp(np.linspace(math.log(0.5), math.log(4.0), 121))  # 1 is on it
BIAS_GRID = np.linspace(-1.5, 1.5, 61)  # logit shifts; 0 is on it, so the fit can keep plain temperature scaling
PRIOR = 0.5  # std of the Gaussian prior on the shared map's log T and b: worth a few rounds, it settles flat directions
# std of each position's log T_k and b_k around the shared map. Picked by 4-fold cross-validation (log loss on the
# held-out folds) on the shipped drafter's 3,534 greedy calibration rounds, where 0.1-0.25 and no such prior scored
# within noise of one another (research/record/training-runs.md, "A shared map and a prior around it").
POSITION_PRIOR = 0.15


def ece(pred: np.ndarray, label: np.ndarray, bins: int = 20) -> float:
    """Expected calibration error: 20 equal-width bins on [0, 1], Σ (n_bin/N)·|mean pred − mean label|."""
    pred, label = np.asarray(pred, dtype=np.float64), np.asarray(label, dtype=np.float64)
    if pred.size == 0:
        return float("nan")
    idx = np.minimum((pred * bins).astype(int), bins - 1)
    gap = np.bincount(idx, weights=pred - label, minlength=bins)  # Σ (pred − label) per bin = n_bin·(mean gap)
    return float(np.abs(gap).sum() / pred.size)


def ece_floor(pred: np.ndarray, draws: int = 50, seed: int = 0) -> float:
    """The ECE a perfectly calibrated predictor would show on these predictions: mean ECE over `draws` label sets
    drawn from Bernoulli(pred). ECE is biased upwards by sampling noise (each bin's observed rate is a mean of
    n_bin coins, ~sqrt(p(1-p)/n_bin) off), so a measured ECE near this floor says the sample cannot tell the
    predictor from a calibrated one; only the excess over it is miscalibration."""
    pred = np.asarray(pred, dtype=np.float64)
    if pred.size == 0:
        return float("nan")
    rng = np.random.default_rng(seed)
    return float(np.mean([ece(pred, rng.random(pred.shape) < pred) for _ in range(draws)]))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def cumulative(z: np.ndarray, temps, biases=None) -> np.ndarray:
    """[R, γ] raw logits → â [R, γ] = running product of σ(z_k / T_k + b_k), in float64 (biases default 0)."""
    return np.cumprod(_sigmoid(_scaled(z, temps, biases)), axis=1)


def _scaled(z, temps, biases=None) -> np.ndarray:
    z = np.asarray(z, np.float64)
    b = np.zeros(z.shape[-1]) if biases is None else np.asarray(biases, np.float64)
    return z / np.asarray(temps, np.float64) + b


def log_loss(a: np.ndarray, label: np.ndarray) -> np.ndarray:
    """Elementwise binary log loss of predicted survival `a` against 0/1 `label` (same shapes)."""
    eps = 1e-12
    return -(label * np.log(a + eps) + (1 - label) * np.log1p(-a + eps))


def fit_shared(z: np.ndarray, y: np.ndarray, valid: np.ndarray, grid: np.ndarray = GRID,
               bias_grid: np.ndarray | None = BIAS_GRID, prior: float = PRIOR) -> tuple[float, float]:
    """One (T, b) on the grids for every position: the summed log loss of every labelled â_k = Π_{i≤k} σ(z_i / T +
    b) plus ½·((ln T / prior)² + (b / prior)²). bias_grid None: b = 0."""
    z, y, valid = np.asarray(z, np.float64), np.asarray(y, np.float64), np.asarray(valid, bool)
    b_grid = np.zeros(1) if bias_grid is None else np.asarray(bias_grid, np.float64)
    best = (np.inf, 1.0, 0.0)
    for t in np.asarray(grid, np.float64):
        a = np.cumprod(_sigmoid(z[None] / t + b_grid[:, None, None]), axis=-1)  # [nB, R, γ]
        loss = (log_loss(a, y) * valid).sum((1, 2)) + 0.5 * ((math.log(t) / prior) ** 2 + (b_grid / prior) ** 2)
        j = int(np.argmin(loss))
        if loss[j] < best[0]:
            best = (float(loss[j]), float(t), float(b_grid[j]))
    return best[1], best[2]


def fit_sts(z: np.ndarray, y: np.ndarray, valid: np.ndarray, grid: np.ndarray = GRID,
            bias_grid: np.ndarray | None = BIAS_GRID, prior: float = PRIOR,
            position_prior: float | None = POSITION_PRIOR,
            centre: tuple[float, float] | None = None) -> tuple[list[float], list[float]]:
    """Sequential temperature scaling → ([γ] temperatures, [γ] biases): per position, the (T, b) on the grids that
    minimise the summed log loss of â_k plus ½·(((ln T − ln T̄) / σ)² + ((b − b̄) / σ)²), (T̄, b̄) = `fit_shared` and
    σ = position_prior (None: every position on its own, centred on (1, 0) with σ = prior, as fits did before the
    shared map). `centre`: (T̄, b̄) when the caller has fitted it already. bias_grid None: temperatures only (biases
    0, the paper's STS). A position with no labelled rounds takes the centre."""
    z, y, valid = np.asarray(z, np.float64), np.asarray(y, np.float64), np.asarray(valid, bool)
    gamma = z.shape[1]
    t_grid = np.asarray(grid, np.float64)
    b_grid = np.zeros(1) if bias_grid is None else np.asarray(bias_grid, np.float64)
    if position_prior is None:
        (t0, b0), sigma = (1.0, 0.0), prior
    else:
        (t0, b0), sigma = centre or fit_shared(z, y, valid, t_grid, bias_grid, prior), position_prior
    penalty = 0.5 * (((np.log(t_grid) - math.log(t0))[:, None] / sigma) ** 2
                     + ((b_grid - b0)[None, :] / sigma) ** 2)  # [nT, nB]
    temps: list[float] = []
    biases: list[float] = []
    prefix = np.ones(z.shape[0])
    for k in range(gamma):
        v = valid[:, k]
        t_best, b_best = t0, b0
        if v.any():
            a = prefix[v] * _sigmoid(z[v, k][None, None, :] / t_grid[:, None, None] + b_grid[None, :, None])
            loss = log_loss(a, y[v, k]).sum(-1) + penalty  # [nT, nB]
            i, j = np.unravel_index(np.argmin(loss), loss.shape)
            t_best, b_best = float(t_grid[i]), float(b_grid[j])
        temps.append(t_best)
        biases.append(b_best)
        prefix = prefix * _sigmoid(z[:, k] / t_best + b_best)
    return temps, biases


def ece_per_position(z, y, valid, temps, biases=None) -> list[float]:
    a = cumulative(z, temps, biases)
    return [ece(a[valid[:, k], k], y[valid[:, k], k]) for k in range(a.shape[1])]


def ece_floor_per_position(z, valid, temps, biases=None) -> list[float]:
    """[γ] ece_floor of the cumulative predictions at each position (what a calibrated head would measure here)."""
    a = cumulative(z, temps, biases)
    return [ece_floor(a[valid[:, k], k]) for k in range(a.shape[1])]


def rounds_to_arrays(rounds, block_size: int, temps, biases=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DSparkStats.rounds → z, y, valid [R, γ]. Round.confidence holds σ(z/T + b) with the drafter's scaling at
    decoding time (`temps`, `biases`), so z = T·(logit(c) − b). A round without a bonus token ended on a stop or the
    length limit: its positions past the accepted ones carry no label and are dropped."""
    R = len(rounds)
    z, y, valid = np.zeros((R, block_size)), np.zeros((R, block_size)), np.zeros((R, block_size), bool)
    eps = 1e-7
    for i, r in enumerate(rounds):
        c = np.clip(np.asarray(r.confidence[:block_size], np.float64), eps, 1 - eps)
        n = min(len(c), r.verified)
        b = np.zeros(len(c)) if biases is None else np.asarray(biases[: len(c)], np.float64)
        z[i, : len(c)] = np.asarray(temps[: len(c)]) * (np.log(c / (1 - c)) - b)
        last = n if r.committed > r.accepted else min(n, r.accepted)
        valid[i, :last] = True
        y[i, : r.accepted] = 1.0
    return z, y, valid


def reliability_plot(z, y, valid, before, after, path: str | Path, bins: int = 20) -> None:
    """before/after: the scalings compared, each (temperatures [γ], biases [γ] or None)."""
    # A bare Figure (no pyplot): works headless and leaves the caller's backend alone (a notebook's inline one).
    from matplotlib.figure import Figure

    gamma = z.shape[1]
    fig = Figure(figsize=(2.6 * gamma, 2.9))
    axes = fig.subplots(1, gamma, sharey=True)
    axes = np.atleast_1d(axes)
    for k, ax in enumerate(axes):
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
        for (temps, biases), name, color in ((before, "before", "tab:red"), (after, "after", "tab:blue")):
            a = cumulative(z, temps, biases)[valid[:, k], k]
            lab = y[valid[:, k], k]
            idx = np.minimum((a * bins).astype(int), bins - 1)
            xs = [a[idx == b].mean() for b in range(bins) if (idx == b).any()]
            ys = [lab[idx == b].mean() for b in range(bins) if (idx == b).any()]
            ax.plot(xs, ys, "o-", ms=3, color=color, label=f"{name} ECE {ece(a, lab):.3f}")
        ax.set_title(f"position {k + 1}")
        ax.set_xlabel("predicted prefix survival")
        ax.legend(fontsize=6, loc="upper left")
    axes[0].set_ylabel("observed prefix survival")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---- collecting rounds ---------------------------------------------------------------------------------
def collect_rounds(model, tok, drafter, prompts: list[str], max_new_tokens: int, temperature: float, seed: int = 0):
    """Fixed-length speculative decoding (full γ verified every round, drafter rounds only: the drafter's own
    options are not used: this call's are "all", no n-gram drafts) → all rounds of all prompts."""
    rounds = []
    torch.manual_seed(seed)
    sampling = ({"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0} if temperature > 0
                else {"do_sample": False})
    every = DecodingOptions("all", ngram_drafts=False)
    for p in tqdm(prompts, desc="calibration prompts"):
        model.generate(**chat_inputs(tok, p, model.device), assistant_model=drafter, dspark_options=every,
                       max_new_tokens=max_new_tokens, **sampling)
        rounds.extend(drafter.last_stats.rounds)
    return rounds


def holdout_prompts(files: list[str], exclude_data: list[str], limit: int, seed: int, eval_files=(),
                    holdout: bool = False, per_file: int | None = None) -> list[str]:
    """Prompts from `files` whose ids are not in any `exclude_data` answers (training data), shuffled and cut.

    holdout: only the 1-in-20 prompts the answer job never answers (`data.is_holdout`); per_file: take N from each
    file instead of `limit` from the pooled shuffle, so every source (code too) is in the mix in a known share."""
    used = {prompt_of(i) for f in exclude_data for i in done_ids(f)}
    pools = [[p for p in answer_prompts(f) if p["id"] not in used and (not holdout or is_holdout(p["id"]))]
             for f in files]
    check_excluded([p for pool in pools for p in pool], list(eval_files))
    if per_file is not None:
        for pool in pools:
            random.Random(seed).shuffle(pool)
        return [p["prompt"] for pool in pools for p in pool[:per_file]]
    prompts = [p for pool in pools for p in pool]
    random.Random(seed).shuffle(prompts)
    return [p["prompt"] for p in prompts[:limit]]


def calibrate(drafter, rounds, temperature: float, plot: str | Path | None = None, bias: bool = True) -> dict:
    """Fit STS on `rounds` (collected sampling at `temperature`, 0 = greedy; bias=False: temperatures only) and
    write the fitted scaling and the measured prefix survival into drafter.config as its calibration entry for that
    temperature (replacing an earlier one there; entries at other temperatures stay: the draft gate's prior and the
    confidences' scale at each); the top-level `confidence_temperatures` become these temperatures too. Returns
    the report."""
    gamma = drafter.config.block_size
    old = drafter.config.confidence_scaling_at(temperature)  # what scaled the rounds' confidences
    z, y, valid = rounds_to_arrays(rounds, gamma, *old)
    raw = ([1.0] * gamma, None)
    bias_grid = BIAS_GRID if bias else None
    shared = fit_shared(z, y, valid, bias_grid=bias_grid)  # the centre of the positions' prior, reported too
    temps, biases = fit_sts(z, y, valid, bias_grid=bias_grid, centre=shared)
    report = {
        "rounds": len(rounds),
        "labelled_per_position": valid.sum(0).tolist(),
        "prefix_survival_rate": [float(y[valid[:, k], k].mean()) if valid[:, k].any() else None for k in range(gamma)],
        "ece_before": ece_per_position(z, y, valid, *raw),
        "ece_after": ece_per_position(z, y, valid, temps, biases),
        "ece_floor_after": ece_floor_per_position(z, valid, temps, biases),
        "temperatures": temps,
        "biases": biases,
        "shared_map": {"temperature": shared[0], "bias": shared[1], "position_prior": POSITION_PRIOR},
    }
    prefix, low = [], 1.0
    for rate in report["prefix_survival_rate"]:  # a position nobody reached counts as never surviving
        # rates come from slightly different rounds: keep them monotone
        low = min(low, rate if rate is not None else 0.0)
        prefix.append(low)
    entry = {"temperature": float(temperature), "confidence_temperatures": temps, "confidence_biases": biases,
             "prefix_survival": prefix}
    others = [c for c in calibration_entries(drafter.config.calibration, drafter.config.confidence_temperatures) or []
              if abs(c["temperature"] - float(temperature)) > 1e-6]
    drafter.config.confidence_temperatures = temps
    drafter.config.calibration = calibration_entries(others + [entry], temps)
    if plot:
        reliability_plot(z, y, valid, raw, (temps, biases), plot)
    return report
