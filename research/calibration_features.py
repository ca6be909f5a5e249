"""Would the drafter's own confidence in its draft, or the answer's acceptance so far, calibrate the survival
better across prompt sets? (issue 34, ECE)

The confidence head's calibration is fitted on held-out prompts of all eight training sources and measured on the
GSM8K and MBPP evaluation answers, where one greedy cell stays above 0.03 (the head is off by a shift that differs
per set). This study replays the greedy rounds of both (verify all, the drafter's own chain, as `generate` drafts)
and fits per position, sequentially as `fit_sts` does, three maps of the prefix survival:

- "sts": σ(z_k / T_k + b_k) on the grid, every position fitted on its own (`hf-dspark calibrate` before the
  shared map); "sts shared": the same around a shared map (`fit_sts`'s default since);
- "sts+q": σ(a_k z_k + c_k m_k + b_k), m_k = log max_x q_k(x), the drafter's log-probability of its own greedy
  draft (a function of q_k's distribution, not of a sampled token: it depends on the drafts before k only, as the
  head's own input does);
- "q": σ(c_k m_k + b_k), the drafter's probability alone;
- "sts+hist": σ(a_k z_k + c_k h + b_k), h the log-odds of the drafts accepted so far in this answer among those
  verified with a label (A accepted of L labelled in the earlier rounds, shrunk to the fit set's pooled rate p0
  by `HIST_PRIOR` rounds' worth: logit((A + 16 p0) / (L + 16)) − logit(p0)): known before the round is verified,
  so a scheduler reading it would stay lossless, and it differs per prompt set as the survival does.

Prints ECE per position (20 bins) on the fit set and on each evaluation set. Greedy only (the failing cell's mode).

    .venv/bin/python research/calibration_features.py --drafter hf_dspark/assets/smollm2-135m-dspark \\
        --eval out/eval_targets/gsm8k out/eval_targets/mbpp --output out/calibration_features.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

import hf_dspark.eval.replay as rp
from hf_dspark import DSparkDrafter
from hf_dspark.io.loading import load_target
from hf_dspark.io.prompts import chat_ids
from hf_dspark.training.calibration import cumulative, ece, fit_sts, holdout_prompts
from hf_dspark.training.data import eos_ids, read_answers
from hf_dspark.training.sampler import Job, answer

P = "data/prompts/"
SOURCES = [P + f"train/{s}.jsonl" for s in ("gsm8k_train", "alpaca_5000", "mbpp_train", "math_train",
                                             "math_prm800k_extra", "python_functions", "oasst_prompts",
                                             "awesome_chatgpt_prompts")]
_MAXQ: list[torch.Tensor] = []


def _chains_with_maxq(dr, base, h, prev, vocab, w2):
    """replay._chains, also recording log max q along the greedy draft's own chain ([C, γ])."""
    W2 = (dr.markov_head.W2.weight if w2 is None else w2) if dr.markov_head is not None else None
    z, own, c_tf, c_own, m = [], [], [], [], []
    st_tf = st_own = None
    p_own = prev[:, 0]
    for k in range(base.shape[1]):
        e_tf = e_own = None
        z_tf = z_own = base[:, k]
        if dr.markov_head is not None:
            u, e_tf, st_tf = dr.markov_head.pre_bias(prev[:, k], h[:, k], st_tf)
            z_tf = z_tf + (u @ W2.T).float()
            u, e_own, st_own = dr.markov_head.pre_bias(p_own, h[:, k], st_own)
            z_own = z_own + (u @ W2.T).float()
        top = z_own.argmax(-1)
        m.append(z_own.max(-1).values - torch.logsumexp(z_own, -1))
        c_tf.append(dr.confidence_head(h[:, k], e_tf).float())
        c_own.append(dr.confidence_head(h[:, k], e_own).float())
        z.append(z_tf)
        own.append(top)
        p_own = vocab[top] if vocab is not None else top
    _MAXQ.append(torch.stack(m, 1).cpu())
    return torch.stack(z, 1), torch.stack(own, 1), torch.stack(c_tf, 1), torch.stack(c_own, 1)


HIST_PRIOR = 16


def rounds_arrays(drafter, records, max_new: int):
    """Greedy replay of `records` → z, m, y, valid [R, γ] (raw confidence logit, log max q, prefix survival) and
    hist [R, 2] (drafts accepted, drafts labelled in the answer's earlier rounds)."""
    g = drafter.config.block_size
    Z, M, Y, V, H = [], [], [], [], []
    rp._chains = _chains_with_maxq
    for rec in records:
        Pn, R = len(rec["prompt_ids"]), len(rec["response_ids"])
        if R < 2:
            continue
        _MAXQ.clear()
        s = rp.slot_scores(drafter, rec["prompt_ids"], rec["response_ids"])
        mq = torch.cat(_MAXQ)
        match, conf = s["match"], s["conf_greedy"]
        accepted = labelled = 0
        for r in rp.walk(lambda a, j: bool(match[a - Pn, j]), Pn, Pn + R, max_new, g,
                         lambda a, n: [float(a - Pn)] * n):
            if not r.confidence:
                continue
            i, n = int(r.confidence[0]), r.drafted
            z, m, y, v = np.zeros(g), np.zeros(g), np.zeros(g), np.zeros(g, bool)
            z[:n], m[:n] = conf[i, :n].numpy(), mq[i, :n].numpy()
            y[: r.accepted] = 1
            v[: n if r.committed > r.accepted else min(n, r.accepted)] = True
            Z.append(z), M.append(m), Y.append(y), V.append(v), H.append((accepted, labelled))
            accepted += r.accepted
            labelled += r.accepted + (r.accepted < r.verified)  # the first rejected draft is labelled too
    return np.array(Z), np.array(M), np.array(Y), np.array(V), np.array(H, np.float64)


