"""Weight-major linear layers for the few-row products of one generate() call's rounds.

A verification forward multiplies every weight W [out, in] by a few rows x [rows, in] (the anchor and the drafts);
a drafter round does the same with its own layers and the LM-head rows of its drafts.
`F.linear` computes x·Wᵀ; on some CPU BLAS builds that costs about one pass over W per row (MKL on AMD CPUs,
measured: a 2-token forward of SmolLM2-135M in float32 cost 1.5 one-token steps, a 4-token one 2.0), where the same
product written (W·xᵀ)ᵀ streams W once, as the one-row step does. Which of the two is faster is measured on each
device (profile.py: `DeviceProfile.linear`, from an A/B of the target's forwards and the drafter's round), never
assumed.

`WeightMajorLinears(target, drafter, ...).install()` puts the weight-major forward on the models' `nn.Linear`
layers, for inputs of 2..max_rows rows only: a one-row step and a long prefill keep `F.linear`, so they compute what
plain generate() computes. Decoding installs it after the prefill and removes it when the call ends (routing.py),
so the models are left as they were given. Layers whose `forward` is already replaced (accelerate's device hooks, adapters) are left
alone. Results differ from `F.linear`'s by float rounding only, as a multi-row `F.linear` already differs from
one-row steps; greedy identity with plain generate() is tested on both forms.
"""

from __future__ import annotations

import functools
import types
from typing import Self

import torch
import torch.nn.functional as F
from torch import nn

from .loop import padded

LINEARS = ("stock", "weight_major")  # DeviceProfile.linear: F.linear everywhere, or weight-major for few rows


def weight_major_forward(self: nn.Linear, x: torch.Tensor, max_rows: int) -> torch.Tensor:
    """x [..., in] → [..., out], as nn.Linear; for 2..max_rows rows as (W·xᵀ)ᵀ, the output made row-major (a
    transposed view would turn the next layer's input into the layout MKL multiplies slowly)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if not 1 < rows <= max_rows:
        return F.linear(x, self.weight, self.bias)
    y = torch.mm(self.weight, x.reshape(rows, x.shape[-1]).contiguous().t()).t().contiguous()
    if self.bias is not None:
        y += self.bias
    return y.view(*x.shape[:-1], self.weight.shape[0])


class WeightMajorLinears:
    """The weight-major forward on every plain `nn.Linear` of `models`, installed and removed as a unit."""

    def __init__(self, *models: nn.Module, max_rows: int):
        self.max_rows = max_rows
        # exact type: subclasses (quantized layers) have their own forward; an instance forward is someone's hook
        self.layers = list({id(m): m for model in models for m in model.modules()
                            if type(m) is nn.Linear and "forward" not in m.__dict__}.values())
        self.installed = False

    def install(self) -> None:
        if self.installed:
            return
        for m in self.layers:
            m.forward = types.MethodType(_bound(self.max_rows), m)
        self.installed = True

    def remove(self) -> None:
        if not self.installed:
            return
        for m in self.layers:
            m.__dict__.pop("forward", None)
        self.installed = False

    def __enter__(self) -> Self:
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


@functools.cache
def _bound(max_rows: int):
    # one function per max_rows, which it names: a compiled graph's key records it (graphs.linear_forms)
    def forward(self, x):
        return weight_major_forward(self, x, max_rows)
    forward.max_rows = max_rows
    return forward


def round_linears(linear: str, block_size: int, target: nn.Module, drafter, draft_head: nn.Module
                  ) -> WeightMajorLinears | None:
    """The layers a round of a call with γ = block_size multiplies with under a profile's `linear` (LINEARS): the
    target's (verification; on the compiled loop its graphs are traced with the form installed, loop.py), the
    drafter's and its draft LM head's (draft_weights()); None for "stock". A drafter that is not an nn.Module keeps
    its own products."""
    if linear not in LINEARS:
        raise ValueError(f"linear must be one of {LINEARS}, got {linear!r}")
    if linear == "stock":
        return None
    models = [m for m in (target, drafter, draft_head) if isinstance(m, nn.Module)]
    return WeightMajorLinears(*models, max_rows=padded(block_size + 1))
