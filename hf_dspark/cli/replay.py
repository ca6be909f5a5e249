"""`hf-dspark replay`: τ of drafters replayed on the target's own outputs (eval/replay.py), with the ECE of
their confidences on the same rounds."""

from __future__ import annotations

import json
from pathlib import Path

from . import common


def add_parser(subparsers):
    p = subparsers.add_parser("replay", help="τ of drafters replayed on the target's own outputs (fast, exact)")
    p.add_argument("responses", nargs="+", help="answer sets from `hf-dspark data` (a shard folder or .jsonl[.gz]); "
                                                "each mode replays the answers decoded its way (greedy: temperature "
                                                "0, answer #0; t1: temperature 1, top-p 1)")
    p.add_argument("--mode", required=True, choices=["greedy", "t1"], help="replay greedy decoding or sampling at T = 1")
    p.add_argument("--drafter", action="append", required=True, help="drafter folder (repeat to compare)")
    common.add_target(p)
    p.add_argument("--max-new-tokens", type=int, default=256, help="the generation length the responses used")
    p.add_argument("--samples", type=common.positive, default=4, help="acceptance draws per sequence at T = 1")
    common.add_threads(p)
    common.add_output(p, "JSON file for every number")
    p.set_defaults(func=main)
    return p


def main(args) -> int:
    import torch

    from ..eval.replay import MODE_TEMPERATURE, replay, responses_for
    from ..io.loading import load_target_and_drafter
    from ..decoding.assistant import DSparkDrafter
    from ..training.calibration import ece_floor_per_position, ece_per_position, rounds_to_arrays
    from ..training.data import read_answers

    common.set_threads(args)
    model, _, first, _ = load_target_and_drafter(args.target, args.drafter[0], torch.float32, "cpu")
    drafters = [first] + [DSparkDrafter.from_pretrained(d, target=model) for d in args.drafter[1:]]
    results = {}
    for f in args.responses:
        if not Path(f).exists():
            raise FileNotFoundError(f"answer set {f} does not exist")
        records = responses_for(read_answers(f), args.mode)
        for d, dr in zip(args.drafter, drafters):
            st = replay(dr, records, args.mode, args.max_new_tokens, args.samples)
            ca = ", ".join(f"{x:.3f}" for x in st.conditional_acceptance)
            print(f"{Path(f).name} | {d}: τ {st.tau:.3f} over {len(st.rounds)} rounds, {len(records)} sequences, "
                  f"{st.new_tokens} tokens; conditional acceptance [{ca}]")
            entry = results.setdefault(Path(f).name, {})[d] = {
                "tau": st.tau, "rounds": len(st.rounds), "sequences": len(records), "tokens": st.new_tokens,
                "conditional_acceptance": st.conditional_acceptance, "acceptance_rate": st.acceptance_rate,
                "acceptance_histogram": st.acceptance_histogram,
                "target_argmax_agreement": st.target_argmax_agreement}
            if dr.confidence_head is not None:  # calibration quality on these rounds: ECE per position, raw vs fitted
                scaling = dr.config.confidence_scaling_at(MODE_TEMPERATURE[args.mode])
                z, y, valid = rounds_to_arrays(st.rounds, st.block_size, *scaling)
                entry["ece_raw"] = ece_per_position(z, y, valid, [1.0] * st.block_size)
                entry["ece_calibrated"] = ece_per_position(z, y, valid, *scaling)
                entry["ece_floor_calibrated"] = ece_floor_per_position(z, valid, *scaling)
                print("  ECE per position raw → calibrated (floor: a calibrated head on these rounds): " + ", ".join(
                    f"{a:.3f}→{b:.3f} ({f:.3f})" for a, b, f in
                    zip(entry["ece_raw"], entry["ece_calibrated"], entry["ece_floor_calibrated"])))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps({"mode": args.mode, "max_new_tokens": args.max_new_tokens,
                                              "samples": args.samples, "results": results}, indent=1))
    return 0
