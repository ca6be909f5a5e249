"""DSparkDrafter (decoding/assistant.py), the network as generate()'s assistant: binding enables the target,
its default options, and what it says when used where only the target's generate() can use it."""

import pytest
import torch

from hf_dspark import DSparkConfig, DSparkDrafter
from tests.conftest import tiny_target


def test_unbound_drafter_on_a_plain_model_explains_itself():
    model = tiny_target()
    cfg = DSparkConfig.for_target(model.config, block_size=4, target_layer_ids=[0, 2], mask_token_id=60)
    with pytest.raises(RuntimeError, match="not a standalone model"):
        model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=5, assistant_model=DSparkDrafter(cfg))
