"""DraftModel: what the decoding floor needs from a drafter, and all it uses of one.

hf_dspark.model.drafter.DSparkDraftModel is the network that implements the drafting members;
decoding/assistant.py's DSparkDrafter adds the binding to a target and the run-time options. Routing recognises
a DSpark assistant by this protocol (a structural check), so nothing here imports the model classes.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from .options import DecodingOptions


@runtime_checkable
class DraftModel(Protocol):
    """config: a DSparkConfig (block_size γ, target_layer_ids, mask_token_id, calibration, ...); bound_target: the
    target it is bound to, or None; confidence_head: its confidence head or None; options: its default DecodingOptions;
    last_stats: the DSparkStats of its last generate() (decoding writes it)."""

    config: object
    options: DecodingOptions
    last_stats: object

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def bound_target(self): ...

    @property
    def confidence_head(self): ...

    def draft_weights(self):
        """(vocab [V'] or None, the draft LM head (an nn.Linear over the rows [V', d]), W2 rows [V', r] or None),
        gathered once per call."""

    def context_kv(self, features: torch.Tensor, position_ids: torch.Tensor) -> list:
        """Tapped features [1, n, m·d] at position_ids [1, n] → per drafter layer (k, v) [1, n_kv, n, hd]."""

    def draft(self, context_kv, prefix_ids: torch.Tensor, n: int, *, reach=None, processor=None,
              do_sample: bool = False, weights=None, offset: int = 0, temperature=None):
        """One drafter round → a DraftBlock of n drafts (tokens [n], the logits q was drawn from [n, V] when
        do_sample (greedy rounds may return None), calibrated confidences [n] on the CPU or None)."""
