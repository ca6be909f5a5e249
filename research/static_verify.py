"""What a static-shape loop would save on this machine: the target's verification forward of k new tokens on a
300-token cache, three ways, medians (ms), in one process.

    .venv/bin/python research/static_verify.py [--dtype bfloat16] [--threads 2] [--lengths 1 2 4 8] [--out F]

  dynamic   DynamicCache, eager, cropped back after each forward (what DSpark runs today, in transformers'
            assisted loop);
  static    StaticCache of --max-cache positions, eager, rolled back by moving its position (crop);
  compiled  the same StaticCache with `torch.compile(model.forward)` (one graph per length; compile time apart).
Each forward asks for the tapped hidden states (output_hidden_states) as decoding does. Prints a JSON record with
the CPU (lscpu's model name, family and model) beside the numbers.
"""

import argparse
import json
import statistics
import time

import torch
from transformers import DynamicCache, StaticCache


def median_ms(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return round(1000 * statistics.median(ts), 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--max-cache", type=int, default=512)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from hf_dspark.decoding.machine import cpu_info
    from hf_dspark.io.loading import load_default_target

    model, _ = load_default_target(getattr(torch, a.dtype))
    taps = [2, 15, 28]  # hidden-state indices of the shipped drafter's tapped layers (1, 14, 27) + 1
    prompt = torch.randint(100, 20000, (1, a.context))
    res = {"cpu": cpu_info(), "dtype": a.dtype, "threads": a.threads, "context": a.context,
           "max_cache": a.max_cache, "torch": torch.__version__, "ms": {}, "compile_s": {}}
    with torch.no_grad():
        dyn = model(prompt, use_cache=True).past_key_values
        static = StaticCache(config=model.config, max_cache_len=a.max_cache)
        model(prompt, past_key_values=static, use_cache=True)

        def step(forward, cache, x):
            out = forward(x, past_key_values=cache, use_cache=True, output_hidden_states=True)
            [out.hidden_states[i] for i in taps]
            cache.crop(-x.shape[1])

        compiled = torch.compile(model.forward, dynamic=False)
        for k in a.lengths:
            x = torch.randint(100, 20000, (1, k))
            row = {"dynamic": median_ms(lambda: step(model, dyn, x)),
                   "static": median_ms(lambda: step(model, static, x))}
            t0 = time.perf_counter()
            step(compiled, static, x)
            res["compile_s"][k] = round(time.perf_counter() - t0, 1)
            row["compiled"] = median_ms(lambda: step(compiled, static, x))
            res["ms"][k] = row
            print(k, row, f"compile {res['compile_s'][k]} s", flush=True)
    assert isinstance(dyn, DynamicCache)
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