def _sig(x):
    return 1 / (1 + np.exp(-x))


def fit_logistic(X, y, valid, l2: float = 1.0, iters: int = 400):
    """Per position k (sequentially, earlier positions fixed): w_k minimising the log loss of â_k = â_{k-1}·σ(X_k·w_k)
    plus ½·l2·|w_k − w0|² (w0: the plain map: 1 on the first feature, 0 elsewhere), by Newton-free gradient descent
    on the convex-in-practice objective. X [R, γ, F] (a bias column included by the caller)."""
    R, g, F = X.shape
    ws, prefix = [], np.ones(R)
    for k in range(g):
        v = valid[:, k]
        w0 = np.zeros(F)
        w0[0] = 1.0
        w = w0.copy()
        x, lab, pre = X[v, k], y[v, k], prefix[v]
        if v.any():
            wt = torch.tensor(w, requires_grad=True)
            xt, lt, pt = map(torch.tensor, (x, lab, pre))
            opt = torch.optim.LBFGS([wt], max_iter=iters, line_search_fn="strong_wolfe")

            def closure():
                opt.zero_grad()
                a = (pt * torch.sigmoid(xt @ wt)).clamp(1e-9, 1 - 1e-9)
                ce = -(lt * a.log() + (1 - lt) * (1 - a).log()).sum()
                loss = ce + 0.5 * l2 * ((wt - torch.tensor(w0)) ** 2).sum()
                loss.backward()
                return loss
            opt.step(closure)
            w = wt.detach().numpy()
        ws.append(w)
        prefix = prefix * _sig(X[:, k] @ w)
    return ws


def predict(X, ws):
    return np.cumprod(np.stack([_sig(X[:, k] @ w) for k, w in enumerate(ws)], 1), 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--eval", nargs="+", required=True, help="answer folders (`hf-dspark data` output)")
    ap.add_argument("--per-file", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--output", default=None)
    ap.add_argument("--save-rounds", default=None, help=".npz of every set's z, m, y, valid, hist (for "
                    "research/calibration_prior.py)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_target(None, torch.float32, "cpu")
    drafter = DSparkDrafter.from_pretrained(args.drafter, target=model).to(dtype=torch.float32)
    prompts = holdout_prompts(SOURCES, ["data/answers"], 0, 0, [P + "eval/gsm8k.jsonl", P + "eval/mbpp.jsonl"],
                              holdout=True, per_file=args.per_file)
    jobs = [Job(str(i), chat_ids(tok, p), temperature=0.0) for i, p in enumerate(prompts)]
    fit_recs = [{"prompt_ids": j.prompt_ids, "response_ids": r}
                for j, r in answer(model, jobs, eos_ids(model), args.max_new_tokens, slots=64)]
    sets = {"fit": rounds_arrays(drafter, fit_recs, args.max_new_tokens)}
    for path in args.eval:
        recs = [r for r in read_answers(path) if float(r.get("temperature", 0)) == 0]
        sets[path.rstrip("/").split("/")[-1]] = rounds_arrays(drafter, recs, 256)
    z, m, y, valid, hist = sets["fit"]
    if args.save_rounds:
        np.savez(args.save_rounds, **{f"{name}_{part}": a for name, arrays in sets.items()
                                      for part, a in zip(("z", "m", "y", "valid", "hist"), arrays)})
    temps, biases = fit_sts(z, y, valid, position_prior=None)
    shared = fit_sts(z, y, valid)
    p0 = hist[:, 0].sum() / hist[:, 1].sum()
    logit = lambda p: np.log(p / (1 - p))  # noqa: E731
    one = lambda a: np.ones_like(a)  # noqa: E731

    def h(z, hist):  # [R, γ]: the answer's acceptance so far, the same for every position of a round
        return np.repeat((logit((hist[:, 0] + HIST_PRIOR * p0) / (hist[:, 1] + HIST_PRIOR)) - logit(p0))[:, None],
                         z.shape[1], 1)
    feats = {"sts+q": lambda z, m, hist: np.stack([z, m, one(z)], -1),
             "q": lambda z, m, hist: np.stack([m, one(m)], -1),
             "sts+hist": lambda z, m, hist: np.stack([z, h(z, hist), one(z)], -1)}
    models = {name: fit_logistic(f(z, m, hist), y, valid) for name, f in feats.items()}
    out = {"rounds": {k: len(v[0]) for k, v in sets.items()}, "ece": {}, "history_rate": {}}
    for name, (zs, ms, ys, vs, hs) in sets.items():
        out["history_rate"][name] = float(hs[:, 0].sum() / hs[:, 1].sum())
        preds = {"raw": predict(np.stack([zs, one(zs)], -1), [np.array([1.0, 0.0])] * zs.shape[1]),
                 "sts": cumulative(zs, temps, biases), "sts shared": cumulative(zs, *shared)}
        preds.update({k: predict(feats[k](zs, ms, hs), ws) for k, ws in models.items()})
        for k, a in preds.items():
            cells = [ece(a[vs[:, j], j], ys[vs[:, j], j]) for j in range(zs.shape[1])]
            out["ece"].setdefault(name, {})[k] = cells
            print(f"{name:6s} {k:10s} worst {max(cells):.3f}  " + " ".join(f"{c:.3f}" for c in cells), flush=True)
    out["weights"] = {k: [w.tolist() for w in ws] for k, ws in models.items()}
    out["sts"] = {"temperatures": temps, "biases": biases}
    out["sts shared"] = {"temperatures": shared[0], "biases": shared[1]}
    if args.output:
        with open(args.output, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
