"""Answer-generation throughput: padded `model.generate` batches (the old `hf-dspark data`) against the
continuous-batching sampler, on the same prompts, in one process.

    .venv/bin/python research/generator_speed.py --prompts 64 --threads 1

Each method answers the same GSM8K/Alpaca/MBPP training prompts (temperature 0.7, top-p 0.9, 256 new tokens);
tok/s counts answer tokens up to and including EOS, so padding and rows stepping past their EOS are cost.
"""

from __future__ import annotations

import argparse
import time

import torch

from hf_dspark.io.loading import load_default_target
from hf_dspark.io.prompts import chat_ids
from hf_dspark.training.data import plan
from hf_dspark.training.sampler import Job, answer

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--new", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    jobs = plan(SOURCES, seed=0)[: args.prompts]
    for dtype, methods in ((torch.float32, ["generate bs32"]), (torch.bfloat16, ["generate bs32", "sampler 64 slots"])):
        model, tok = load_default_target(dtype=dtype)
        eos = model.generation_config.eos_token_id
        prompts = [chat_ids(tok, p["prompt"]) for _, p, _ in jobs]
        for name in methods:
            t0 = time.perf_counter()
            if name.startswith("generate"):
                n = padded_generate(model, eos, prompts, 32, args.new)
            else:
                todo = [Job(str(i), p, 0.7, 0.9) for i, p in enumerate(prompts)]
                n = sum(len(r) for _, r in answer(model, todo, [eos], args.new, slots=64, prefill_batch=8))
            dt = time.perf_counter() - t0
            print(f"{str(dtype).removeprefix('torch.')} {name}: {n} tokens in {dt:.1f} s = {n / dt:.1f} tok/s", flush=True)


if __name__ == "__main__":
    main()
