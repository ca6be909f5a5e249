"""model/variants.py: each layer variant is one entry, and the drafter's layers are built from it."""

import pytest
import torch

from hf_dspark.model.config import DSparkConfig
from hf_dspark.model.drafter import DSparkDraftModel
from hf_dspark.model.variants import VARIANTS
from tests.conftest import tiny_target


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_layers_follow_their_variant(name):
    variant = VARIANTS[name]
    drafter = DSparkDraftModel.from_target(tiny_target(), block_size=3, target_layer_ids=[0, 2], markov_rank=4,
                                           layer_variant=name, qk_norm=True)
    layer = drafter.layers[0]
    assert type(layer.input_layernorm) is variant.norm and type(layer.self_attn.q_norm) is variant.norm
    assert layer.sandwich == variant.sandwich == hasattr(layer, "pre_feedforward_layernorm")
    assert (layer.self_attn.v_norm is None) == (variant.value_norm is None)
    assert layer.self_attn.scale == variant.attention_scale
    ctx = drafter.context_kv(torch.randn(1, 4, 2 * drafter.config.hidden_size), torch.arange(4)[None])
    h = drafter.backbone(drafter.embed(torch.tensor([[1, 2, 3]])), torch.arange(4, 7)[None], ctx)
    assert h.shape == (1, 3, drafter.config.hidden_size) and torch.isfinite(h).all()


def test_deepspec_architecture_names_are_unique():
    names = [v.deepspec_architecture for v in VARIANTS.values()]
    assert len(set(names)) == len(names)


def test_an_unknown_variant_is_refused_by_name():
    with pytest.raises(ValueError, match="layer_variant"):
        DSparkConfig(layer_variant="nope")
