"""What a deeper drafter costs per round, against the round it would have to pay for: the drafter round
(decoding.profile.time_drafter, 7 drafts, greedy and sampled) of a drafter and of the same drafter grown by
`--extra` identity layers (model.initialisation.init_from; the weights do not change the cost), timed interleaved in
one process, then each extra millisecond as a share of a round that verifies l drafts on this machine's saved
device profile (loop "compiled" if saved, else "assisted"). A deeper drafter pays where its τ rises by more than
that share.

    .venv/bin/python research/drafter_depth.py runs/smollm2-markov-3/checkpoint-2610/drafter --threads 2 \
        -o docs/results/drafter_depth.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile

import torch

from hf_dspark import DSparkDrafter
from hf_dspark.decoding.machine import device_name
from hf_dspark.decoding.profile import get_profile, profile_key, profile_path, time_drafter
from hf_dspark.io.loading import load_default_target
from hf_dspark.model.initialisation import _SAME_SHAPE, init_from


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("drafter")
    ap.add_argument("--extra", type=int, default=1, help="layers to add")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per arm")
    ap.add_argument("-o", "--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = load_default_target(dtype=torch.float32)
    base = DSparkDrafter.from_pretrained(args.drafter, target=target).float().eval()
    shape = {k: getattr(base.config, k) for k in _SAME_SHAPE}
    deeper = DSparkDrafter.from_target(target, **shape, num_hidden_layers=base.config.num_hidden_layers + args.extra)
    with tempfile.TemporaryDirectory() as tmp:
        base.save_pretrained(tmp)
        init_from(deeper, tmp)
    deeper = deeper.float().eval()
    arms = {f"{base.config.num_hidden_layers} layers": base, f"{deeper.config.num_hidden_layers} layers": deeper}
    times: dict[str, dict[str, list[float]]] = {name: {"greedy": [], "sampled": []} for name in arms}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, d in arms.items():
                for mode in ("greedy", "sampled"):
                    times[name][mode].append(time_drafter(d, base.config.block_size, sample=mode == "sampled"))
    ms = {name: {mode: 1e3 * statistics.median(v) for mode, v in by.items()} for name, by in times.items()}
    (b, d) = ms.values()
    extra = {mode: d[mode] - b[mode] for mode in ("greedy", "sampled")}

    loop = "compiled" if profile_path(profile_key(target, base, "compiled")).exists() else "assisted"
    prof = get_profile(target, base, measure=False, loop=loop)
    rounds = {k: 1e3 * (prof.round_overhead + prof.verify_time[k]) for k in range(1, len(prof.verify_time))}
    share = {k: extra["greedy"] / r for k, r in rounds.items()}
    print(f"{device_name(target.device)}, float32; drafter round (7 drafts), median of {args.rounds}:")
    for name, m in ms.items():
        print(f"  {name}: greedy {m['greedy']:.2f} ms, sampled {m['sampled']:.2f} ms")
    print(f"  extra: greedy {extra['greedy']:.2f} ms, sampled {extra['sampled']:.2f} ms")
    print(f"a round verifying l drafts on the saved {loop} profile, ms (and the τ gain the extra layer must buy):")
    for k, r in rounds.items():
        print(f"  l={k}: {r:.1f} ms, +{100 * share[k]:.1f} %")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": device_name(target.device), "threads": args.threads, "drafter": args.drafter, "round_ms": ms,
                       "extra_ms": extra, "loop": loop, "round_at_l_ms": rounds, "needed_tau_gain": share}, f, indent=1)


if __name__ == "__main__":
    main()
