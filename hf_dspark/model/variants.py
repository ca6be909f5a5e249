"""Layer variants of the drafter's backbone, as objects: which RMSNorm, whether layers are sandwich-normed,
whether values are normed, the attention scale, and the DeepSpec architecture name.

A new variant is one `LayerVariant` entry in VARIANTS: DSparkConfig.layer_variant's allowed values, the drafter's
layers and the DeepSpec key table (its `sandwich` tensors) and architecture names are derived from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn
from transformers.models.gemma4.modeling_gemma4 import Gemma4RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm


@dataclass(frozen=True)
class LayerVariant:
    """norm: the RMSNorm class (Llama's applies the weight after the cast back; Gemma-4's computes all in fp32);
    sandwich: h + post(Attn(pre(h))), h + post_ff(MLP(pre_ff(h))), × layer_scalar, instead of pre-norm only;
    value_norm: (head_dim, eps) → a weightless RMSNorm applied to V, or None; attention_scale: None for SDPA's
    h^-1/2; deepspec_architecture: config.json `architectures[0]` of DeepSpec's drafters of this variant."""

    norm: type[nn.Module]
    sandwich: bool
    value_norm: Callable[[int, float], nn.Module] | None
    attention_scale: float | None
    deepspec_architecture: str


VARIANTS: dict[str, LayerVariant] = {
    # pre-norm Llama/Qwen3 layers
    "default": LayerVariant(LlamaRMSNorm, sandwich=False, value_norm=None, attention_scale=None,
                            deepspec_architecture="Qwen3DSparkModel"),
    # DeepSpec's Gemma-4 drafter layers: sandwich norms, fp32 Gemma RMSNorm, scale-free RMSNorm on V, scale 1
    "gemma4": LayerVariant(Gemma4RMSNorm, sandwich=True,
                           value_norm=lambda dim, eps: Gemma4RMSNorm(dim, eps=eps, with_scale=False),
                           attention_scale=1.0, deepspec_architecture="Gemma4DSparkModel"),
}
