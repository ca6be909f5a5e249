"""Answer-generation throughput: padded `model.generate` batches (the old `hf-dspark data`) against the
continuous-batching sampler, on the same prompts, in one process.

    .venv/bin/python research/generator_speed.py --prompts 64 --threads 1
    .venv/bin/python research/generator_speed.py --against 1210de2 --rounds 3   # sampler against an older one

`--against REV` times the sampler as committed at REV (read with `git show`) and the current one alternately,
in one process on the same jobs, bf16 only: runs here vary by up to 15 % from process to process, and a ratio
in one process cancels most of it. Each method answers the same GSM8K/Alpaca/MBPP training prompts (temperature
0.7, top-p 0.9, 256 new tokens);
tok/s counts answer tokens up to and including EOS, so padding and rows stepping past their EOS are cost.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

import torch

from hf_dspark.io.loading import load_default_target
from hf_dspark.io.prompts import chat_ids
from hf_dspark.training.data import plan
from hf_dspark.training import sampler

SOURCES = ["data/prompts/train/gsm8k_train.jsonl", "data/prompts/train/alpaca_5000.jsonl",
           "data/prompts/train/mbpp_train.jsonl"]


def padded_generate(model, eos: int, prompts: list[list[int]], batch: int, new: int) -> int:
    tokens = 0
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        w = max(map(len, chunk))
        ids = torch.tensor([[eos] * (w - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (w - len(p)) + [1] * len(p) for p in chunk])
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.7, top_p=0.9, top_k=0,
                             max_new_tokens=new, pad_token_id=eos)[:, w:].tolist()
        tokens += sum(next((j + 1 for j, t in enumerate(row) if t == eos), len(row)) for row in out)
    return tokens


def sampler_at(rev: str):
    """The sampler module as committed at `rev` (its relative imports resolve against the current package)."""
    source = subprocess.run(["git", "show", f"{rev}:hf_dspark/training/sampler.py"], check=True,
                            capture_output=True, text=True).stdout
    path = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    path.write(source)
    path.close()
    spec = importlib.util.spec_from_file_location(f"hf_dspark.training.sampler_{rev}", path.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        os.unlink(path.name)  # the module is in memory now
    return module


def run_sampler(module, model, eos: int, prompts: list[list[int]], new: int) -> int:
    todo = [module.Job(str(i), p, 0.7, 0.9) for i, p in enumerate(prompts)]
    return sum(len(r) for _, r in module.answer(model, todo, [eos], new, slots=64, prefill_batch=8))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--against", metavar="REV", help="time the sampler at git revision REV against the current one")
    ap.add_argument("--rounds", type=int, default=1, help="with --against: alternate the two this many times")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    jobs = plan(SOURCES, seed=0)[: args.prompts]
    if args.against:
        old = sampler_at(args.against)
        model, tok = load_default_target(dtype=torch.bfloat16)
        eos = model.generation_config.eos_token_id
        prompts = [chat_ids(tok, p["prompt"]) for _, p, _ in jobs]
        for r in range(args.rounds):
            for name, module in ((f"sampler at {args.against}", old), ("sampler now", sampler)):
                t0 = time.perf_counter()
                n = run_sampler(module, model, eos, prompts, args.new)
                dt = time.perf_counter() - t0
                print(f"round {r} bf16 {name}: {n} tokens in {dt:.1f} s = {n / dt:.1f} tok/s", flush=True)
        return
    for dtype, methods in ((torch.float32, ["generate bs32"]), (torch.bfloat16, ["generate bs32", "sampler 64 slots"])):
        model, tok = load_default_target(dtype=dtype)
        eos = model.generation_config.eos_token_id
        prompts = [chat_ids(tok, p["prompt"]) for _, p, _ in jobs]
        for name in methods:
            t0 = time.perf_counter()
            if name.startswith("generate"):
                n = padded_generate(model, eos, prompts, 32, args.new)
            else:
                n = run_sampler(sampler, model, eos, prompts, args.new)
            dt = time.perf_counter() - t0
            dname = str(dtype).removeprefix("torch.")
            print(f"{dname} {name}: {n} tokens in {dt:.1f} s = {n / dt:.1f} tok/s", flush=True)


if __name__ == "__main__":
    main()
