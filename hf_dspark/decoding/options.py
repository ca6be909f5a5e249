"""DecodingOptions: the drafter's run-time knobs, one typed object (`drafter.options`).

transformers keeps assistant options on the assistant, so `generate()` keeps its signature; the drafter
also exposes each field as an attribute (`drafter.verify_policy = "scheduler"`, `drafter.ngram_drafts = True`,
`drafter.device_profile = profile`). The command line's text forms are parsed here, once:

    DecodingOptions.parse("scheduler+ngram")  →  DecodingOptions(verify_policy="scheduler", ngram_drafts=True)
    DecodingOptions.parse("threshold:0.5")    →  verify_policy ("threshold", 0.5);  "3" → 3;  "all" → "all"

What each policy means, and its validation at generate(): verify_policy.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

from .profile import DeviceProfile

Policy = Union[str, int, tuple, Callable]  # "all" | "scheduler" | k | ("threshold", t) | policy(conf) -> ℓ


@dataclass
class DecodingOptions:
    """verify_policy: how many drafts to verify per round (default "all"); ngram_drafts: rounds whose last tokens
    occurred before take free n-gram drafts instead (ngram.py); device_profile: the DeviceProfile the scheduler uses
    (None = the cached one for this target/device, measured once)."""

    verify_policy: Policy = "all"
    ngram_drafts: bool = False
    device_profile: DeviceProfile | None = None

    @classmethod
    def parse(cls, text: str) -> "DecodingOptions":
        """'all' | 'scheduler' | an int k | 'threshold:T', with an optional '+ngram' suffix → DecodingOptions."""
        policy = text.strip()
        ngram = policy.endswith("+ngram")
        policy = policy.removesuffix("+ngram")
        if policy.startswith("threshold:"):
            return cls(("threshold", float(policy.split(":", 1)[1])), ngram)
        return cls(int(policy) if policy.isdigit() else policy, ngram)
