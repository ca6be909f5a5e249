"""Weight-major against stock verification products (decoding/linears.py), per call, in one process.

For each prompt, interleaved: plain generate, then DSpark with the library defaults on a profile measured with
stock products, then on one measured with weight-major products (both profiles measured here, first). Prints
each profile and a per-call table; writes the rows as JSON.

  .venv/bin/python research/linear_forms.py --dtype float32 --threads 2 --max-new-tokens 64 -o out/linear_forms.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from hf_dspark import DecodingOptions
from hf_dspark.decoding.profile import measure_profile
from hf_dspark.eval.bench import load_prompts
from hf_dspark.io.loading import load_target_and_drafter
from hf_dspark.io.prompts import chat_inputs

S = "data/prompts/train"
SETS = ["oasst_prompts", "awesome_chatgpt_prompts", "python_functions"]
DEMO = ["Write a short, upbeat blog post about a weekend trip to the mountains.",
        "Explain speculative decoding in two sentences."]


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
    profiles = {form: measure_profile(model, drafter, linear=form) for form in ("stock", "weight_major")}
    for p in profiles.values():
        print(p, flush=True)
    prompts = load_prompts([f"{S}/{s}.jsonl" for s in SETS], args.limit, holdout=True)
    prompts += [("demo", t) for t in DEMO]
    rows = []
    gen = {"do_sample": False, "max_new_tokens": args.max_new_tokens}
    for i, (src, text) in enumerate(prompts):
        inputs = chat_inputs(tok, text)
        row = {"source": src.split(":")[0], "prompt": text[:80]}
        if i == 0:  # warm-up of every method
            model.generate(**inputs, **gen)
            for p in profiles.values():
                model.generate(**inputs, **gen, assistant_model=drafter, dspark_options=DecodingOptions(device_profile=p))
        t0 = time.perf_counter()
        plain = model.generate(**inputs, **gen)
        row["plain_s"] = time.perf_counter() - t0
        row["tokens"] = plain.shape[1] - inputs["input_ids"].shape[1]
        for form, p in profiles.items():
            t0 = time.perf_counter()
            out = model.generate(**inputs, **gen, assistant_model=drafter, dspark_options=DecodingOptions(device_profile=p))
            row[f"{form}_s"] = time.perf_counter() - t0
            row[f"{form}_same"] = out.tolist() == plain.tolist()
            row[f"{form}_tau"] = drafter.last_stats.tau
        rows.append(row)
        print(src, row["tokens"], " ".join(f"{f} {row['plain_s'] / row[f'{f}_s']:.2f}x same={row[f'{f}_same']}"
                                           for f in profiles), flush=True)
    summary = {}
    for form in profiles:
        ratios = sorted(r["plain_s"] / r[f"{form}_s"] for r in rows)
        pooled = sum(r["plain_s"] for r in rows) / sum(r[f"{form}_s"] for r in rows)
        summary[form] = {"pooled": pooled, "median": statistics.median(ratios), "worst": ratios[0],
                         "p10": ratios[max(0, len(ratios) // 10 - 1)],
                         "identical": all(r[f"{form}_same"] for r in rows)}
        print(form, {k: round(v, 3) if isinstance(v, float) else v for k, v in summary[form].items()})
    with open(args.output, "w") as f:
        json.dump({"profiles": {k: p.to_dict() for k, p in profiles.items()}, "rows": rows, "summary": summary}, f,
                  indent=1)


if __name__ == "__main__":
    main()
