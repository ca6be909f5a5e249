"""What decoding on another thread than the one that set the model up costs (libgomp's spin-wait is cut once it
manages more threads than CPUs). The demo's two prompts, 64 tokens, greedy, 2 torch threads; plain generate and the
defaults (the compiled loop where set up), each call timed alone, outputs checked equal.

    .venv/bin/python research/omp_threads.py main     # set up on the main thread; decode there, then on fresh threads
    .venv/bin/python research/omp_threads.py worker   # everything (set-up included) on one worker thread

Run the two modes one after the other, never side by side: the second needs a process whose main thread never ran
a parallel region.
"""
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from hf_dspark.io.loading import load_target_and_drafter
from hf_dspark.io.prompts import chat_inputs

mode = sys.argv[1] if len(sys.argv) > 1 else "main"
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
PROMPTS = ["Explain speculative decoding in two sentences.",
           "Write a short, upbeat blog post about a weekend trip to the mountains."]
gen = dict(do_sample=False, max_new_tokens=64)


def setup():
    torch.set_num_threads(2)
    model, tok, drafter, _ = load_target_and_drafter(None, None, "float32", "cpu")
    for text in PROMPTS:  # warm-up: the compiled loop loads its graph on its first call
        model.generate(**chat_inputs(tok, text), **gen, assistant_model=drafter)
        model.generate(**chat_inputs(tok, text), **gen)
    return model, tok, drafter


def tok_s(model, inputs, extra):
    t0 = time.perf_counter()
    out = model.generate(**inputs, **gen, **extra)
    return (out.shape[1] - inputs["input_ids"].shape[1]) / (time.perf_counter() - t0), out


def fresh_thread(fn, *args):
    box = {}
    t = threading.Thread(target=lambda: box.update(r=fn(*args)))
    t.start()
    t.join()
    return box["r"]


pool = ThreadPoolExecutor(1)
if mode == "worker":
    model, tok, drafter = pool.submit(setup).result()
    where = {"the set-up thread (a worker; main never ran torch)": lambda fn, *a: pool.submit(fn, *a).result()}
else:
    model, tok, drafter = setup()
    where = {"the set-up thread (main)": lambda fn, *a: fn(*a), "a fresh thread per call": fresh_thread}
print(f"{mode}: {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
for text in PROMPTS:
    inputs = chat_inputs(tok, text)
    for label, run in where.items():
        dspark, plain = [], []
        for _ in range(repeats):
            a, out_a = run(tok_s, model, inputs, dict(assistant_model=drafter))
            b, out_b = run(tok_s, model, inputs, {})
            assert torch.equal(out_a, out_b)
            dspark.append(a)
            plain.append(b)
        d, p = statistics.median(dspark), statistics.median(plain)
        print(f"{text[:40]!r:44} on {label}: defaults {d:.1f} tok/s, plain {p:.1f} tok/s, {d / p:.2f}x "
              f"(loop {drafter.last_stats.loop})", flush=True)
