"""Cost of one drafter training step per trained block: the old recipe (float32, 16 anchors per sequence) against
bf16 features + bf16 autocast with 64 anchors, and both at 64 anchors on the 8,192-token draft vocabulary
(`--draft-vocab`), on the same 8 SmolLM2 answers, alternating in one process.

    .venv/bin/python research/train_step_cost.py --data data/smollm2_train_responses.jsonl --repeats 3

Prints seconds per step split into features / drafter forward+backward, and seconds per trained block.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from hf_dspark.decoding.machine import cpu_info
from hf_dspark.io.loading import load_default_target
from hf_dspark.training.anchors import sample_blocks
from hf_dspark.training.features import FeatureSource
from hf_dspark.training.losses import LossWeights, combine, weighted_sums
from hf_dspark.training.objective import DraftObjective
from hf_dspark.training.plan import anchor_generators, collate, frequent_tokens, load_records
from hf_dspark.training.trainer import TrainConfig, build_drafter

RECIPES = {"fp32 x16 anchors": ("fp32", 16, None), "bf16 x64 anchors": ("bf16", 64, None),
           "fp32 x64 anchors, draft vocab 8192": ("fp32", 64, 8192), "bf16 x64 anchors, draft vocab 8192": ("bf16", 64, 8192)}


def step(target, objective, recs, precision: str, anchors: int, vocab: list[int] | None = None) -> dict:
    objective.drafter.set_draft_vocab(vocab)
    ids, mask, lengths, keys = collate(recs, 0)
    target.to(torch.bfloat16 if precision == "bf16" else torch.float32)
    t0 = time.perf_counter()
    f, last = FeatureSource(target, objective.drafter.config.target_layer_ids)(keys, ids, lengths)
    t1 = time.perf_counter()
    blocks = sample_blocks(ids, mask, lengths, anchors, 7, objective.drafter.config.mask_token_id,
                           anchor_generators(keys, 0, 0))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        terms = objective(f, last, blocks)
    sums, denom = weighted_sums(terms, terms["valid"], LossWeights().decay)
    combine({k: v / denom for k, v in sums.items()}, LossWeights()).backward()
    objective.zero_grad(set_to_none=True)
    t2 = time.perf_counter()
    n = int(blocks.keep.sum())
    return {"features_s": t1 - t0, "drafter_s": t2 - t1, "blocks": n, "s_per_block": (t2 - t0) / n}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fp32-only", action="store_true", help="skip the bf16 recipes (CPUs without native bf16)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = load_default_target(dtype=torch.float32)
    recs = load_records(args.data)[:8]
    objective = DraftObjective(build_drafter(target, TrainConfig(data="", output_dir="")).float().train())
    step(target, objective, recs, "fp32" if args.fp32_only else "bf16", 16)  # warm-up (oneDNN primitives, allocator)
    recipes = {k: v for k, v in RECIPES.items() if not args.fp32_only or v[0] == "fp32"}
    vocab = frequent_tokens(load_records(args.data), 8192, [target.generation_config.eos_token_id])
    runs = {name: [] for name in recipes}
    for _ in range(args.repeats):
        for name, (precision, anchors, v) in recipes.items():
            runs[name].append(step(target, objective, recs, precision, anchors, vocab if v else None))
    base = min(r["s_per_block"] for r in runs["fp32 x16 anchors"])
    cpu = cpu_info()
    out = {"cpu": f"{cpu['name']} (family {cpu['family']}, model {cpu['model']})", "threads": args.threads, "sequences": len(recs),
           "tokens": sum(len(r["ids"]) for r in recs)}
    for name, rs in runs.items():
        best = min(rs, key=lambda r: r["s_per_block"])
        out[name] = best
        print(f"{name}: features {best['features_s']:.2f} s, drafter fwd+bwd {best['drafter_s']:.2f} s, "
              f"{best['blocks']} blocks, {best['s_per_block'] * 1000:.1f} ms/block "
              f"({base / best['s_per_block']:.2f}x cheaper than fp32 x16)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
