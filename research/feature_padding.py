"""The target's tapped features for a training batch: one padded, masked forward over the batch (the trainer
before 2026-12-02) against one unpadded forward per sequence (`FeatureSource` now), on random batches of 8
committed answers, alternating in one process, bf16 (the trainer's precision on a CPU with native bf16).

    OMP_NUM_THREADS=1 .venv/bin/python research/feature_padding.py --batches 4 --repeats 2

Prints seconds per batch for each and their ratio, and the largest difference of the features on real positions.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from hf_dspark.decoding.machine import cpu_info
from hf_dspark.io.loading import load_default_target
from hf_dspark.training.features import FeatureSource, target_features
from hf_dspark.training.plan import collate, load_records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/answers")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    target, _ = load_default_target(dtype=torch.float32)
    target.to(torch.bfloat16)
    recs = load_records(args.data, 512)
    random.seed(0)
    batches = [random.sample(recs, 8) for _ in range(args.batches)]
    source = FeatureSource(target, [1, 14, 27])
    padded_s = unpadded_s = 0.0
    worst = 0.0
    print(cpu_info())
    for b in batches:
        ids, _, lengths, keys = collate(b, 0)
        attn = (torch.arange(ids.shape[1])[None] < lengths[:, None]).long()  # as the trainer's padded forward had it
        t_pad = t_one = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            f_pad, _ = target_features(target, ids, attn, [1, 14, 27])
            t1 = time.perf_counter()
            f_one, _ = source(keys, ids, lengths)
            t2 = time.perf_counter()
            t_pad, t_one = min(t_pad, t1 - t0), min(t_one, t2 - t1)
        rel = max(float((f_pad[i, :L].float() - f_one[i, :L]).abs().max() / f_pad[i, :L].float().abs().max())
                  for i, L in enumerate(lengths.tolist()))
        worst = max(worst, rel)
        padded_s, unpadded_s = padded_s + t_pad, unpadded_s + t_one
        print(f"batch of {int(lengths.sum())} tokens padded to {8 * ids.shape[1]}: padded {t_pad:.2f} s, "
              f"per sequence {t_one:.2f} s ({t_pad / t_one:.2f}x)")
    print(f"total: padded {padded_s:.2f} s, per sequence {unpadded_s:.2f} s: {padded_s / unpadded_s:.2f}x; largest "
          f"feature difference relative to the row's largest value {worst:.1e}")


if __name__ == "__main__":
    main()
