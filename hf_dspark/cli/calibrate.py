"""`hf-dspark calibrate`: fit per-position confidence temperatures (STS, training/calibration.py) on held-out
rounds and save them with the drafter."""

from __future__ import annotations

import json
from pathlib import Path

from . import common


def add_parser(subparsers):
    p = subparsers.add_parser("calibrate", help="fit per-position confidence temperatures (STS) on held-out rounds")
    p.add_argument("drafter", help="drafter folder; the fitted temperatures are saved into it (or --output)")
    p.add_argument("prompts", nargs="+", help="held-out prompt JSONL files ({'turns': [...]})")
    p.add_argument("--exclude-data", nargs="*", default=[], help="training answers (shard folders or JSONL): their prompts are skipped")
    p.add_argument("--exclude", nargs="*", default=[], help="evaluation JSONL files: refuse overlapping prompts")
    common.add_target(p)
    p.add_argument("--limit", type=common.positive, default=40, help="number of held-out prompts")
    p.add_argument("--holdout", action="store_true",
                   help="only the 1-in-20 prompts `hf-dspark data` never answers (training/data.py is_holdout)")
    p.add_argument("--per-file", type=common.positive, default=None, metavar="N",
                   help="N prompts from each prompt file (instead of --limit pooled): every source in the mix")
    p.add_argument("--max-new-tokens", type=common.positive, default=128, help="tokens generated per prompt")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature to calibrate for (0 = greedy)")
    p.add_argument("--no-bias", action="store_true",
                   help="fit temperatures only (the paper's STS); default: a temperature and a logit bias per position")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt draw and of sampling")
    common.add_threads(p)
    common.add_output(p, "save the calibrated drafter here instead of in place")
    p.add_argument("--save-dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="dtype of the saved weights (auto: as stored in the input checkpoint)")
    p.set_defaults(func=main)
    return p


def main(args) -> int:
    import torch

    from ..io.loading import load_target
    from ..model.deepspec import save_calibration
    from ..decoding.assistant import DSparkDrafter
    from ..training.calibration import calibrate, collect_rounds, holdout_prompts

    common.set_threads(args)
    model, tok = load_target(args.target, torch.float32, "cpu")
    drafter = DSparkDrafter.from_pretrained(args.drafter, target=model)
    if drafter.confidence_head is None:
        raise ValueError(f"{args.drafter} has no confidence head (head_type 'none'): nothing to calibrate")
    prompts = holdout_prompts(args.prompts, args.exclude_data, args.limit, args.seed, args.exclude, args.holdout,
                              args.per_file)
    rounds = collect_rounds(model, tok, drafter, prompts, args.max_new_tokens, args.temperature, args.seed)
    out = Path(args.output or args.drafter)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"T{args.temperature:g}"  # one report per temperature: calibrating at another adds an entry, not replaces
    report = calibrate(drafter, rounds, args.temperature, plot=out / f"reliability_{tag}.png", bias=not args.no_bias)
    report.update(prompts=len(prompts), temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    # Keep the checkpoint's stored dtype (the shipped drafter is bf16): the target's dtype is only for running.
    stored = args.save_dtype
    if stored == "auto":
        stored = json.loads((Path(args.drafter) / "config.json").read_text()).get("dtype")
    if stored in ("bfloat16", "float16", "float32"):
        drafter = drafter.to(getattr(torch, stored))
    if drafter.deepspec_source:  # never rewrite DeepSpec files: temperatures go beside them
        save_calibration(drafter, out, sampling_temperature=args.temperature)
    else:
        drafter.save_pretrained(out)
    (out / f"calibration_{tag}.json").write_text(json.dumps(report, indent=2))
    print(f"{report['rounds']} rounds from {len(prompts)} prompts")
    for k, (b, a, f, t, bias) in enumerate(zip(report["ece_before"], report["ece_after"], report["ece_floor_after"],
                                               report["temperatures"], report["biases"])):
        print(f"position {k + 1}: ECE {b:.4f} → {a:.4f} (a calibrated head would show ~{f:.4f} here; "
              f"T = {t:.3f}, b = {bias:+.2f})")
    shared = report["shared_map"]
    print(f"positions fitted around the shared map T = {shared['temperature']:.3f}, b = {shared['bias']:+.2f} "
          f"(prior std {shared['position_prior']:g} in ln T and b)")
    at = ", ".join(f"{c['temperature']:g}" for c in drafter.config.calibration)
    print(f"saved the calibrated drafter to {out} (calibrated at T = {at}); report {out}/calibration_{tag}.json, "
          f"reliability plot {out}/reliability_{tag}.png")
    return 0
