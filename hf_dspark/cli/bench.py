"""`hf-dspark bench`: DSpark against plain generate, prompt lookup and the DFlash ablation, side by side
(eval/bench.py); writes results.json, results.md and plot.png."""

from __future__ import annotations

import json
from pathlib import Path

from . import common

TIE_TOLERANCE = 0.5  # eval.referee.TIE_TOLERANCE


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="DSpark vs plain generate, prompt lookup and the DFlash ablation, side by side")
    p.add_argument("prompts", nargs="+", help="JSONL prompt files ({'turns': [...]})")
    p.add_argument("--limit", type=common.positive, default=100, help="prompts per file")
    p.add_argument("--holdout", action="store_true",
                   help="only the prompts of training files that training never answers (1 in 20, by id)")
    common.add_target(p)
    common.add_drafter(p)
    p.add_argument("--ablation", help="DFlash-ablation drafter folder (--head none); omitted if not given")
    p.add_argument("--compiled", action="store_true",
                   help="also time plain generate with a static cache and torch.compile (its compile time, on the "
                        "warm-up call, is reported apart); with --static-cache, the first DSpark policy too")
    p.add_argument("--static-cache", action="store_true",
                   help="also time the first DSpark policy on a static KV cache in transformers' assisted loop (eager, "
                        "and compiled with --compiled)")
    p.add_argument("--loops", default="",
                   help="also time the first DSpark policy on DSpark's own loop, comma separated: static, compiled "
                        "(DecodingOptions.loop; compiled: its compile time, on the warm-up call, is reported apart)")
    p.add_argument("--max-new-tokens", type=common.positive, default=256, help="tokens generated per prompt")
    p.add_argument("--do-sample", action="store_true", help="sample (each method reseeded per prompt) instead of greedy")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (with --do-sample)")
    p.add_argument("--prompt-lookup", type=common.non_negative, default=7,
                   help="prompt_lookup_num_tokens of transformers' prompt lookup (0: skip it)")
    p.add_argument("--policies", default="all,auto+ngram",
                   help="DSpark verify policies to run, comma separated (default: verify-all, the old default, and "
                        "auto+ngram, the library's default): auto, all, scheduler, an int k (static length), "
                        "threshold:T (static confidence threshold); a '+ngram' suffix (scheduler+ngram) adds "
                        "n-gram drafts (drafter.options.ngram_drafts)")
    common.add_dtype(p, help="target dtype; below float32 a float32 copy of the target judges greedy mismatches")
    p.add_argument("--tie-tolerance", type=float, default=TIE_TOLERANCE,
                   help="bf16/fp16: largest float32 logit gap at which a greedy mismatch counts as a near-tie")
    common.add_threads(p)
    common.add_output(p, "folder for results.json, results.md, plot.png", default="out/bench")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    import torch

    from ..eval.bench import (Method, dspark_methods, identity_failures, load_prompts, markdown_table, plot,
                              on_loop, run_bench, static_cache)
    from ..io.loading import load_target, load_target_and_drafter
    from ..decoding.assistant import DSparkDrafter

    common.set_threads(args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tok, drafter, _ = load_target_and_drafter(args.target, args.drafter, args.dtype, device)
    # the referee is loaded from the source in float32 (an upcast bf16 copy would be another model), at the first
    # mismatch only
    referee = (None if model.dtype == torch.float32 or args.do_sample
               else lambda: load_target(args.target, torch.float32, device)[0])
    methods = [Method("plain")]
    if args.prompt_lookup:
        methods.append(Method(f"prompt-lookup-{args.prompt_lookup}", {"prompt_lookup_num_tokens": args.prompt_lookup}))
    if args.compiled:
        methods.append(static_cache(model))
    if args.ablation:
        methods.append(Method("dflash-ablation", drafter=DSparkDrafter.from_pretrained(args.ablation, target=model)))
    dspark = dspark_methods(args.policies, drafter)
    methods += dspark
    methods += [on_loop(dspark[0], loop.strip()) for loop in args.loops.split(",") if loop.strip()]
    if args.static_cache:
        methods.append(static_cache(model, dspark[0], compiled=False))
        if args.compiled:
            methods.append(static_cache(model, dspark[0]))
    prompts = load_prompts(args.prompts, args.limit, args.holdout)
    res = run_bench(model, tok, methods, prompts, args.max_new_tokens, args.do_sample, args.temperature,
                    referee=referee, tie_tolerance=args.tie_tolerance)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    table = markdown_table(res)
    (out / "results.md").write_text(table + "\n")
    plot(res, out / "plot.png")
    print(table)
    print("first (warm-up) call per method, seconds, compiling included: "
          + ", ".join(f"{k} {v:.1f}" for k, v in res["warmup_seconds"].items()))
    bad = {n: identity_failures(e["all"]) for n, e in res["methods"].items() if identity_failures(e["all"])}
    if bad:
        print(f"\n!!! GREEDY MISMATCH against plain generate: {bad} (prompt indices) !!!")
        return 1
    ties = {n: e["all"]["near_ties"] for n, e in res["methods"].items() if e["all"].get("near_ties")}
    if ties:
        print(f"\n{args.dtype}: greedy outputs left plain's only by near-ties the float32 referee confirmed "
              f"(every token from the first difference within {args.tie_tolerance} logits of its best): {ties}")
    return 0
