"""Plain steps through DSpark's loops against plain generate: the assisted and the static loop with nothing drafted
(verify_policy=0, no n-gram drafts), and both with the defaults. One process, interleaved, outputs checked equal.

    .venv/bin/python research/plain_step_overhead.py [repeats=5] [max_new_tokens=64]
"""
import statistics
import sys
import time

import torch

from hf_dspark import DecodingOptions
from hf_dspark.io.loading import load_target_and_drafter
from hf_dspark.io.prompts import chat_inputs

torch.set_num_threads(2)
model, tok, drafter, _ = load_target_and_drafter(None, None, "float32", "cpu")
N = int(sys.argv[1]) if len(sys.argv) > 1 else 5
T = int(sys.argv[2]) if len(sys.argv) > 2 else 64
prompts = ["Write a short, upbeat blog post about a weekend trip to the mountains.",
           "What are some tips for staying productive when working from home?"]
arms = {
    "assist0": DecodingOptions(verify_policy=0, ngram_drafts=False),
    "static0": DecodingOptions(verify_policy=0, ngram_drafts=False, loop="static"),
    "assist": DecodingOptions(),
    "static": DecodingOptions(loop="static"),
}
gen = dict(do_sample=False, max_new_tokens=T)
for text in prompts:
    inputs = chat_inputs(tok, text)
    model.generate(**inputs, **gen)
    for o in arms.values():
        model.generate(**inputs, **gen, assistant_model=drafter, dspark_options=o)
    times = {k: [] for k in ["plain", *arms]}
    for r in range(N):
        t0 = time.perf_counter(); plain = model.generate(**inputs, **gen); times["plain"].append(time.perf_counter() - t0)
        for k, o in arms.items():
            t0 = time.perf_counter()
            out = model.generate(**inputs, **gen, assistant_model=drafter, dspark_options=o)
            times[k].append(time.perf_counter() - t0)
            assert out.tolist() == plain.tolist(), k
            if r == 0:
                st = drafter.last_stats
                print(k, "rounds", len(st.rounds), "tau", round(st.tau, 2), flush=True)
    n = plain.shape[1] - inputs["input_ids"].shape[1]
    p = statistics.median(times["plain"])
    print(text[:40], n, "tokens; plain", f"{1e3*p/n:.1f} ms/token", " ".join(
        f"{k} {p/statistics.median(v):.3f}x" for k, v in times.items() if k != "plain"), flush=True)
