"""DecodingOptions: the drafter's run-time knobs, one typed object (`drafter.options`).

transformers keeps assistant options on the assistant, so `generate()` keeps its signature: the drafter's defaults
live in one place, `drafter.options` (`drafter.options.verify_policy = "scheduler"`, `drafter.options.ngram_drafts =
True`, `drafter.options.device_profile = profile`, `drafter.options.loop = "compiled"`, or a whole
`drafter.options = DecodingOptions(...)`), and one call can pass its own:
`model.generate(..., assistant_model=drafter, dspark_options=DecodingOptions(loop="static"))`.
The command line's text forms are parsed here, once:

    DecodingOptions.parse("scheduler+ngram")  →  DecodingOptions(verify_policy="scheduler", ngram_drafts=True)
    DecodingOptions.parse("all")              →  DecodingOptions(verify_policy="all", ngram_drafts=False)
    DecodingOptions.parse("threshold:0.5")    →  verify_policy ("threshold", 0.5);  "3" → 3;  "auto" → "auto"
    (a parsed text has n-gram drafts only with "+ngram"; DecodingOptions() itself is the default, "auto" + n-gram)

What each policy means, and its validation at generate(): policy.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

from .profile import DeviceProfile

Policy = Union[str, int, tuple, Callable]  # "all" | "scheduler" | k | ("threshold", t) | policy(conf) -> ℓ


@dataclass
class DecodingOptions:
    """verify_policy: how many drafts to verify per round (default "auto": the scheduler and its draft gate on this
    device's measured profile, policy.py); ngram_drafts: rounds whose last tokens occurred before take free
    n-gram drafts instead (ngram.py; default on); device_profile: the DeviceProfile the scheduler uses (None = the
    cached one for this target/device, measured once); loop: "assisted" (default: transformers' assisted-decoding
    loop), "static" (DSpark's own loop on a static KV cache, loop.py) or "compiled" (the same, its multi-token
    verification forwards compiled: a graph per verification length, compiled on first use). The defaults are the
    best lossless configuration this package knows; "all" (verify every draft, no gate) stays available and can be
    slower than plain generate."""

    verify_policy: Policy = "auto"
    ngram_drafts: bool = True
    device_profile: DeviceProfile | None = None
    loop: str = "assisted"

    @classmethod
    def parse(cls, text: str) -> "DecodingOptions":
        """'auto' | 'all' | 'scheduler' | an int k | 'threshold:T', with an optional '+ngram' suffix →
        DecodingOptions (n-gram drafts only with the suffix)."""
        policy = text.strip()
        ngram = policy.endswith("+ngram")
        policy = policy.removesuffix("+ngram")
        if policy.startswith("threshold:"):
            return cls(("threshold", float(policy.split(":", 1)[1])), ngram)
        return cls(int(policy) if policy.isdigit() else policy, ngram)
