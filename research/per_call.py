"""Shared by the per-call A/B studies (linear_forms.py, drafter_round.py): their prompts, their interleaved race of
plain generate against DSpark arms, and its summary.

An arm is (a context to decode in, a DeviceProfile): per prompt, plain generate, then each arm in its context with
the library's defaults on its profile, greedy, timed in one process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch

from hf_dspark import DecodingOptions
from hf_dspark.eval.bench import load_prompts
from hf_dspark.io.loading import load_target_and_drafter
from hf_dspark.io.prompts import chat_inputs

S = "data/prompts/train"
SETS = ["oasst_prompts", "awesome_chatgpt_prompts", "python_functions"]
DEMO = ["Write a short, upbeat blog post about a weekend trip to the mountains.",
        "Explain speculative decoding in two sentences."]


def setup(doc: str):
    """Parse the studies' shared arguments, set the threads, load the embedded target and shipped drafter →
    (args, model, tokenizer, drafter)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=8, help="held-out prompts per set")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok, drafter, _ = load_target_and_drafter(None, None, args.dtype, "cpu")
    return args, model, tok, drafter


def race(args, model, tok, drafter, arms: dict) -> None:
    """arms: {name: (context factory, DeviceProfile)}. Prints the profiles, a line per prompt and a summary per arm;
    writes {"profiles", "rows", "summary"} to args.output."""
    for name, (_, p) in arms.items():
        print(name, p, sep="\n", flush=True)
    prompts = load_prompts([f"{S}/{s}.jsonl" for s in SETS], args.limit, holdout=True)
    prompts += [("demo", t) for t in DEMO]
    gen = {"do_sample": False, "max_new_tokens": args.max_new_tokens}

    def dspark(inputs, ctx, p):
        with ctx():
            t0 = time.perf_counter()
            out = model.generate(**inputs, **gen, assistant_model=drafter, dspark_options=DecodingOptions(device_profile=p))
            return out, time.perf_counter() - t0

    rows = []
    for i, (src, text) in enumerate(prompts):
        inputs = chat_inputs(tok, text)
        row = {"source": src.split(":")[0], "prompt": text[:80]}
        if i == 0:  # warm-up of every arm
            model.generate(**inputs, **gen)
            for ctx, p in arms.values():
                dspark(inputs, ctx, p)
        t0 = time.perf_counter()
        plain = model.generate(**inputs, **gen)
        row["plain_s"] = time.perf_counter() - t0
        row["tokens"] = plain.shape[1] - inputs["input_ids"].shape[1]
        for name, (ctx, p) in arms.items():
            out, row[f"{name}_s"] = dspark(inputs, ctx, p)
            st = drafter.last_stats
            row[f"{name}_same"] = out.tolist() == plain.tolist()
            row[f"{name}_tau"] = st.tau
            drafted = [r.draft_time for r in st.rounds if r.drafted and r.source == "dspark"]  # drafter rounds only
            row[f"{name}_draft_ms"] = 1e3 * statistics.median(drafted or [float("nan")])
        rows.append(row)
        print(src, row["tokens"], " ".join(
            f"{a} {row['plain_s'] / row[f'{a}_s']:.2f}x draft {row[f'{a}_draft_ms']:.1f}ms same={row[f'{a}_same']}"
            for a in arms), flush=True)
    summary = {}
    for a in arms:
        ratios = sorted(r["plain_s"] / r[f"{a}_s"] for r in rows)
        drafts = [r[f"{a}_draft_ms"] for r in rows if r[f"{a}_draft_ms"] == r[f"{a}_draft_ms"]]  # NaN: no round
        summary[a] = {"pooled": sum(r["plain_s"] for r in rows) / sum(r[f"{a}_s"] for r in rows),
                      "median": statistics.median(ratios), "worst": ratios[0],
                      "p10": ratios[max(0, len(ratios) // 10 - 1)],
                      "draft_ms_median": statistics.median(drafts) if drafts else None,
                      "identical": all(r[f"{a}_same"] for r in rows)}
        print(a, {k: round(v, 3) if isinstance(v, float) else v for k, v in summary[a].items()})
    with open(args.output, "w") as f:
        json.dump({"profiles": {k: p.to_dict() for k, (_, p) in arms.items()}, "rows": rows, "summary": summary},
                  f, indent=1)


nothing = contextlib.nullcontext  # the context of an arm that changes nothing
