"""`hf-dspark` command line: one module per subcommand, each a thin wrapper over public functions of the
floors below (common.py holds the flags they share). `python -m hf_dspark.cli` runs the same."""

from __future__ import annotations

import argparse

from ..training import trainer
from . import bench, calibrate, data, demo, export, generate, profile, replay

# In `hf-dspark --help` order; `train` keeps its flags beside TrainConfig in training/trainer.py.
SUBCOMMANDS = (generate, data, profile, trainer, calibrate, export, demo, bench, replay)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hf-dspark", description="DSpark speculative decoding for transformers")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)
