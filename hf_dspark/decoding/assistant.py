"""DSparkDrafter: the drafter network as `generate()`'s assistant.

`DSparkDraftModel` (model/drafter.py) drafts; this subclass binds it to a target for speculative decoding (the
architecture check of architecture.py, then routing's `enable`) and carries the default run-time options
(`drafter.options`; one call can pass others, routing.py) and the last call's stats.
"""

from __future__ import annotations

from ..model.drafter import DSparkDraftModel
from .architecture import check_architecture
from .options import DecodingOptions
from .routing import enable

_NOT_STANDALONE = (
    "A DSparkDrafter is not a standalone model: pass it as `assistant_model=` to the target's generate() after "
    "binding it (DSparkDrafter.from_pretrained(path, target=model) or drafter.bind(model)). If you see this from "
    "inside transformers, the target was not enabled for DSpark (hf_dspark.enable(model) / drafter.bind(model))."
)


class NotEnabledError(RuntimeError):
    """Raised when transformers' stock assistant path touches a drafter: the target was not enabled."""


class DSparkDrafter(DSparkDraftModel):
    """A DSpark drafter for one target model. Use `DSparkDrafter.from_target(model)` for a fresh one and
    `DSparkDrafter.from_pretrained(path, target=model)` for a trained one; then
    `model.generate(..., assistant_model=drafter)`.

    `drafter.options` (DecodingOptions: verify_policy, ngram_drafts, device_profile, loop) are its run-time defaults,
    set there (`drafter.options.verify_policy = "all"`, or `drafter.options = DecodingOptions(...)`) or per call with
    `model.generate(..., assistant_model=drafter, dspark_options=DecodingOptions(...))`; after each `generate`,
    `drafter.last_stats` holds the run's metrics (DSparkStats).
    """

    def __init__(self, config):
        super().__init__(config)
        self.options = DecodingOptions()
        self.last_stats = None

    def __setattr__(self, name, value):
        # an option set on the drafter itself would be an attribute decoding never reads: refuse it by name
        if name in DecodingOptions.__dataclass_fields__:
            raise AttributeError(f"drafter.{name} is not read by generate(): set drafter.options.{name}, or pass "
                                 f"dspark_options=DecodingOptions({name}=...) to one call")
        super().__setattr__(name, value)

    def bind(self, target) -> DSparkDrafter:
        """Check that speculative decoding can be exact on `target` and that the pair fits, share its embedding,
        LM head and taps, and enable DSpark routing in `target.generate`. Raises ValueError naming the first
        problem."""
        check_architecture(target)
        super().bind(target)
        enable(target)
        return self

    @classmethod
    def from_target(cls, target, **overrides) -> DSparkDrafter:
        check_architecture(target)  # before sizing: a state-space target has no attention geometry to copy
        return super().from_target(target, **overrides)

    from_target.__doc__ = DSparkDraftModel.from_target.__doc__

    def generate(self, *args, **kwargs):
        raise RuntimeError(_NOT_STANDALONE)

    @property
    def generation_config(self):
        # transformers' stock assistant path reads this first: reaching it means the target was never enabled.
        raise NotEnabledError(_NOT_STANDALONE)

    @generation_config.setter
    def generation_config(self, value):
        pass  # the drafter has no generation settings of its own
