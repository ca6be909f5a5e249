"""ECE per position per eval set for several calibrations of one drafter's weights, from one replay per answer set
and mode (the calibrations differ only in how raw confidences are scaled, so the rounds are the same).

    OMP_NUM_THREADS=1 .venv/bin/python research/replay_ece.py --drafters hf_dspark/assets/smollm2-135m-dspark \
        out/cal48 out/cal48b --sets out/eval_targets/gsm8k out/eval_targets/mbpp --out docs/results/replay_ece.json

The first drafter's weights are replayed; every drafter must hold the same weights (checked). Prints τ and, per
drafter, ECE per position with the scaling it applies at the mode's temperature, and the floor a calibrated head
would show on the same rounds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hf_dspark.eval.replay import MODE_TEMPERATURE, replay, responses_for
from hf_dspark.io.loading import load_target_and_drafter
from hf_dspark import DSparkDrafter
from hf_dspark.training.calibration import ece_floor_per_position, ece_per_position, rounds_to_arrays
from hf_dspark.training.data import read_answers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafters", nargs="+", required=True)
    ap.add_argument("--sets", nargs="+", required=True)
    ap.add_argument("--modes", nargs="+", default=["greedy", "t1"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, _, first, _ = load_target_and_drafter(None, args.drafters[0], torch.float32, "cpu")
    others = [DSparkDrafter.from_pretrained(d, target=model) for d in args.drafters[1:]]
    ref = first.state_dict()
    for d, dr in zip(args.drafters[1:], others):
        if any(not torch.equal(ref[k], v) for k, v in dr.state_dict().items()):
            raise SystemExit(f"{d} holds other weights than {args.drafters[0]}: replay it on its own")
    drafters = [first, *others]
    results = {}
    for s in args.sets:
        for mode in args.modes:
            st = replay(first, responses_for(read_answers(s), mode), mode, 256, samples=4)
            row = results.setdefault(f"{Path(s).name}_{mode}", {"tau": st.tau, "rounds": len(st.rounds)})
            print(f"{Path(s).name} {mode}: τ {st.tau:.3f} over {len(st.rounds)} rounds")
            g = st.block_size
            for name, dr in zip(args.drafters, drafters):
                temps, biases = dr.config.confidence_scaling_at(MODE_TEMPERATURE[mode])
                # the replay scaled with the first drafter's; z is raw (the same weights), so re-scale from it
                z, y, valid = rounds_to_arrays(st.rounds, g, *first.config.confidence_scaling_at(MODE_TEMPERATURE[mode]))
                row[name] = {"temperatures": temps, "biases": biases,
                             "ece": ece_per_position(z, y, valid, temps, biases),
                             "ece_raw": ece_per_position(z, y, valid, [1.0] * g),
                             "ece_floor": ece_floor_per_position(z, valid, temps, biases)}
                print(f"  {name}: ECE " + ", ".join(f"{a:.3f} ({f:.3f})" for a, f in
                                                    zip(row[name]["ece"], row[name]["ece_floor"])))
            print(f"  raw: ECE " + ", ".join(f"{a:.3f}" for a in row[args.drafters[0]]["ece_raw"]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
