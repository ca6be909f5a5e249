"""Drafter micro-benchmark: the Triton kernels vs the PyTorch reference, per round (docs/kernels.md).

  python scripts/bench_kernels.py --ops            # op counts per phase of a round (any device; why these fusions)
  python scripts/bench_kernels.py                  # CUDA: timings per phase and per generate() round

A random SmolLM2-135M-shaped target (d=576, V=49152; --layers target layers) and a fresh drafter: no
download, the timings only depend on shapes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper

from hf_dspark import DSparkDrafter
from hf_dspark.model.heads import draft_block


def build(device, dtype, layers, vocab, draft_vocab):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                      tie_word_embeddings=True, eos_token_id=None, pad_token_id=None, bos_token_id=None)
    target = LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()
    target.generation_config.eos_token_id = None
    taps = sorted({1, layers // 3, 2 * layers // 3, layers - 3} - {layers - 1})
    drafter = DSparkDrafter.from_target(target, block_size=7, target_layer_ids=taps, head_type="markov",
                                        markov_rank=128, mask_token_id=0)
    if draft_vocab:
        drafter.set_draft_vocab(range(draft_vocab))
    return target, drafter


def round_inputs(drafter, n=7, ctx_rows=4):
    d, dev = drafter.config.hidden_size, drafter.device
    g = torch.Generator(device="cpu").manual_seed(1)
    h = torch.randn(n, d, generator=g).to(dev, drafter.dtype)
    feats = torch.randn(1, ctx_rows, d * len(drafter.config.target_layer_ids), generator=g).to(dev, drafter.dtype)
    vocab, lm_rows, w2 = drafter.draft_weights()
    return h, feats, vocab, lm_rows, w2


def draft_fn(drafter, h, vocab, lm_rows, w2, sample):
    procs = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(50)]) if sample else None
    prefix = torch.tensor([[5, 6, 7]], device=drafter.device)
    anchor = torch.tensor(7, device=drafter.device)
    base = drafter.base_logits(h, lm_rows)
    return lambda: draft_block(base, h, anchor, drafter.markov_head, drafter.confidence_head, prefix, procs, sample,
                               vocab=vocab, w2=w2, vocab_size=drafter.config.vocab_size)


def timeit(fn, reps=50):
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(3):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps * 1e6


def with_backend(name, fn):
    old = os.environ.get("HF_DSPARK_KERNELS")
    os.environ["HF_DSPARK_KERNELS"] = name
    try:
        return fn()
    finally:
        os.environ.pop("HF_DSPARK_KERNELS") if old is None else os.environ.__setitem__("HF_DSPARK_KERNELS", old)


def count_ops(fn):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::") and e.cpu_time_total > 0
               and e.key not in ("aten::empty", "aten::view", "aten::as_strided", "aten::t", "aten::transpose",
                                 "aten::expand", "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze",
                                 "aten::reshape", "aten::_reshape_alias", "aten::lift_fresh", "aten::detach",
                                 "aten::alias", "aten::resolve_conj", "aten::resolve_neg", "aten::_unsafe_view",
                                 "aten::empty_strided", "aten::result_type", "aten::contiguous"))


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", action="store_true", help="count aten ops per phase (a proxy for CUDA launches)")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--draft-vocab", type=int, default=16384)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (TRITON_INTERPRET=1): checks this script")
    a = ap.parse_args()
    torch.set_num_threads(1 if a.ops else torch.get_num_threads())
    cuda = torch.cuda.is_available() and not a.smoke
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    if a.smoke:
        a.layers, a.vocab, a.draft_vocab, a.new_tokens = 4, 512, 256, 8
    if a.ops:  # small shapes: counts do not depend on them
        a.layers, a.vocab, a.draft_vocab = 6, 512, 0
    target, dr = build(dev, dtype, a.layers, a.vocab, a.draft_vocab)
    h, feats, vocab, lm_rows, w2 = round_inputs(dr)
    n = h.shape[0]
    pos = torch.arange(4)[None].to(dev)
    kv = dr.context_kv(feats, pos)
    ids = torch.full((1, n), 5, device=dev)
    phases = {
        "context fusion (fc+RMSNorm)": lambda: dr.fuse_context(feats),
        "context K/V (fusion + per-layer k,v)": lambda: dr.context_kv(feats, pos),
        "backbone (γ slots)": lambda: dr.backbone(dr.embed(ids), pos[:, :1] + torch.arange(n, device=dev), kv),
        "base logits (LM-head rows)": lambda: dr.base_logits(h, lm_rows),
        "sequential draft, greedy": draft_fn(dr, h, vocab, lm_rows, w2, False),
        "sequential draft, T=0.7 top-k 50": draft_fn(dr, h, vocab, lm_rows, w2, True),
        "whole round (drafter.draft), greedy": lambda: dr.draft(kv, ids[:, :4], n),
    }
    if a.ops:
        print(f"aten ops per phase of one round (γ={n}, PyTorch path):")
        for name, fn in phases.items():
            print(f"  {name:40s} {with_backend('torch', lambda fn=fn: count_ops(fn)):5d}")
        return
    if not cuda and not a.smoke:
        raise SystemExit("timings need CUDA; use --ops on CPU")
    reps = 2 if a.smoke else 50
    name = torch.cuda.get_device_name() if cuda else "CPU smoke run"
    print(f"µs per call (γ={n}, V={a.vocab}, V'={a.draft_vocab or a.vocab}, {str(dtype)[6:]}, {name}):")
    print(f"  {'phase':40s} {'torch':>9s} {'triton':>9s} {'speedup':>8s}")
    for name, fn in phases.items():
        t_torch = with_backend("torch", lambda fn=fn: timeit(fn, reps))
        t_tri = with_backend("auto" if cuda else "triton", lambda fn=fn: timeit(fn, reps))
        print(f"  {name:40s} {t_torch:9.1f} {t_tri:9.1f} {t_torch / t_tri:7.2f}x")
    prompt = torch.randint(1, a.vocab, (1, 32), device=dev)
    print(f"generate(max_new_tokens={a.new_tokens}), drafter time per round (mean over rounds, ms):")
    for mode, gen in (("greedy", {"do_sample": False}), ("sample", {"do_sample": True, "temperature": 0.7, "top_k": 50})):
        row = {}
        for b in ("torch", "auto" if cuda else "triton"):
            def run(gen=gen):
                target.generate(prompt, max_new_tokens=a.new_tokens, assistant_model=dr, **gen)
                return [r.draft_time for r in dr.last_stats.rounds if r.drafted and r.source == "dspark"]
            with_backend(b, run)  # warm-up (compilation)
            row["triton" if b != "torch" else b] = statistics.mean(with_backend(b, run)) * 1e3
        print(f"  {mode:8s} torch {row['torch']:.3f}  triton {row['triton']:.3f}  "
              f"speedup {row['torch'] / row['triton']:.2f}x")
    end_to_end(dev, a.vocab, 256 if a.smoke else 4096, "auto" if cuda else "triton")


@torch.no_grad()
def end_to_end(dev, vocab, draft_vocab, kernels):
    """Greedy identity on the GPU, kernels on: an fp32 target with sharpened logits (a random bf16 model's
    near-ties can flip between the batched verification pass and plain decoding, kernels or not)."""
    target, dr = build(dev, torch.float32, 4, vocab, draft_vocab)
    target.lm_head.weight.mul_(30.0)  # tied: the embedding too; only sharper logits matter here
    prompt = torch.randint(1, vocab, (1, 16), generator=torch.Generator().manual_seed(0)).to(dev)
    plain = target.generate(prompt, do_sample=False, max_new_tokens=48)
    outs = {b: with_backend(b, lambda: target.generate(prompt, do_sample=False, max_new_tokens=48, assistant_model=dr))
            for b in (kernels, "torch")}
    rounds = len(dr.last_stats.rounds)
    print(f"end-to-end greedy identity (fp32, 48 tokens, {rounds} rounds): kernels {outs[kernels].equal(plain)}, "
          f"torch {outs['torch'].equal(plain)}")
    torch.manual_seed(0)
    out = with_backend(kernels, lambda: target.generate(prompt, do_sample=True, temperature=0.7, top_k=50,
                                                       max_new_tokens=48, assistant_model=dr))
    print(f"end-to-end sampling (T=0.7, top-k 50) on the kernel path: {out.shape[1] - 16} tokens, "
          f"tau {dr.last_stats.tau:.2f}")


if __name__ == "__main__":
    main()
