"""Would compiling the drafter's round pay on this machine? The shipped drafter's round (context ingest, backbone,
LM-head rows, sequential head; decoding.profile.time_drafter, 7 drafts on a 300-token context), eager, then with
its backbone under torch.compile(dynamic=True) (the context grows every round, so its shapes are dynamic).

    .venv/bin/python research/drafter_compile.py [bfloat16|float32]
"""

import sys
import time

import torch

from hf_dspark.decoding.profile import time_drafter
from hf_dspark.io.loading import load_target_and_drafter


def main():
    dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
    torch.set_num_threads(2)
    _, _, drafter, _ = load_target_and_drafter(None, None, dtype, "cpu")
    ms = lambda ctx: round(1e3 * time_drafter(drafter, 7, ctx), 2)  # noqa: E731
    print("eager ms", ms(300))
    drafter.backbone = torch.compile(drafter.backbone, dynamic=True)
    t0 = time.perf_counter()
    time_drafter(drafter, 7, 300, warmup=1, repeats=1)
    print("compile s", round(time.perf_counter() - t0, 1))
    for ctx in (300, 301, 350):  # a new context length must not recompile
        print("compiled ms, context", ctx, ms(ctx))


if __name__ == "__main__":
    main()
