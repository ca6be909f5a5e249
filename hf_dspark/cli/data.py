"""`hf-dspark data`: regenerate training answers with the target itself (training/data.py)."""

from __future__ import annotations

from . import common


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("data", help="regenerate training answers with the target itself")
    p.add_argument("prompts", nargs="+", help="JSONL prompt files ({'turns': [prompt]}), each as PATH or PATH:N "
                   "(N answers per prompt: the first greedy, the rest sampled); gsm8k* files get the eval suffix")
    common.add_output(p, "output shard folder (resumable)", required=True)
    p.add_argument("--exclude", nargs="*", default=[], help="evaluation JSONL files whose prompts must not be used")
    common.add_target(p)
    p.add_argument("--limit", type=common.positive, default=None, help="plan only the first N shuffled answers")
    p.add_argument("--seed", type=int, default=0, help="seed of the job order and of the sampled answers")
    p.add_argument("--slots", type=common.positive, default=128,
                   help="rows decoded together (continuous batching; more amortise the weights, each costs KV memory)")
    p.add_argument("--shard-size", type=common.positive, default=1000, help="answers per gzipped shard")
    p.add_argument("--max-new-tokens", type=common.positive, default=256, help="longest answer, in tokens")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of answers 1..N-1")
    p.add_argument("--top-p", type=float, default=0.9, help="nucleus of answers 1..N-1 (1: none)")
    common.add_dtype(p, default="auto", help="auto: bf16 where the CPU has native bf16 (~2x float32 there), float32 "
                     "elsewhere; keep one dtype for one answer set")
    common.add_threads(p, help="torch threads (use 1 on shared machines; 0: torch's default)")
    p.set_defaults(func=main)


def main(args) -> int:
    from ..io.loading import resolve_dtype
    from ..training import data

    dtype = str(resolve_dtype(args.dtype, "cpu")).removeprefix("torch.")
    n, stopped = data.run(args.prompts, args.output, args.exclude, args.limit, args.seed, args.slots,
                          args.max_new_tokens, args.temperature, args.top_p, dtype, args.threads, args.target,
                          args.shard_size)
    if stopped:
        print(f"stopped by a signal: wrote {n} answers to {args.output}; the same command resumes")
        return 130
    print(f"wrote {n} answers to {args.output}")
    return 0
