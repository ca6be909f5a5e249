"""`hf-dspark` command line: one module per subcommand, each a thin wrapper over public functions of the
floors below (common.py holds the flags they share). `python -m hf_dspark.cli` runs the same.

Subcommand modules import torch and transformers inside their handlers only, so `--help` and `--version` are
quick. A user error (bad input, a refusal, a missing file) is one line on stderr and exit code 2; `-v` shows its
traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import re
import sys

from . import bench, calibrate, data, demo, export, generate, profile, replay, train

SUBCOMMANDS = (generate, data, profile, train, calibrate, export, demo, bench, replay)  # `hf-dspark --help` order
USER_ERRORS = (ValueError, OSError, NotImplementedError, ImportError)  # bad input, refusals, a missing extra
STATES_DEFAULT = re.compile(r"default:|\(default\)")  # "(default: the shipped drafter)", "compiled (default)"


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows each flag's default where it tells the reader something: not a required flag's, not None
    or a switch's False, and not where the help text already says what the default is."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.required or action.default is None or action.default is False or STATES_DEFAULT.search(text):
            return text
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="hf-dspark", description="DSpark speculative decoding for transformers",
                                     formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=f"hf-dspark {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="more logging, and tracebacks of user errors")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only, no progress bars")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    for p in sub.choices.values():
        p.formatter_class = _Formatter
    return parser


def _logging(args) -> None:
    from transformers.utils import logging

    if args.verbose:
        logging.set_verbosity_info()
    elif args.quiet:
        logging.set_verbosity_error()
        import os

        os.environ["TQDM_DISABLE"] = "1"  # our own bars (tqdm reads it at each bar)
    logging.disable_progress_bar()  # no weight-loading bars: the subcommands say what they load


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    _logging(args)
    try:
        return args.func(args)
    except USER_ERRORS as e:
        if args.verbose:
            raise
        print(f"hf-dspark {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hf-dspark {args.command}: interrupted", file=sys.stderr)
        return 130
