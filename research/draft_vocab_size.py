"""Would a larger draft vocabulary pay? The drafter's LM head is the target's own (frozen) rows for its draft
vocabulary and the Markov head's W2 covers the whole vocabulary, so a vocabulary can be widened on trained weights
without training anything new. This measures, for one drafter's weights:

- the share of each source's answer tokens outside each vocabulary (a label there can never be drafted);
- simulated validation τ per source (T = 1 / greedy; the trainer's own split and anchors) under each vocabulary;
- the drafter's round (7 drafts on a 300-token context, decoding.profile.time_drafter) under each, in ms.

    OMP_NUM_THREADS=1 .venv/bin/python research/draft_vocab_size.py runs/smollm2-markov-3/checkpoint-1053/drafter \
        --sizes 8192 16384 32768 0 --out docs/results/draft_vocab_size.json

Sizes are the N most frequent response tokens of the training split (+ EOS), recounted over every source; 0 = the
full vocabulary; "saved" is the vocabulary the drafter carries. Features are read from (and written to) the
trainer's feature cache.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import torch

from hf_dspark import DSparkDrafter
from hf_dspark.decoding.profile import time_drafter
from hf_dspark.io.loading import load_target
from hf_dspark.training.data import eos_ids, source_of
from hf_dspark.training.features import FeatureSource
from hf_dspark.training.objective import DraftObjective
from hf_dspark.training.plan import frequent_tokens, load_records, split
from hf_dspark.training.trainer import TrainConfig, evaluate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("drafter")
    ap.add_argument("--data", default="data/answers")
    ap.add_argument("--sizes", type=int, nargs="+", default=[8192, 16384, 32768, 0])
    ap.add_argument("--val-size", type=int, default=32)
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache/hf_dspark/features/smollm2-taps-1-14-27"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = load_target(None, torch.float32, "cpu")
    target.requires_grad_(False)
    drafter = DSparkDrafter.from_pretrained(args.drafter, target=target).float().eval()
    cfg = TrainConfig(data=args.data, output_dir="", block_size=drafter.config.block_size, val_size=args.val_size,
                      mask_token_id=drafter.config.mask_token_id)
    train_recs, val = split(load_records(args.data, cfg.max_length), args.val_size)
    target.to(torch.bfloat16)  # as the trainer evaluates: bf16 features under bf16 autocast
    feats = FeatureSource(target, drafter.config.target_layer_ids, args.cache_dir)
    pad_id = target.generation_config.pad_token_id or 0
    vocabs = {"saved": drafter.draft_vocab.tolist()}
    for n in args.sizes:
        vocabs[str(n) if n else "full"] = frequent_tokens(train_recs, n, eos_ids(target)) if n else None
    tokens: dict[str, Counter] = {}
    for r in train_recs + val:
        tokens.setdefault(source_of(r["id"]), Counter()).update(r["ids"][r["n_prompt"]:])
    out = {}
    for name, vocab in vocabs.items():
        drafter.set_draft_vocab(vocab)
        inside = set(vocab) if vocab is not None else None
        outside = {s: (0.0 if inside is None else sum(c for t, c in cnt.items() if t not in inside) / sum(cnt.values()))
                   for s, cnt in tokens.items()}
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            tau = evaluate(DraftObjective(drafter), feats, val, cfg, pad_id)
        eval_s = time.perf_counter() - t0
        target.to(torch.float32)
        drafter_ms = 1e3 * time_drafter(drafter, drafter.config.block_size, 300)
        target.to(torch.bfloat16)
        out[name] = {"size": len(vocab) if vocab is not None else drafter.config.vocab_size, "outside": outside,
                     "tau": tau, "drafter_round_ms_float32": drafter_ms, "eval_s": eval_s}
        print(name, out[name]["size"], f"round {drafter_ms:.2f} ms", f"τ {tau['tau_t1']:.3f}/{tau['tau_greedy']:.3f}",
              " ".join(f"{k.split('/')[1]} {v:.2f}/{tau['tau_greedy/' + k.split('/')[1]]:.2f} out {outside[k.split('/')[1]]:.1%}"
                       for k, v in tau.items() if k.startswith("tau_t1/")), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
