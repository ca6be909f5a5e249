"""Does capping the backbone to k + 1 slots (a static verify length k < γ − 1, or the scheduler's bound) cost
acceptance against DeepSpec's full γ-slot block truncated to k drafts? Greedy replay on the target's own plain
`generate` outputs (float32), the same anchors and rounds for both; paired bootstrap over prompts.

    OMP_NUM_THREADS=1 .venv/bin/python research/capped_blocks.py --prompts 30 --max-new-tokens 128 --check 1 \
        --out docs/results/capped_blocks_smollm2.json

--drafter DIR measures another drafter folder (default: the shipped one). --check N replays the first N prompts
of each set against real `generate(..., verify_policy=k)` round by round (what the product runs: capped).
--deepspec-prompts N repeats it for the same weights exported as a DeepSpec checkpoint and loaded back.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from hf_dspark.decoding.options import DecodingOptions
from hf_dspark.decoding.machine import cpu_info
from hf_dspark.eval.bench import load_prompts
from hf_dspark.io.prompts import chat_inputs
from hf_dspark.eval.replay import slot_scores, walk
from hf_dspark.io.loading import load_default_drafter, load_default_target
from hf_dspark.model import deepspec
from hf_dspark import DSparkDrafter


def rounds(scores: dict, P: int, R: int, max_new: int, k: int) -> list[tuple[int, int, int]]:
    m = scores["match"]
    return [(r.drafted, r.accepted, r.committed)
            for r in walk(lambda a, j: bool(m[a - P, j]), P, P + R, max_new, k)]


def pooled(per_prompt: list[list[tuple[int, int, int]]]) -> float:
    flat = [r for rs in per_prompt for r in rs]
    return sum(c for _, _, c in flat) / len(flat)


def bootstrap(full: list, capped: list, n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % interval of τ(capped) − τ(full), resampling prompts (pairs kept together)."""
    rng, idx, diffs = random.Random(seed), range(len(full)), []
    for _ in range(n):
        pick = [rng.choice(idx) for _ in idx]
        diffs.append(pooled([capped[i] for i in pick]) - pooled([full[i] for i in pick]))
    diffs.sort()
    return diffs[int(0.025 * n)], diffs[int(0.975 * n) - 1]


def measure(model, tok, dr, files: list[str], n: int, ks: list[int], max_new: int, check: int) -> dict:
    """τ full block vs capped for each k, pooled over the first `n` prompts of each file."""
    sets = {}
    for name in files:
        per = {k: {"full": [], "capped": []} for k in ks}
        checked = 0
        for i, (ds, text) in enumerate(load_prompts([name], n)):
            ids = chat_inputs(tok, text)["input_ids"]
            resp = model.generate(ids, do_sample=False, max_new_tokens=max_new)[0, ids.shape[1]:].tolist()
            P, R = ids.shape[1], len(resp)
            if R < 2:
                continue
            full = slot_scores(dr, ids[0].tolist(), resp)
            for k in ks:
                cap = slot_scores(dr, ids[0].tolist(), resp, slots=k + 1)
                per[k]["full"].append(rounds(full, P, R, max_new, k))
                per[k]["capped"].append(rounds(cap, P, R, max_new, k))
                if i < check:  # the replay of the capped block is what generate runs
                    dr.options = DecodingOptions(k, ngram_drafts=False)
                    out = model.generate(ids, assistant_model=dr, do_sample=False, max_new_tokens=max_new)
                    real = [(r.drafted, r.accepted, r.committed) for r in dr.last_stats.rounds]
                    if out[0, P:].tolist() != resp or real != per[k]["capped"][-1]:
                        raise SystemExit(f"{ds} prompt {i} k={k}: the capped replay differs from generate's rounds")
                    checked += 1
        res = sets[Path(name).stem] = {"checked_rounds_against_generate": checked}
        for k in ks:
            f, c = pooled(per[k]["full"]), pooled(per[k]["capped"])
            lo, hi = bootstrap(per[k]["full"], per[k]["capped"])
            res[f"k={k}"] = {"tau_full_block": f, "tau_capped": c, "diff": c - f, "ci95": [lo, hi],
                             "rounds": sum(map(len, per[k]["full"]))}
            print(f"{Path(name).stem} k={k}: τ full block {f:.3f} → capped {c:.3f} (Δ {c - f:+.3f}, "
                  f"95% CI [{lo:+.3f}, {hi:+.3f}])", flush=True)
    return sets


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--eval", nargs="+", default=["data/prompts/eval/gsm8k.jsonl", "data/prompts/eval/mbpp.jsonl"])
    ap.add_argument("--prompts", type=int, default=30)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 5])
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--check", type=int, default=1)
    ap.add_argument("--deepspec-prompts", type=int, default=0,
                    help="also measure the weights exported as a DeepSpec checkpoint and loaded back, on N prompts")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = load_default_target(dtype=torch.float32)
    dr = DSparkDrafter.from_pretrained(args.drafter, target=model) if args.drafter else load_default_drafter(model)
    g = dr.config.block_size
    if any(not 1 <= k < g - 1 for k in args.ks):
        raise SystemExit(f"--ks must be in [1, {g - 2}]: at k = γ − 1 both run the full block")
    t0, result = time.perf_counter(), {"cpu": cpu_info()["name"], "drafter": args.drafter or "shipped",
                                       "prompts": args.prompts, "max_new_tokens": args.max_new_tokens}
    result["sets"] = measure(model, tok, dr, args.eval, args.prompts, args.ks, args.max_new_tokens, args.check)
    if args.deepspec_prompts:  # the same weights as a DeepSpec-format checkpoint (full vocabulary), loaded back
        with tempfile.TemporaryDirectory() as tmp:
            deepspec.export(dr.set_draft_vocab(None), tmp)
            ds = DSparkDrafter.from_pretrained(tmp, target=model)
            assert ds.deepspec_source, "the export did not load as a DeepSpec checkpoint"
            print("DeepSpec-format checkpoint (the same weights, full vocabulary):")
            result["deepspec_format"] = measure(model, tok, ds, args.eval, args.deepspec_prompts, args.ks,
                                                args.max_new_tokens, 0)
    result["wall_s"] = time.perf_counter() - t0
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
