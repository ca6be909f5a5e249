"""`hf-dspark generate`: answer a prompt with DSpark and compare tokens/s with plain generate, over a few prompts.

What a first run prints must be a measurement, not noise: the device profile is resolved (measured once, if
needed) before anything is timed, both methods are warmed up after it, the ratio is pooled over several prompts
(a small built-in set of math, code and chat prompts, or --prompts FILE) with the methods interleaved, and the
output says what was measured and whether other work was competing for the CPU.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from ..decoding.options import DecodingOptions
from ..decoding.verify_policy import VerifyPolicy
from ..eval import referee
from ..io import loading
from ..io.prompts import chat_inputs, read_prompts
from . import common

# The timing set when no --prompts FILE is given: written for this command (not taken from any eval set), two each
# of math, code and chat, so the printed ratio is not one prompt's luck.
PROMPTS = [
    "A train leaves at 9:15 and arrives at 11:45. It travels 150 km. What is its average speed in km/h?",
    "Tom has 3 boxes with 12 pencils each. He gives away 15 pencils. How many pencils does he have left?",
    "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
    "Write a Python function that returns the n-th Fibonacci number using a loop.",
    "Give me three tips for sleeping better.",
    "Explain in a few sentences why the sky is blue.",
]


def add_parser(sub) -> None:
    g = sub.add_parser("generate", help="answer a prompt with DSpark and compare tokens/s with plain generate")
    g.add_argument("prompt", nargs="?", help="prompt to answer and show (also timed, first)")
    g.add_argument("--prompts", help="timing set instead of the built-in one: a text file (one prompt a line) or "
                                     "JSONL ({'turns': [prompt]} or {'prompt': ...})")
    common.add_target(g)
    common.add_drafter(g)
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--repeats", type=int, default=1, help="timed passes over the prompt set")
    g.add_argument("--warmup", type=int, default=1, help="untimed runs per method before timing (after profiling)")
    g.add_argument("--do-sample", action="store_true")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    common.add_dtype(g, default="auto", help="target dtype (auto: whichever of float32 and bf16 decodes faster "
                                             "here, measured once; the token-identity claim covers float32)")
    g.add_argument("--tie-tolerance", type=float, default=referee.TIE_TOLERANCE,
                   help="bf16/fp16: float32 logits within which a greedy difference from plain counts as a near-tie")
    common.add_device(g)
    common.add_threads(g)
    g.add_argument("--verify", default="auto",
                   help="drafts verified per round: auto (default: the scheduler and its draft gate on this device's "
                        "profile), scheduler, all, an int k, threshold:T")
    g.add_argument("--ngram-drafts", action=argparse.BooleanOptionalAction, default=True,
                   help="take free n-gram drafts from the context when its last 2-4 tokens occurred before "
                        "(lossless; default on)")
    g.set_defaults(func=cmd_generate)


def _timed_generate(model, inputs, clock=time.perf_counter, **kwargs):
    t0 = clock()
    out = model.generate(**inputs, **kwargs)
    return out, clock() - t0


def time_methods(model, drafter, prompts: list[dict], gen: dict, repeats: int = 1, warmup: int = 1, seed: int = 0,
                 clock=time.perf_counter) -> dict:
    """Plain generate and DSpark over `prompts` (tokenized inputs), pooled. Order: the device profile first (a
    scheduler policy measures it on first use: that must not happen inside a timed run), then `warmup` untimed
    runs of each method, then `repeats` passes with the methods interleaved per prompt (alternating which goes
    first, so drift hits both). → {"plain"/"dspark": {"tokens", "seconds"}, "outputs": [(plain, dspark)] of the
    first pass, "rounds": the DSpark rounds of every timed run, "runs": timed runs per method}."""
    VerifyPolicy.for_drafter(drafter, model)  # resolves, and if needed measures, the profile now
    warm = dict(gen, max_new_tokens=min(32, gen["max_new_tokens"]))
    for _ in range(warmup):
        model.generate(**prompts[0], **warm)
        model.generate(**prompts[0], assistant_model=drafter, **warm)
    res = {"plain": {"tokens": 0, "seconds": 0.0}, "dspark": {"tokens": 0, "seconds": 0.0}, "outputs": [],
           "rounds": [], "runs": 0}
    for rep in range(repeats):
        for i, inputs in enumerate(prompts):
            n_prompt = inputs["input_ids"].shape[1]
            pair = {}
            for method in (("plain", "dspark") if (rep + i) % 2 == 0 else ("dspark", "plain")):
                extra = {"assistant_model": drafter} if method == "dspark" else {}
                if gen.get("do_sample"):
                    torch.manual_seed(seed + i)
                out, secs = _timed_generate(model, inputs, clock=clock, **gen, **extra)
                res[method]["tokens"] += out.shape[1] - n_prompt
                res[method]["seconds"] += secs
                pair[method] = out
                if method == "dspark":
                    res["rounds"] += drafter.last_stats.rounds
            if rep == 0:
                res["outputs"].append((pair["plain"], pair["dspark"]))
        res["runs"] += len(prompts)
    return res


def busy_note(threads: int) -> str:
    """' (machine busy: load L > N threads)' when the 1-minute load average exceeds the thread count, else ''."""
    load = os.getloadavg()[0]
    return f"  (machine busy: load {load:.1f} > {threads} threads; the ratio is not a quiet-machine figure)" \
        if load > threads else ""


def cmd_generate(args) -> int:
    common.set_threads(args)
    dtype_note = ""
    if args.dtype == "auto":
        dtype, why = loading.decode_dtype(args.target or loading.default_target_path(), args.device)
        dtype_note = f" (auto: {why})"
    else:
        dtype = loading.resolve_dtype(args.dtype, args.device)
    model, tok, drafter, what = loading.load_target_and_drafter(args.target, args.drafter, dtype, args.device)
    drafter.options = DecodingOptions(DecodingOptions.parse(args.verify).verify_policy, args.ngram_drafts)
    texts = ([args.prompt] if args.prompt else []) + ([t for _, t in read_prompts(args.prompts)] if args.prompts else PROMPTS)

    prompts = [chat_inputs(tok, t, model.device) for t in texts]
    sampling = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p) if args.do_sample else dict(do_sample=False)
    gen = dict(max_new_tokens=args.max_new_tokens, **sampling)
    res = time_methods(model, drafter, prompts, gen, repeats=args.repeats, warmup=args.warmup, seed=args.seed)

    n_prompt = prompts[0]["input_ids"].shape[1]
    plain0, spec0 = res["outputs"][0]
    print(texts[0])
    print(tok.decode(spec0[0, n_prompt:], skip_special_tokens=True))
    print("-" * 72)
    dt = str(model.dtype).removeprefix("torch.")
    print(f"target: {args.target or 'SmolLM2-135M-Instruct (embedded)'} [{dt}{dtype_note}, {model.device}]; "
          f"drafter: {what}")
    print(f"measured: {len(prompts)} prompt(s) × up to {args.max_new_tokens} new tokens, {args.repeats} timed "
          f"repeat(s), methods interleaved, after the device profile and {args.warmup} warm-up run(s) per method "
          f"({'the built-in math/code/chat set' if args.prompts is None else args.prompts}"
          f"{' + your prompt' if args.prompt else ''}), {torch.get_num_threads()} threads")
    p, s = res["plain"], res["dspark"]
    ratio = (s["tokens"] / s["seconds"]) / (p["tokens"] / p["seconds"])
    print(f"plain generate : {p['tokens']:5d} tokens in {p['seconds']:6.2f} s = {p['tokens'] / p['seconds']:6.1f} tok/s")
    print(f"DSpark         : {s['tokens']:5d} tokens in {s['seconds']:6.2f} s = {s['tokens'] / s['seconds']:6.1f} tok/s "
          f"({ratio:.2f}x){busy_note(torch.get_num_threads())}")
    rounds = res["rounds"]
    lengths: dict[int, int] = {}
    for r in rounds:
        lengths[r.verified] = lengths.get(r.verified, 0) + 1
    drafted = sum(r.drafted > 0 for r in rounds)
    ngram = sum(r.source == "ngram" for r in rounds)
    tau = sum(r.committed for r in rounds) / max(1, len(rounds))
    print(f"verify policy: {args.verify}{' + n-gram drafts' if args.ngram_drafts else ''}; "
          f"verified drafts per round: {dict(sorted(lengths.items()))}")
    print(f"τ (accepted per round, incl. bonus) = {tau:.2f} over {len(rounds)} rounds "
          f"({drafted} drafted, {ngram} of them n-gram drafts)")
    if args.do_sample:
        print("sampling: outputs are draws from the same distribution, not expected to be identical")
        return 0
    differ = [i for i, (a, b) in enumerate(res["outputs"]) if not torch.equal(a, b)]
    print(f"greedy output identical to plain generate: {not differ}"
          + (f" ({len(res['outputs']) - len(differ)} of {len(res['outputs'])} prompts)" if len(prompts) > 1 else ""))
    if not differ:
        return 0
    if model.dtype == torch.float32:
        return 1
    # bf16/fp16 round a 1-token and a multi-token forward differently: judge each first difference in float32
    judge_model = loading.load_target(args.target, torch.float32, args.device)[0]
    ok = True
    for i in differ:
        a, b = res["outputs"][i]
        d = referee.judge_divergence(a, b, prompts[i]["input_ids"].shape[1], judge_model, args.tie_tolerance)
        ok &= bool(d["near_tie"])
        print(f"  prompt {i}: first difference at new token {d['position']} (0-based): "
              + (f"a near-tie; every DSpark token from there is within {d['max_gap']:.3f} logits of the float32 "
                 "target's best (identity is claimed for float32)" if d["near_tie"]
                 else f"NOT explained by near-ties: {d.get('reason') or 'max_gap %.3f' % d['max_gap']}"))
    return 0 if ok else 1
