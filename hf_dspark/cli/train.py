"""`hf-dspark train`: train a DSpark drafter (training/trainer.py; runs under `accelerate launch` too)."""

from __future__ import annotations

from pathlib import Path

from ..io.loading import resolve_dtype
from ..model.heads import HEADS
from ..training import checkpoint
from ..training.trainer import TrainConfig, train
from . import common


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a DSpark drafter (runs under `accelerate launch` too)")
    p.add_argument("data", help="JSONL from `hf-dspark data`")
    p.add_argument("-o", "--output-dir", required=True, help="checkpoints (<dir>/drafter), state and metrics")
    common.add_target(p)
    p.add_argument("--head", default="markov", choices=list(HEADS), help="none = DFlash ablation")
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--taps", type=int, nargs="+", default=None, help="tapped target layers (default: DFlash rule)")
    p.add_argument("--markov-rank", type=int, default=64)
    p.add_argument("--block-size", type=int, default=7)
    p.add_argument("--mask-token-id", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=8, help="global sequences per step")
    p.add_argument("--num-anchors", type=int, default=64, help="blocks per sequence per step")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--max-steps", type=int, default=None,
                   help="planned total steps (default: --epochs over the data); another total on a resume re-plans "
                        "the rest: cosine from the current learning rate to 0 at the new total")
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--val-size", type=int, default=32)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--cache-dir", default=None, help="cache target features on disk (small runs, several epochs)")
    p.add_argument("--seed", type=int, default=0)
    common.add_threads(p, default=None)
    p.add_argument("--time-limit", type=float, default=None, help="minutes; stop early (saving) when reached")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"],
                   help="bf16: features from a bf16 target and the drafter step under bf16 autocast (CPUs with "
                   "native bf16, GPUs); auto: bf16 where the device has native bf16 (io.loading.auto_dtype), else "
                   "fp32. A run may resume under another precision (another machine); it is logged with every step")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="train (and draft) on the N most frequent response tokens of the data (+ EOS) only: "
                   "q = 0 outside them, as when drafting; fixed at the run's start")
    p.add_argument("--warm-start", type=int, nargs="+", default=None, metavar="LAYER",
                   help="initialise drafter layer i from target layer LAYER_i (e.g. the last ones: -2 -1)")
    p.add_argument("--init-from", default=None, metavar="DRAFTER",
                   help="start from this drafter folder's weights and draft vocabulary (same shape), e.g. to continue "
                   "a finished run on more data under a new schedule")
    p.add_argument("--same-data-as", default=None, metavar="RUN",
                   help="train on the batches and draft vocabulary of the run in folder RUN (same data, seed and "
                   "batch settings required): an ablation that differs from it in the head alone")
    p.set_defaults(func=main)


def main(args) -> int:
    if args.precision == "auto":
        import torch

        args.precision = "bf16" if resolve_dtype("auto", "cuda" if torch.cuda.is_available() else "cpu") \
            == torch.bfloat16 else "fp32"
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k in TrainConfig.__dataclass_fields__})
    res = train(cfg)
    print(f"final validation: {res['final_val']}; drafter saved to {checkpoint.latest(Path(cfg.output_dir)) / 'drafter'}")
    return 0
