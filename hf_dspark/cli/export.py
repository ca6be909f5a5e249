"""`hf-dspark export --format deepspec`: write a drafter in DeepSeek's DeepSpec format (model/deepspec.py)."""

from __future__ import annotations

from pathlib import Path

from . import common


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("export", help="write a drafter in another format (DeepSpec / vLLM DSpark checkpoints)")
    p.add_argument("drafter", help="drafter folder (ours or DeepSpec)")
    p.add_argument("output", help="output folder (refused if it holds files, unless --overwrite)")
    p.add_argument("--format", default="deepspec", choices=["deepspec"], help="checkpoint format to write")
    common.add_target(p)
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="tensor dtype in the file (default: the drafter's; DeepSpec releases are bfloat16)")
    p.add_argument("--overwrite", action="store_true", help="write into a folder that already holds files")
    p.set_defaults(func=main)


def main(args) -> int:
    out = Path(args.output)
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        raise FileExistsError(f"{out} is not empty (its files would be overwritten); pass --overwrite, or choose "
                              "an empty folder")
    import torch

    from ..io.loading import load_target_and_drafter
    from ..model.deepspec import expected_keys, export

    _, _, drafter, _ = load_target_and_drafter(args.target, args.drafter, torch.float32, "cpu")
    written = export(drafter, out, dtype=getattr(torch, args.dtype) if args.dtype else None)
    print(f"wrote a DeepSpec checkpoint to {written} ({len(expected_keys(drafter.config))} tensors)")
    return 0
