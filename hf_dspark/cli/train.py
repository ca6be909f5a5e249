"""`hf-dspark train`: train a DSpark drafter (training/trainer.py; runs under `accelerate launch` too)."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import common

HEAD_CHOICES = ("markov", "gated", "rnn", "none")  # model.heads.HEADS' names (kept here: --help imports no torch)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a DSpark drafter (runs under `accelerate launch` too)")
    p.add_argument("data", help="answers from `hf-dspark data` (a shard folder or JSONL)")
    common.add_output(p, "run folder: checkpoint-<step>/ (resumable state, drafter/ inside) and metrics.jsonl",
                      required=True)
    common.add_target(p)
    p.add_argument("--head", default="markov", choices=HEAD_CHOICES, help="sequential head; none = the DFlash ablation")
    p.add_argument("--num-layers", type=common.positive, default=2, help="drafter decoder layers")
    p.add_argument("--taps", type=int, nargs="+", default=None,
                   help="tapped target layers (default: spread over the target's depth)")
    p.add_argument("--markov-rank", type=common.positive, default=64, help="rank of the Markov head's bias")
    p.add_argument("--block-size", type=common.positive, default=7, help="drafts per block (γ)")
    p.add_argument("--mask-token-id", type=int, default=None,
                   help="token id filling the block's draft slots (default: an id the target never generates)")
    p.add_argument("--batch-size", type=common.positive, default=8, help="global sequences per optimizer step")
    p.add_argument("--num-anchors", type=common.positive, default=64, help="blocks per sequence per step")
    p.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (AdamW, warmup then cosine)")
    p.add_argument("--epochs", type=float, default=1.0, help="planned epochs when --max-steps is not given")
    p.add_argument("--max-steps", type=common.positive, default=None,
                   help="planned total steps (default: --epochs over the data); another total on a resume re-plans "
                        "the rest: cosine from the current learning rate to 0 at the new total")
    p.add_argument("--max-length", type=common.positive, default=512, help="tokens per training sequence")
    p.add_argument("--val-size", type=common.non_negative, default=32,
                   help="validation answers per source, i.e. per prompt file (the first of each in the stream; their prompts are "
                        "never trained on); τ is reported per source and pooled")
    p.add_argument("--eval-every", type=common.non_negative, default=50, help="steps between validations (0: none)")
    p.add_argument("--save-every", type=common.non_negative, default=100, help="steps between checkpoints (0: end)")
    p.add_argument("--cache-dir", default=None, help="cache target features on disk (for several epochs)")
    p.add_argument("--max-shard-size", default=None, metavar="SIZE",
                   help="split each saved weight file at SIZE, e.g. 100MB (default: transformers' own)")
    p.add_argument("--seed", type=int, default=0, help="seed of data order, anchors and initialisation")
    common.add_threads(p)
    p.add_argument("--time-limit", type=float, default=None, help="minutes; stop early (saving) when reached")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "auto"],
                   help="bfloat16: features from a bf16 target and the drafter step under bf16 autocast (float32 "
                   "master weights); auto: bfloat16 where the device has native bf16. A run may resume under another")
    p.add_argument("--draft-vocab", type=common.positive, default=None, metavar="N",
                   help="train (and draft) on the N most frequent response tokens of the data (+ EOS) only: "
                   "q = 0 outside them, as when drafting; fixed at the run's start (with --init-from: its "
                   "vocabulary, grown to N with the data's most frequent other tokens if N is larger)")
    p.add_argument("--warm-start", type=int, nargs="+", default=None, metavar="LAYER",
                   help="initialise drafter layer i from target layer LAYER_i (e.g. the last ones: -2 -1)")
    p.add_argument("--init-from", default=None, metavar="DRAFTER",
                   help="start from this drafter folder's weights and draft vocabulary (same shape, or fewer layers: "
                   "the new top layers start as identities), e.g. to continue a finished run on more data under a "
                   "new schedule")
    p.add_argument("--same-data-as", default=None, metavar="RUN",
                   help="train on the batches and draft vocabulary of the run in folder RUN (same data, seed and "
                   "batch settings required): an ablation that differs from it in the head alone")
    p.add_argument("--mix", nargs="+", type=_source_weight, default=None, metavar="SOURCE=WEIGHT",
                   help="reweight sources (an answer's prompt file stem, e.g. oasst_prompts=3): its answers appear "
                   "WEIGHT times per epoch (fractions sample, 0 drops it; others keep 1); another mix on a resume "
                   "opens a new epoch at the resume step")
    p.set_defaults(func=main)


def _source_weight(spec: str) -> tuple[str, float]:
    source, sep, weight = spec.rpartition("=")
    try:
        if not sep or not source or float(weight) < 0:
            raise ValueError
        return source, float(weight)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r} is not SOURCE=WEIGHT with WEIGHT >= 0") from None


def main(args) -> int:
    import torch

    from ..io.loading import resolve_dtype
    from ..training import checkpoint
    from ..training.trainer import TrainConfig, train

    dtype = resolve_dtype(args.dtype, "cuda" if torch.cuda.is_available() else "cpu")
    fields = {k: v for k, v in vars(args).items() if k in TrainConfig.__dataclass_fields__}
    fields["mix"] = dict(args.mix) if args.mix else None
    cfg = TrainConfig(**fields, output_dir=args.output, precision="bf16" if dtype == torch.bfloat16 else "fp32")
    res = train(cfg)
    # Under `accelerate launch`, a gloo group left for interpreter exit can abort a worker ("terminate called
    # without an active exception"): end it here, as accelerate asks of every script.
    from accelerate import PartialState

    PartialState().destroy_process_group()
    state = checkpoint.latest(Path(args.output))
    step = int(state.name.removeprefix(checkpoint.PREFIX))
    val = res["final_val"]
    seen = f"validation at step {val['step']}: {val}" if val else "no validation this run"
    print(f"saved step {step} to {state} (the drafter: {state / 'drafter'}); {seen}")
    return 0
