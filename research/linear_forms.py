"""Weight-major against stock round products (decoding/linears.py), per call, in one process.

For each prompt, interleaved: plain generate, then DSpark with the library defaults on a profile measured with
stock products, then on one measured with weight-major products (both profiles measured here, first). Prints
each profile and a per-call table; writes the rows as JSON (per_call.py).

  .venv/bin/python research/linear_forms.py --dtype float32 --threads 2 --max-new-tokens 64 -o out/linear_forms.json
"""

from __future__ import annotations

from per_call import nothing, race, setup

from hf_dspark.decoding.profile import measure_profile


def main() -> None:
    args, model, tok, drafter = setup(__doc__)
    race(args, model, tok, drafter, {form: (nothing, measure_profile(model, drafter, linear=form))
                                     for form in ("stock", "weight_major")})


if __name__ == "__main__":
    main()
