"""`hf-dspark generate`: answer a prompt with DSpark and compare tokens/s with plain generate."""

from __future__ import annotations

import time

import torch

from ..decoding.options import DecodingOptions
from ..eval import referee
from ..io import loading
from . import common


def add_parser(sub) -> None:
    g = sub.add_parser("generate", help="answer a prompt with DSpark and compare tokens/s with plain generate")
    g.add_argument("prompt")
    common.add_target(g)
    common.add_drafter(g)
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--do-sample", action="store_true")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    common.add_dtype(g)
    g.add_argument("--tie-tolerance", type=float, default=referee.TIE_TOLERANCE,
                   help="bf16/fp16: float32 logits within which a greedy difference from plain counts as a near-tie")
    common.add_device(g)
    common.add_threads(g)
    g.add_argument("--verify", default="scheduler",
                   help="drafts verified per round: scheduler (profiled on first use), all, an int k, threshold:T")
    g.add_argument("--ngram-drafts", action="store_true",
                   help="take free n-gram drafts from the context when its last 2-4 tokens occurred before (lossless)")
    g.set_defaults(func=cmd_generate)


def _timed_generate(model, inputs, **kwargs):
    t0 = time.perf_counter()
    out = model.generate(**inputs, **kwargs)
    return out, time.perf_counter() - t0


def cmd_generate(args) -> int:
    common.set_threads(args)
    model, tok, drafter, what = loading.load_target_and_drafter(args.target, args.drafter, loading.DTYPES[args.dtype],
                                                                args.device)
    drafter.options = DecodingOptions(DecodingOptions.parse(args.verify).verify_policy, args.ngram_drafts)
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
            d = referee.judge_divergence(plain, spec, n_prompt, loading.load_target(args.target, torch.float32, args.device)[0],
                                         args.tie_tolerance)
            print(f"  first difference at new token {d['position']} (0-based): "
                  + (f"a near-tie; every DSpark token from there is within {d['max_gap']:.3f} logits of the float32 "
                     "target's best (identity is claimed for float32)" if d["near_tie"]
                     else f"NOT explained by near-ties: {d.get('reason') or 'max_gap %.3f' % d['max_gap']}"))
            return 0 if d["near_tie"] else 1
        if not same:
            return 1
    return 0
