"""The compiled loop with a reserved cache longer than the calls need: the demo's two prompts, 64 tokens, greedy,
plain generate vs the defaults vs the compiled loop, interleaved in one process (outputs checked equal).

    .venv/bin/python research/compiled_window.py [reserve=1024] [repeats=3]
"""
import statistics
import sys
import time

import torch

from hf_dspark import DecodingOptions
from hf_dspark.decoding.loop import reserve
from hf_dspark.io.loading import load_target_and_drafter
from hf_dspark.io.prompts import chat_inputs

torch.set_num_threads(2)
model, tok, drafter, _ = load_target_and_drafter(None, None, "float32", "cpu")
positions = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
reserve(model, positions)
gen = dict(do_sample=False, max_new_tokens=64)
arms = {"defaults": {}, "compiled": dict(dspark_options=DecodingOptions(loop="compiled"))}
for text in ["Write a short, upbeat blog post about a weekend trip to the mountains.",
             "What are some tips for staying productive when working from home?"]:
    inputs = chat_inputs(tok, text)
    model.generate(**inputs, **gen)
    for name, kw in arms.items():
        t0 = time.perf_counter()
        model.generate(**inputs, **gen, assistant_model=drafter, **kw)
        print(f"warm-up {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    times = {k: [] for k in ["plain", *arms]}
    for _ in range(repeats):
        t0 = time.perf_counter()
        plain = model.generate(**inputs, **gen)
        times["plain"].append(time.perf_counter() - t0)
        for name, kw in arms.items():
            t0 = time.perf_counter()
            out = model.generate(**inputs, **gen, assistant_model=drafter, **kw)
            times[name].append(time.perf_counter() - t0)
            assert out.tolist() == plain.tolist(), name
    p = statistics.median(times["plain"])
    print(f"{text[:40]} (cache {model.__dict__['_dspark_static_cache'][2]}): plain {p:.2f} s; "
          + " ".join(f"{k} {p / statistics.median(v):.3f}x" for k, v in times.items() if k != "plain"), flush=True)
