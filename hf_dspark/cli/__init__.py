"""`hf-dspark` command line: one module per subcommand, each a thin wrapper over public functions of the
floors below (common.py holds the flags they share). `python -m hf_dspark.cli` runs the same."""

from __future__ import annotations

import argparse

from . import bench, calibrate, data, demo, export, generate, profile, replay, train

SUBCOMMANDS = (generate, data, profile, train, calibrate, export, demo, bench, replay)  # `hf-dspark --help` order


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hf-dspark", description="DSpark speculative decoding for transformers")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)
