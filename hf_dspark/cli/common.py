"""The flags several subcommands share, defined once (one name per concept): --target, --drafter, --dtype,
--device, --threads, -o/--output. Nothing here imports torch: `hf-dspark --help` stays quick."""

from __future__ import annotations

import argparse

LOOPS = ("auto", "assisted", "static", "compiled")  # decoding/options.py LOOPS (kept here: no torch import)

DTYPES = ("auto", "float32", "bfloat16", "float16")  # io.loading.DTYPES' full names, besides "auto"


def add_target(p: argparse.ArgumentParser, default: str | None = None) -> None:
    p.add_argument("--target", default=default,
                   help="target model folder or Hub id (default: the embedded SmolLM2-135M-Instruct)")


def add_drafter(p: argparse.ArgumentParser, default: str | None = None,
                help: str = "drafter folder (default: the shipped drafter for the default target)") -> None:
    p.add_argument("--drafter", default=default, help=help)


def add_dtype(p: argparse.ArgumentParser, default: str = "float32", help: str = "target dtype") -> None:
    """--dtype: a dtype name, or "auto" (decoding: whichever of float32 and bf16 decodes faster here, measured once;
    batched jobs: bf16 where the device has native bf16)."""
    p.add_argument("--dtype", default=default, choices=DTYPES, help=help)


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="torch device; auto: cuda if available, else cpu")


def device(args) -> str:
    """--device with "auto" resolved."""
    if args.device != "auto":
        return args.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def add_threads(p: argparse.ArgumentParser, default: int = 0, help: str = "") -> None:
    p.add_argument("--threads", type=int, default=default, help=help or "torch threads (0: torch's default)")


def add_output(p: argparse.ArgumentParser, help: str, required: bool = False, default: str | None = None) -> None:
    p.add_argument("-o", "--output", required=required, default=default, help=help)


def set_threads(args) -> None:
    """Apply --threads (0 or None: torch's default)."""
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)


def positive(text: str) -> int:
    """argparse type: an int ≥ 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative(text: str) -> int:
    """argparse type: an int ≥ 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value
