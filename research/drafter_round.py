"""The drafter round's own products and q, per call, in one process: before and after they joined the round A/B.

Arms, per prompt, interleaved: plain generate; "before": weight-major verification only, greedy rounds building
each draft's full-vocabulary q, on a profile whose drafter time is a sampled round's (as the package did before
the round A/B); "after": the library's round as it is now (the profile's form on the target, the drafter and its
draft LM head, greedy rounds without q, greedy round times). Both profiles are measured here with weight-major
products, so the arms differ only in the drafter's round. Prints the profiles, a per-call table and a summary;
writes the rows as JSON.

  .venv/bin/python research/drafter_round.py --dtype float32 --threads 2 --max-new-tokens 64 -o out/drafter_round.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import time

import torch

from hf_dspark import DecodingOptions
from hf_dspark.decoding import candidate
from hf_dspark.decoding import profile as prof
from hf_dspark.decoding.linears import round_linears
from hf_dspark.eval.bench import load_prompts
from hf_dspark.io.loading import load_target_and_drafter
from hf_dspark.io.prompts import chat_inputs
from hf_dspark.model import drafter as drafter_module

S = "data/prompts/train"
SETS = ["oasst_prompts", "awesome_chatgpt_prompts", "python_functions"]
DEMO = ["Write a short, upbeat blog post about a weekend trip to the mountains.",
        "Explain speculative decoding in two sentences."]


@contextlib.contextmanager
def before():
    """The round as it was: products in the profile's form on the target only, q built for greedy drafts too."""
    real_linears, real_block = candidate.round_linears, drafter_module.draft_block
    candidate.round_linears = prof.round_linears = lambda linear, gamma, target, *_: round_linears(
        linear, gamma, target, None, None)
    drafter_module.draft_block = lambda *a, **kw: real_block(*a, **{**kw, "need_logits": True})
    try:
        yield
    finally:
        candidate.round_linears = prof.round_linears = real_linears
        drafter_module.draft_block = real_block


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=8, help="held-out prompts per set")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok, drafter, _ = load_target_and_drafter(None, None, args.dtype, "cpu")
    with before():
        old = prof.measure_profile(model, drafter, linear="weight_major")
    old = dataclasses.replace(old, draft_time=old.sampled_draft_time)  # the old profile timed sampled rounds
    new = prof.measure_profile(model, drafter, linear="weight_major")
    arms = {"before": (before, old), "after": (contextlib.nullcontext, new)}
    for name, (_, p) in arms.items():
        print(name, p, sep="\n", flush=True)
    prompts = load_prompts([f"{S}/{s}.jsonl" for s in SETS], args.limit, holdout=True)
    prompts += [("demo", t) for t in DEMO]
    rows = []
    gen = {"do_sample": False, "max_new_tokens": args.max_new_tokens}
    for i, (src, text) in enumerate(prompts):
        inputs = chat_inputs(tok, text)
        row = {"source": src.split(":")[0], "prompt": text[:80]}
        if i == 0:  # warm-up of every arm
            model.generate(**inputs, **gen)
            for ctx, p in arms.values():
                with ctx():
                    model.generate(**inputs, **gen, assistant_model=drafter,
                                   dspark_options=DecodingOptions(device_profile=p))
        t0 = time.perf_counter()
        plain = model.generate(**inputs, **gen)
        row["plain_s"] = time.perf_counter() - t0
        row["tokens"] = plain.shape[1] - inputs["input_ids"].shape[1]
        for name, (ctx, p) in arms.items():
            with ctx():
                t0 = time.perf_counter()
                out = model.generate(**inputs, **gen, assistant_model=drafter,
                                     dspark_options=DecodingOptions(device_profile=p))
                row[f"{name}_s"] = time.perf_counter() - t0
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
        pooled = sum(r["plain_s"] for r in rows) / sum(r[f"{a}_s"] for r in rows)
        summary[a] = {"pooled": pooled, "median": statistics.median(ratios), "worst": ratios[0],
                      "p10": ratios[max(0, len(ratios) // 10 - 1)],
                      "draft_ms_median": statistics.median(r[f"{a}_draft_ms"] for r in rows
                                                           if r[f"{a}_draft_ms"] == r[f"{a}_draft_ms"]),
                      "identical": all(r[f"{a}_same"] for r in rows)}
        print(a, {k: round(v, 3) if isinstance(v, float) else v for k, v in summary[a].items()})
    with open(args.output, "w") as f:
        json.dump({"profiles": {k: p.to_dict() for k, (_, p) in arms.items()}, "rows": rows, "summary": summary},
                  f, indent=1)


if __name__ == "__main__":
    main()
