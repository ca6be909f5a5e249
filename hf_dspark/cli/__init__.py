"""`hf-dspark` command line: one subcommand per task, each a thin wrapper over a Python function."""

from __future__ import annotations

import argparse
import sys
import time

import torch

from ..eval.referee import TIE_TOLERANCE


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}  # --dtype names


def _dtype(name: str) -> torch.dtype:
    return DTYPES[name]


def load_target(target: str | None, dtype: torch.dtype, device: str):
    """(model, tokenizer) for a target id/folder (None = embedded SmolLM2), DSpark-enabled, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..io import loading as models
    from ..decoding.candidate import enable

    if target is None:
        return models.load_default_target(dtype=dtype, device=device)
    return enable(AutoModelForCausalLM.from_pretrained(target, dtype=dtype).to(device).eval()), AutoTokenizer.from_pretrained(target)


def load_target_and_drafter(target: str | None, drafter: str | None, dtype: torch.dtype, device: str):
    """(model, tokenizer, drafter, drafter_description) for a target id/folder (None = embedded SmolLM2)."""
    from ..io import loading as models
    from ..model.drafter import DSparkDrafter

    model, tok = load_target(target, dtype, device)
    if drafter is not None:
        return model, tok, DSparkDrafter.from_pretrained(drafter, target=model), drafter
    shipped = getattr(models, "load_default_drafter", None)
    if target is None and shipped is not None:
        return model, tok, shipped(model), "shipped SmolLM2 drafter"
    print("warning: no trained drafter given; using a RANDOM drafter (τ≈1, slower than plain generate). "
          "Train one with `hf-dspark train` or pass --drafter.", file=sys.stderr)
    return model, tok, DSparkDrafter.from_target(model), "random (untrained) drafter"


def _policy(text: str):
    """'all' | 'scheduler' | an int k | 'threshold:T' → drafter.verify_policy."""
    if text.startswith("threshold:"):
        return ("threshold", float(text.split(":", 1)[1]))
    return int(text) if text.isdigit() else text


def _timed_generate(model, inputs, **kwargs):
    t0 = time.perf_counter()
    out = model.generate(**inputs, **kwargs)
    return out, time.perf_counter() - t0


def cmd_generate(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok, drafter, what = load_target_and_drafter(args.target, args.drafter, _dtype(args.dtype), args.device)
    drafter.verify_policy, drafter.ngram_drafts = _policy(args.verify), args.ngram_drafts
    messages = [{"role": "user", "content": args.prompt}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) if tok.chat_template else args.prompt
    inputs = tok(text, return_tensors="pt").to(model.device)
    sampling = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p) if args.do_sample else dict(do_sample=False)
    gen = dict(max_new_tokens=args.max_new_tokens, **sampling)
    # Warm-up both paths on a short run so neither pays first-call costs in the timing.
    model.generate(**inputs, max_new_tokens=8, do_sample=False)
    model.generate(**inputs, max_new_tokens=8, do_sample=False, assistant_model=drafter)
    if args.do_sample:
        torch.manual_seed(args.seed)
    plain, t_plain = _timed_generate(model, inputs, **gen)
    if args.do_sample:
        torch.manual_seed(args.seed)
    spec, t_spec = _timed_generate(model, inputs, assistant_model=drafter, **gen)
    n_prompt = inputs["input_ids"].shape[1]
    answer = tok.decode(spec[0, n_prompt:], skip_special_tokens=True)
    n_plain, n_spec = plain.shape[1] - n_prompt, spec.shape[1] - n_prompt
    st = drafter.last_stats
    print(answer)
    print("-" * 72)
    print(f"target: {args.target or 'SmolLM2-135M-Instruct (embedded)'} [{args.dtype}, {model.device}]; drafter: {what}")
    print(f"plain generate : {n_plain:4d} tokens in {t_plain:6.2f} s = {n_plain / t_plain:6.1f} tok/s")
    print(f"DSpark         : {n_spec:4d} tokens in {t_spec:6.2f} s = {n_spec / t_spec:6.1f} tok/s "
          f"({(n_spec / t_spec) / (n_plain / t_plain):.2f}x)")
    print(f"verify policy: {args.verify}{' + n-gram drafts' if args.ngram_drafts else ''}; "
          f"verified drafts per round: {st.verify_lengths}")
    print(f"τ (accepted per round, incl. bonus) = {st.tau:.2f} over {len(st.rounds)} rounds "
          f"({st.drafted_rounds} drafted, {st.ngram_rounds} of them n-gram drafts); "
          f"conditional acceptance by position = {[round(x, 2) for x in st.conditional_acceptance]}")
    if args.do_sample:
        print("sampling: outputs are draws from the same distribution, not expected to be identical")
    else:
        same = torch.equal(plain, spec)
        print(f"greedy output identical to plain generate: {same}")
        if not same and model.dtype != torch.float32:
            # bf16/fp16 round a 1-token and a multi-token forward differently: judge the first difference
            from ..eval import referee

            d = referee.judge_divergence(plain, spec, n_prompt, load_target(args.target, torch.float32, args.device)[0],
                                         args.tie_tolerance)
            print(f"  first difference at new token {d['position']} (0-based): "
                  + (f"a near-tie; every DSpark token from there is within {d['max_gap']:.3f} logits of the float32 "
                     "target's best (identity is claimed for float32)" if d["near_tie"]
                     else f"NOT explained by near-ties: {d.get('reason') or 'max_gap %.3f' % d['max_gap']}"))
            return 0 if d["near_tie"] else 1
        if not same:
            return 1
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hf-dspark", description="DSpark speculative decoding for transformers")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="answer a prompt with DSpark and compare tokens/s with plain generate")
    g.add_argument("prompt")
    g.add_argument("--target", help="model id or folder (default: the embedded SmolLM2-135M-Instruct)")
    g.add_argument("--drafter", help="drafter folder (default: the shipped drafter for the default target)")
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--do-sample", action="store_true")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--dtype", default="float32", choices=list(DTYPES))
    g.add_argument("--tie-tolerance", type=float, default=TIE_TOLERANCE,
                   help="bf16/fp16: float32 logits within which a greedy difference from plain counts as a near-tie")
    g.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    g.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    g.add_argument("--verify", default="scheduler",
                   help="drafts verified per round: scheduler (profiled on first use), all, an int k, threshold:T")
    g.add_argument("--ngram-drafts", action="store_true",
                   help="take free n-gram drafts from the context when its last 2-4 tokens occurred before (lossless)")
    g.set_defaults(func=cmd_generate)

    # Other subcommands register themselves here (one line each).
    from ..training import data as _data; _data.add_parser(sub)  # noqa: E702
    from ..decoding import profile as _profile; _profile.add_profile_parser(sub)  # noqa: E702
    from ..training import trainer as _train; _train.add_parser(sub)  # noqa: E702
    from ..training import calibration as _calib; _calib.add_parser(sub)  # noqa: E702
    from ..model import deepspec as _deepspec; _deepspec.add_parser(sub)  # noqa: E702
    from . import demo as _demo; _demo.add_parser(sub)  # noqa: E702
    from ..eval import bench as _bench; _bench.add_parser(sub)  # noqa: E702
    from ..eval import replay as _replay; _replay.add_parser(sub)  # noqa: E702

    args = parser.parse_args(argv)
    return args.func(args)
