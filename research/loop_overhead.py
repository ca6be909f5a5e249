"""Where a DSpark generate() call's time goes on DSpark's own loop: the target's forwards, the drafter, and the rest
(processing, judging, the candidate generator's bookkeeping, Python), summed over real calls.

    .venv/bin/python research/loop_overhead.py [--loop compiled] [--dtype bfloat16] [--threads 2] [--limit 8]
        [--max-new-tokens 128] [--temperature 1] [--out F]

The target's forwards are timed around StaticVerifier.prefill/verify (or the model's forward on the assisted loop),
the drafter from each round's own draft_time (DSparkStats), the rest is the call's wall time minus both. One warm-up
call first (compiling, profile). Prints a JSON record with the CPU beside the numbers.
"""

import argparse
import json
import subprocess
import time

import torch


def cpu() -> str:
    info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    return " ".join(fields.get(k, "?").strip() for k in ("Model name", "CPU family", "Model"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loop", default="compiled", choices=["assisted", "static", "compiled"])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompts", default="data/prompts/eval/gsm8k.jsonl")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy; else sampled at this temperature")
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from hf_dspark import DecodingOptions
    from hf_dspark.decoding import loop
    from hf_dspark.io.loading import load_target_and_drafter
    from hf_dspark.io.prompts import chat_inputs, read_prompts

    model, tok, drafter, _ = load_target_and_drafter(None, None, a.dtype, "cpu")
    spent = {"target": 0.0}

    def timed(fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent["target"] += time.perf_counter() - t0
        return wrapper

    if a.loop == "assisted":
        model.forward = timed(model.forward)
    else:
        loop.StaticVerifier.prefill = timed(loop.StaticVerifier.prefill)
        loop.StaticVerifier.verify = timed(loop.StaticVerifier.verify)
    options = DecodingOptions(loop=a.loop)
    prompts = [p for _, p in read_prompts(a.prompts)][: a.limit + 1]
    rows = []
    for i, prompt in enumerate(prompts):
        inputs = chat_inputs(tok, prompt)
        spent["target"] = 0.0
        torch.manual_seed(i)
        sampling = dict(do_sample=True, temperature=a.temperature) if a.temperature else dict(do_sample=False)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**inputs, assistant_model=drafter, **sampling, max_new_tokens=a.max_new_tokens,
                                 dspark_options=options)
        wall = time.perf_counter() - t0
        stats = drafter.last_stats
        if i == 0:
            continue  # the warm-up: compiling, the profile
        draft = sum(r.draft_time for r in stats.rounds)
        rows.append({"wall": wall, "target": spent["target"], "drafter": draft, "rounds": len(stats.rounds),
                     "new_tokens": out.shape[1] - inputs["input_ids"].shape[1], "loop": stats.loop})
    total = {k: sum(r[k] for r in rows) for k in ("wall", "target", "drafter", "rounds", "new_tokens")}
    rest = total["wall"] - total["target"] - total["drafter"]
    record = {"cpu": cpu(), "loop": a.loop, "dtype": a.dtype, "temperature": a.temperature, "threads": a.threads, "calls": len(rows),
              "tokens_per_s": total["new_tokens"] / total["wall"], "rounds": total["rounds"],
              "ms_per_round": {"all": 1e3 * total["wall"] / total["rounds"],
                               "target": 1e3 * total["target"] / total["rounds"],
                               "drafter": 1e3 * total["drafter"] / total["rounds"],
                               "rest": 1e3 * rest / total["rounds"]},
              "rest_share": rest / total["wall"], "loops_run": sorted({r["loop"] for r in rows})}
    print(json.dumps(record, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
