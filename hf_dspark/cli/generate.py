"""`hf-dspark generate`: answer a prompt with DSpark, streamed token by token, then compare tokens/s with plain
generate over a few prompts.

The answer is printed as it is generated. The comparison that follows must be a measurement, not noise: the
device profile is resolved (measured once, if needed) before anything is timed, both methods are warmed up, the
ratio is pooled over several prompts (your prompt plus a small built-in set of math, code and chat prompts, or
--prompts FILE) with the methods interleaved, and the output says whether other work competed for the CPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

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
    g = sub.add_parser("generate", help="answer a prompt with DSpark (streamed), then compare with plain generate")
    g.add_argument("prompt", nargs="?", help="prompt to answer (streamed, and timed first in the comparison)")
    g.add_argument("--prompts", help="timing set instead of the built-in one: a .jsonl file ({'turns': [prompt]} or "
                                     "{'prompt': ...} a line) or a text file (one prompt a line)")
    common.add_target(g)
    common.add_drafter(g)
    g.add_argument("--max-new-tokens", type=common.positive, default=128, help="tokens to generate per prompt")
    g.add_argument("--compare", action=argparse.BooleanOptionalAction, default=True,
                   help="after the answer, time DSpark against plain generate over the prompt set")
    g.add_argument("--repeats", type=common.positive, default=1, help="timed passes over the prompt set")
    g.add_argument("--warmup", type=common.non_negative, default=1,
                   help="untimed runs per method before timing (after profiling)")
    g.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (with --do-sample)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (with --do-sample)")
    g.add_argument("--seed", type=int, default=0, help="sampling seed (each timed prompt reseeds with seed + index)")
    common.add_dtype(g, default="auto", help="target dtype (auto: whichever of float32 and bf16 decodes faster "
                                             "here, measured once; the token-identity claim covers float32)")
    g.add_argument("--tie-tolerance", type=float, default=0.5,
                   help="bf16/fp16: float32 logits within which a greedy difference from plain counts as a near-tie")
    common.add_device(g)
    common.add_threads(g)
    g.add_argument("--verify", default="auto",
                   help="drafts verified per round: auto (the scheduler and its draft gate on this device's "
                        "profile), scheduler, all, an int k, threshold:T")
    g.add_argument("--ngram-drafts", action=argparse.BooleanOptionalAction, default=True,
                   help="take free n-gram drafts from the context when its last 2-4 tokens occurred before (lossless)")
    g.add_argument("--loop", choices=common.LOOPS, default="auto",
                   help="decoding loop: auto (DSpark's compiled loop once `hf-dspark profile` has set it up on this "
                        "machine, else transformers' assisted loop), assisted, or DSpark's own on a static KV cache, "
                        "its verification eager (static) or compiled (compiled: its graph is compiled once per setup, "
                        "minutes on a CPU, and saved under $HF_DSPARK_CACHE/graphs; later runs load it in seconds)")
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
    import torch
    from tqdm.auto import tqdm

    from ..decoding.policy import VerifyPolicy

    VerifyPolicy.for_call(drafter, model)  # resolves, and if needed measures, the profile now
    warm = dict(gen, max_new_tokens=min(32, gen["max_new_tokens"]))
    for _ in range(warmup):
        model.generate(**prompts[0], **warm)
        model.generate(**prompts[0], assistant_model=drafter, **warm)
    res = {"plain": {"tokens": 0, "seconds": 0.0}, "dspark": {"tokens": 0, "seconds": 0.0}, "outputs": [],
           "rounds": [], "runs": 0}
    bar = tqdm(total=repeats * len(prompts), desc="timing DSpark vs plain", unit="prompt", leave=False)
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
            bar.update(1)
        res["runs"] += len(prompts)
    bar.close()
    return res


def busy_note(threads: int) -> str:
    """' (machine busy: load L > N threads)' when the 1-minute load average exceeds the thread count, else ''."""
    load = os.getloadavg()[0]
    return f"  (machine busy: load {load:.1f} > {threads} threads; the ratio is not a quiet-machine figure)" \
        if load > threads else ""


def stream_answer(model, tok, drafter, inputs: dict, gen: dict) -> tuple:
    """Generate with DSpark, printing the answer as it comes → (output ids, seconds)."""
    from transformers import TextStreamer

    streamer = TextStreamer(tok, skip_prompt=True, skip_special_tokens=True)
    t0 = time.perf_counter()
    out = model.generate(**inputs, assistant_model=drafter, streamer=streamer, **gen)
    return out, time.perf_counter() - t0


def identity_sentence(res: dict, prompts: list[dict], model, target, device, tolerance: float) -> tuple[str, bool]:
    """The greedy identity verdict as a sentence, and whether it holds (float32: token for token; bf16/fp16:
    every difference a near-tie the float32 target confirms)."""
    import torch

    from ..eval import referee
    from ..io import loading

    n = len(res["outputs"])
    differ = [i for i, (a, b) in enumerate(res["outputs"]) if not torch.equal(a, b)]
    if not differ:
        return f"greedy output identical to plain generate on all {n} prompts.", True
    if model.dtype == torch.float32:
        return (f"greedy output DIFFERS from plain generate on {len(differ)} of {n} prompts ({differ}) in float32: "
                "that is a bug, please report it."), False
    judge = loading.load_target(target, torch.float32, device)[0]
    verdicts = [referee.judge_divergence(*res["outputs"][i], prompts[i]["input_ids"].shape[1], judge, tolerance)
                for i in differ]
    if all(d["near_tie"] for d in verdicts):
        gap = max(d["max_gap"] for d in verdicts)
        return (f"greedy output identical to plain generate on {n - len(differ)} of {n} prompts; the other "
                f"{len(differ)} differ only at {str(model.dtype).removeprefix('torch.')} near-ties (every token within "
                f"{gap:.3f} logits of the float32 target's best). Identity is claimed, and holds, in float32."), True
    bad = [i for i, d in zip(differ, verdicts) if not d["near_tie"]]
    return (f"greedy output differs from plain generate on prompts {bad} beyond near-ties "
            f"(tolerance {tolerance} logits): that is a bug, please report it."), False


def cmd_generate(args) -> int:
    import torch

    from ..decoding.options import DecodingOptions
    from ..decoding.stats import DSparkStats
    from ..decoding.policy import VerifyPolicy
    from ..io import loading
    from ..io.prompts import chat_inputs, read_prompts

    texts = ([args.prompt] if args.prompt else []) + ([t for _, t in read_prompts(args.prompts)] if args.prompts
                                                      else PROMPTS)  # read first: a bad file costs no loading
    common.set_threads(args)
    device = common.device(args)
    dtype_note = ""
    if args.dtype == "auto":
        source = loading.existing(args.target, "target") if args.target else loading.default_target_path()
        dtype, why = loading.decode_dtype(source, device)
        dtype_note = f" (auto: {why})"
    else:
        dtype = loading.resolve_dtype(args.dtype, device)
    model, tok, drafter, what = loading.load_target_and_drafter(args.target, args.drafter, dtype, device)
    drafter.options = DecodingOptions(DecodingOptions.parse(args.verify).verify_policy, args.ngram_drafts,
                                      loop=args.loop)
    dt = str(model.dtype).removeprefix("torch.")
    print(f"target: {args.target or 'SmolLM2-135M-Instruct (embedded)'} [{dt}{dtype_note}, {model.device}]; "
          f"drafter: {what}", file=sys.stderr)
    VerifyPolicy.for_call(drafter, model)  # the device profile: measured once per machine, before any timing
    sampling = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p) if args.do_sample \
        else dict(do_sample=False)
    gen = dict(max_new_tokens=args.max_new_tokens, **sampling)

    if args.prompt:
        inputs = chat_inputs(tok, args.prompt, model.device)
        if args.do_sample:
            torch.manual_seed(args.seed)
        out, secs = stream_answer(model, tok, drafter, inputs, gen)
        st = drafter.last_stats
        new = out.shape[1] - inputs["input_ids"].shape[1]
        print(f"\n[{new} tokens in {secs:.2f} s = {new / secs:.1f} tok/s with DSpark; τ = {st.tau:.2f} tokens per "
              f"round over {len(st.rounds)} rounds; first call: includes warm-up]", file=sys.stderr)
    if not args.compare:
        return 0

    prompts = [chat_inputs(tok, t, model.device) for t in texts]
    res = time_methods(model, drafter, prompts, gen, repeats=args.repeats, warmup=args.warmup, seed=args.seed)
    print("-" * 72)
    print(f"measured: {len(prompts)} prompt(s) × up to {args.max_new_tokens} new tokens, {args.repeats} timed "
          f"repeat(s), methods interleaved, after the device profile and {args.warmup} warm-up run(s) per method "
          f"({'the built-in math/code/chat set' if args.prompts is None else args.prompts}"
          f"{' + your prompt' if args.prompt else ''}), {torch.get_num_threads()} threads")
    p, s = res["plain"], res["dspark"]
    ratio = (s["tokens"] / s["seconds"]) / (p["tokens"] / p["seconds"])
    print(f"plain generate : {p['tokens']:5d} tokens in {p['seconds']:6.2f} s = {p['tokens'] / p['seconds']:6.1f} tok/s")
    print(f"DSpark         : {s['tokens']:5d} tokens in {s['seconds']:6.2f} s = {s['tokens'] / s['seconds']:6.1f} tok/s "
          f"({ratio:.2f}x){busy_note(torch.get_num_threads())}")
    pooled = DSparkStats(block_size=drafter.config.block_size, rounds=res["rounds"])
    ran = drafter.last_stats.loop if drafter.last_stats is not None else args.loop
    print(f"verify policy: {args.verify}{' + n-gram drafts' if args.ngram_drafts else ''}; "
          f"verified drafts per round: {pooled.verify_lengths}; loop: {ran}"
          + (" (auto)" if args.loop == "auto" else ""))
    print(f"τ (tokens committed per round) = {pooled.tau:.2f} over {len(pooled.rounds)} rounds "
          f"({pooled.drafted_rounds} drafted, {pooled.ngram_rounds} of them n-gram drafts)")
    if args.do_sample:
        print("sampling: outputs are draws from the same distribution, not expected to be identical")
        return 0
    sentence, ok = identity_sentence(res, prompts, model, args.target, device, args.tie_tolerance)
    print(sentence)
    return 0 if ok else 1
