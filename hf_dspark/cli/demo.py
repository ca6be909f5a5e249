"""`hf-dspark demo`: the options of the Gradio demo (flags, or HF_DSPARK_* environment variables on a Space) and
the subcommand that runs hf_dspark/demo/app.py with them."""

from __future__ import annotations

import argparse
import os

from . import common

MAX_NEW_TOKENS = 256  # demo.session.MAX_NEW_TOKENS


def _env(name: str, default=None):
    return os.environ.get(f"HF_DSPARK_{name}", default)


def _loop(value: str) -> str:
    """argparse type (it also checks a string default, here $HF_DSPARK_LOOP): one of the decoding loops."""
    if value not in common.LOOPS:
        raise argparse.ArgumentTypeError(f"loop must be one of {', '.join(common.LOOPS)}; got {value!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    common.add_target(p, default=_env("TARGET"))
    common.add_drafter(p, default=_env("DRAFTER"))
    p.add_argument("--drafter-none", default=_env("DRAFTER_NONE"), help="a drafter with head_type none, for the head control")
    p.add_argument("--tiny", action="store_true", default=_env("DEMO_TINY", "") not in ("", "0"),
                   help="tiny seeded target + drafters built from a config (no download; for tests)")
    p.add_argument("--tiny-steps", type=common.non_negative, default=int(_env("DEMO_TINY_STEPS", "150")),
                   help="training steps of the tiny drafters at startup (0 = random)")
    p.add_argument("--max-new-tokens", type=int, default=int(_env("DEMO_MAX_NEW_TOKENS", str(MAX_NEW_TOKENS))),
                   help="cap on the max-new-tokens control")
    p.add_argument("--loop", type=_loop, default=_env("LOOP", "auto"), metavar="{" + ",".join(common.LOOPS) + "}",
                   help="DSpark's decoding loop (DecodingOptions.loop): auto (the library's default: the compiled loop "
                        "where `hf-dspark profile` set it up, else assisted), transformers' assisted loop, or "
                        "DSpark's own on a static KV cache, eager (static) or compiled (at startup: compiled once per "
                        "setup, minutes on a CPU, then loaded from $HF_DSPARK_CACHE/graphs in seconds)")
    p.add_argument("--queue-size", type=int, default=16, help="requests waiting at most; more are refused")
    p.add_argument("--host", default=None, help="bind address (default: gradio's, 127.0.0.1 or $GRADIO_SERVER_NAME)")
    p.add_argument("--port", type=int, default=None, help="port (default: gradio's, 7860 or $GRADIO_SERVER_PORT)")
    common.add_device(p)
    common.add_threads(p, default=int(_env("THREADS", "0")))
    return p


def parse_app_args(argv=None) -> argparse.Namespace:
    args = add_arguments(argparse.ArgumentParser(prog="app.py", description="DSpark live demo")).parse_args(argv)
    args.device = common.device(args)
    return args


def cmd_demo(args) -> int:
    from ..demo import app  # gradio is an optional dependency (the `demo` extra)

    args.device = common.device(args)
    app.main(args)
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("demo", help="launch the Gradio demo (hf_dspark/demo/app.py): watch drafts, scheduling, verification")
    add_arguments(p).set_defaults(func=cmd_demo)
