"""The bar a training run must beat: simulated τ of a drafter (default: the shipped one) on the validation split
of a run's data, with the run's own anchors (the numbers `hf-dspark train` logs every --eval-every steps).

    OMP_NUM_THREADS=1 .venv/bin/python research/val_tau.py runs/smollm2-markov [--drafter DIR]
"""

import argparse
import json
from pathlib import Path

import torch

from hf_dspark.io.loading import load_default_drafter, load_default_target
from hf_dspark import DSparkDrafter
from hf_dspark.training.plan import load_records
from hf_dspark.training.trainer import TrainConfig, validation_tau

ap = argparse.ArgumentParser()
ap.add_argument("run", help="a training run's folder (its train_config.json names the data and the split)")
ap.add_argument("--drafter", default=None)
args = ap.parse_args()
torch.set_num_threads(1)
cfg = TrainConfig(**json.loads((Path(args.run) / "train_config.json").read_text()))
model, _ = load_default_target(dtype=torch.float32)
dr = DSparkDrafter.from_pretrained(args.drafter, target=model) if args.drafter else load_default_drafter(model)
print(json.dumps({"drafter": args.drafter or "shipped", "data": cfg.data, "val_size": cfg.val_size,
                  **validation_tau(dr.float().eval(), load_records(cfg.data, cfg.max_length), cfg)}))
