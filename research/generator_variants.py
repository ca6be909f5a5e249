"""The answer generator's throughput under its options, on the same jobs, in one process (one variant at a time).

    .venv/bin/python research/generator_variants.py --jobs 192 --threads 1 [--dtype bfloat16] [--set base]

Jobs are the first N of an answer set's plan as `hf-dspark data` would answer them (scripts/generate_answers.sh):
"broad" (MATH, Python functions, chat; greedy and T = 1) or "base" (GSM8K, Alpaca, MBPP; greedy and T = 0.7,
top-p 0.9); tok/s counts answer tokens (to EOS or 256). Variants: slots 64/128, prompts
sorted by length within windows of 8 × slots or not.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from hf_dspark.decoding.machine import cpu_info
from hf_dspark.io.loading import load_target
from hf_dspark.io.prompts import chat_ids
from hf_dspark.training.data import eos_ids, plan
from hf_dspark.training.sampler import Job, answer, by_length_in_windows

T = "data/prompts/train/"
BROAD = [T + "math_train.jsonl:2", T + "math_prm800k_extra.jsonl:1", T + "python_functions.jsonl:3",
         T + "oasst_prompts.jsonl:10", T + "awesome_chatgpt_prompts.jsonl:5"]
BASE = [T + "gsm8k_train.jsonl:2", T + "alpaca_5000.jsonl:2", T + "mbpp_train.jsonl:10"]
SETS = {"broad": (BROAD, 1.0, 1.0, 1), "base": (BASE, 0.7, 0.9, 0)}  # sources, temperature, top-p, seed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=192)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--variants", default="64,64s,128,128s")
    ap.add_argument("--set", default="broad", choices=sorted(SETS))
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_target(None, getattr(torch, args.dtype), "cpu")
    sources, temperature, top_p, seed = SETS[args.set]
    jobs = [Job(k, chat_ids(tok, p["prompt"]), t, top_p)
            for k, p, t in plan(sources, seed=seed, temperature=temperature, top_p=top_p)[: args.jobs]]
    eos = eos_ids(model)
    cpu = cpu_info()
    out = {"cpu": {k: cpu[k] for k in ("name", "vendor", "family", "model")}, "threads": args.threads,
           "dtype": args.dtype, "set": args.set, "jobs": args.jobs, "rows": []}
    for v in args.variants.split(","):
        slots, sort = int(v.rstrip("s")), v.endswith("s")
        todo = by_length_in_windows(jobs, 8 * slots) if sort else jobs
        t0 = time.perf_counter()
        n = sum(len(r) for _, r in answer(model, todo, eos, 256, slots=slots, prefill_batch=max(1, slots // 8),
                                          seed=0))
        dt = time.perf_counter() - t0
        out["rows"].append({"slots": slots, "sorted": sort, "tokens": n, "seconds": dt, "tok_s": n / dt})
        print(f"slots {slots:4d} sorted {sort!s:5}: {n} tokens in {dt:.1f} s = {n / dt:.1f} tok/s", flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
