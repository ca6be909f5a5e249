"""The drafter round's own products and q, per call, in one process: before and after they joined the round A/B.

Arms, per prompt, interleaved: plain generate; "before": weight-major verification only, greedy rounds building
each draft's full-vocabulary q, on a profile whose drafter time is a sampled round's (as the package did before
the round A/B); "after": the library's round as it is now (the profile's form on the target, the drafter and its
draft LM head, greedy rounds without q, greedy round times). Both profiles are measured here with weight-major
products, so the arms differ only in the drafter's round. Prints the profiles, a per-call table and a summary;
writes the rows as JSON (per_call.py).

  .venv/bin/python research/drafter_round.py --dtype float32 --threads 2 --max-new-tokens 64 -o out/drafter_round.json
"""

from __future__ import annotations

import contextlib
import dataclasses

from per_call import nothing, race, setup

from hf_dspark.decoding import candidate
from hf_dspark.decoding import profile as prof
from hf_dspark.decoding.linears import round_linears
from hf_dspark.model import drafter as drafter_module


@contextlib.contextmanager
def before():
    """The round as it was: products in the profile's form on the target only, q built for greedy drafts too."""
    real_linears, real_block = candidate.round_linears, drafter_module.draft_block
    candidate.round_linears = prof.round_linears = lambda linear, gamma, target, *_: round_linears(
        linear, gamma, target, None, None)
    drafter_module.draft_block = lambda *a, **kw: real_block(*a, **{**kw, "need_logits": True})
    try:
        yield
    finally:
        candidate.round_linears = prof.round_linears = real_linears
        drafter_module.draft_block = real_block


def main() -> None:
    args, model, tok, drafter = setup(__doc__)
    with before():
        old = prof.measure_profile(model, drafter, linear="weight_major")
    old = dataclasses.replace(old, draft_time=old.sampled_draft_time)  # the old profile timed sampled rounds
    new = prof.measure_profile(model, drafter, linear="weight_major")
    race(args, model, tok, drafter, {"before": (before, old), "after": (nothing, new)})


if __name__ == "__main__":
    main()
