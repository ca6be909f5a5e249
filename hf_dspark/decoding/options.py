"""DecodingOptions: the drafter's run-time knobs, one typed object (`drafter.options`).

transformers keeps assistant options on the assistant, so `generate()` keeps its signature: the drafter's defaults
live in one place, `drafter.options` (`drafter.options.verify_policy = "scheduler"`, `drafter.options.ngram_drafts =
True`, `drafter.options.device_profile = profile`, `drafter.options.loop = "assisted"`, or a whole
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

import dataclasses
from dataclasses import dataclass
from typing import Callable, Union

from .profile import DeviceProfile, ProfileMismatchError, get_profile, profile_key, profile_path

LOOPS = ("auto", "assisted", "static", "compiled")  # DecodingOptions.loop

Policy = Union[str, int, tuple, Callable]  # "all" | "scheduler" | k | ("threshold", t) | policy(conf) -> ℓ


@dataclass
class DecodingOptions:
    """verify_policy: how many drafts to verify per round (default "auto": the scheduler and its draft gate on this
    device's measured profile, policy.py); ngram_drafts: rounds whose last tokens occurred before take free
    n-gram drafts instead (ngram.py; default on); device_profile: the DeviceProfile the scheduler uses (None = the
    cached one for this target/device, measured once); loop: "auto" (default: DSpark's compiled loop where this
    machine has set it up, else transformers' assisted loop; `concrete`), "assisted" (transformers' assisted-decoding
    loop), "static" (DSpark's own loop on a static KV cache, loop.py) or "compiled" (the same, its multi-token
    verification forward compiled: one graph, compiled once per setup and kept on disk, graphs.py). The defaults
    are the best lossless configuration this package knows; "all" (verify every draft, no gate) stays available and
    can be slower than plain generate."""

    verify_policy: Policy = "auto"
    ngram_drafts: bool = True
    device_profile: DeviceProfile | None = None
    loop: str = "auto"

    def concrete(self, target, drafter) -> "DecodingOptions":
        """These options with loop "auto" made concrete for `target` verified with `drafter`: the loop of the
        device_profile given, else "compiled" where its device profile is saved on this machine (measuring it
        compiled and saved the loop's graph: hf_dspark.prepare(target, drafter), `hf-dspark profile`), else
        "assisted". Every loop gives the same greedy tokens and samples the same law; a seed's samples depend on
        the loop, so a sampled call that must repeat across machines names its loop."""
        if self.loop != "auto":
            return self
        if self.device_profile is not None:
            loop = self.device_profile.key.loop
        else:
            compiled = profile_path(profile_key(target, drafter, "compiled")).exists()
            loop = "compiled" if compiled else "assisted"
        return dataclasses.replace(self, loop=loop)

    def profile_for(self, target, drafter, measure: bool = True) -> DeviceProfile:
        """The device profile a call with these options schedules with: `device_profile` if given (refused with
        ProfileMismatchError if it was measured for another setup or loop), else the one saved on this machine for
        the loop the call runs on ("auto" made concrete), measured and saved first if `measure` (else
        FileNotFoundError)."""
        options = self.concrete(target, drafter)
        if options.device_profile is None:
            return get_profile(target, drafter, measure=measure, loop=options.loop)
        key = profile_key(target, drafter, options.loop)
        if options.device_profile.key != key:
            raise ProfileMismatchError(
                f"device_profile was measured for {options.device_profile.key}, but this generate runs {key}; "
                "pass device_profile=None to use (or measure) the profile for this setup")
        return options.device_profile

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
