"""Compile time and step time of the verification forward under `torch.compile` (JIT, as the compiled loop used it
before graphs.py), traced whole ("full") or with each decoder layer marked as a nested compile region
(`torch.compiler.nested_compile_region`, "nested"). SmolLM2-135M, float32,
weight-major products for 2..8 rows (as the loop installs them where the profile chose them), a 1,024-position
static cache holding a ~100-token prompt. Run each mode in its own process, first on an empty inductor cache
(cold) and again on the same one (warm):

    TORCHINDUCTOR_CACHE_DIR=out/inductor_full .venv/bin/python research/nested_regions.py full [repeats=15]

Prints the compile time, then the median time of a verification of 1 (eager), 2, 4 and 8 tokens, compiled and
eager, each in ms, and whether the compiled logits match the eager ones to float rounding.
"""
import statistics
import sys
import time
import types

import torch

from hf_dspark.decoding.linears import WeightMajorLinears
from hf_dspark.decoding.loop import StaticVerifier
from hf_dspark.io.loading import load_target
from hf_dspark.io.prompts import chat_inputs

torch.set_num_threads(2)
mode = sys.argv[1]
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 15
model, tok = load_target(None, "float32", "cpu")
if mode == "nested":
    region = torch.compiler.nested_compile_region(type(model.model.layers[0]).forward)
    for layer in model.model.layers:
        layer.forward = types.MethodType(region, layer)
forms = WeightMajorLinears(model, max_rows=8)
ids = chat_inputs(tok, "Write a short, upbeat blog post about a weekend trip to the mountains. " * 3)["input_ids"]
jit = torch.compile(model.forward)


def compiled(tokens, **kwargs):  # token count and window symbolic: one graph for every length and window
    torch._dynamo.mark_dynamic(tokens, 1, min=2, max=8)
    layer = kwargs["cache"].layers[0]
    torch._dynamo.mark_dynamic(layer.window, 0, min=64, max=layer.max_cache_len - 1)
    return jit(tokens, **kwargs)


with torch.no_grad():
    verifier = StaticVerifier(model, 1024, None, forms=forms)
    verifier.prefill(ids)
    forms.install()
    t0 = time.perf_counter()
    for L in (2, 4, 8):
        verifier._run(compiled, torch.zeros((1, L), dtype=torch.long))
        verifier.cache.crop(-L)
    print(f"{mode}: prompt {ids.shape[1]} tokens, compile {time.perf_counter() - t0:.1f} s", flush=True)
    verifier.forward = compiled
    for L in (1, 2, 4, 8):
        tokens = torch.randint(100, 20000, (1, L), generator=torch.Generator().manual_seed(L))
        times = {"compiled": [], "eager": []}
        for _ in range(repeats):
            for arm, forward in (("compiled", verifier.forward), ("eager", model.forward)):
                t0 = time.perf_counter()
                out = verifier._run(forward if L > 1 else model.forward, tokens.clone())
                times[arm].append(time.perf_counter() - t0)
                verifier.cache.crop(-L)
                logits = out.logits if arm == "compiled" else logits
            if arm == "eager":
                diff = float((out.logits - logits).abs().max())
        print(f"L={L}: compiled {1e3 * statistics.median(times['compiled']):.1f} ms, eager "
              f"{1e3 * statistics.median(times['eager']):.1f} ms, max |Δlogit| {diff:.2e}", flush=True)
