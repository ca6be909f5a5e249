"""The flags several subcommands share, defined once: target, drafter, dtype, device, threads."""

from __future__ import annotations

import argparse

import torch

from ..io.loading import DTYPES

DEFAULT_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def add_target(p: argparse.ArgumentParser, default: str | None = None) -> None:
    p.add_argument("--target", default=default, help="model id or folder (default: the embedded SmolLM2-135M-Instruct)")


def add_drafter(p: argparse.ArgumentParser, default: str | None = None,
                help: str = "drafter folder (default: the shipped drafter for the default target)") -> None:
    p.add_argument("--drafter", default=default, help=help)


def add_dtype(p: argparse.ArgumentParser, default: str = "float32", help: str = "target dtype") -> None:
    """--dtype: a DTYPES name, or "auto" (for decoding io.loading.decode_dtype: whichever of float32 and bf16 decodes
    faster here, measured once; for batched jobs io.loading.auto_dtype: bf16 where the device has native bf16)."""
    p.add_argument("--dtype", default=default, choices=["auto", *DTYPES], help=help)


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=DEFAULT_DEVICE)


def add_threads(p: argparse.ArgumentParser, default: int = 0, help: str = "") -> None:
    p.add_argument("--threads", type=int, default=default, help=help or "torch threads (0 = torch's default)")


def set_threads(args) -> None:
    """Apply --threads (0 or None: torch's default)."""
    if args.threads:
        torch.set_num_threads(args.threads)
