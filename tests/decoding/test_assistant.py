"""DSparkDrafter (decoding/assistant.py), the network as generate()'s assistant: binding enables the target,
its default options, and what it says when used where only the target's generate() can use it."""

import pytest
import torch

from hf_dspark import DecodingOptions, DSparkConfig, DSparkDrafter
from hf_dspark.decoding.assistant import NotEnabledError
from tests.conftest import tiny_target
from tests.helpers import PROMPT, drafter_for


def test_unbound_drafter_on_a_plain_model_explains_itself():
    model = tiny_target()
    cfg = DSparkConfig.for_target(model.config, block_size=4, target_layer_ids=[0, 2], mask_token_id=60)
    with pytest.raises(RuntimeError, match="not a standalone model"):
        model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=5, assistant_model=DSparkDrafter(cfg))


def test_generate_on_the_drafter_itself_points_to_assistant_model(llama):
    drafter = drafter_for(llama)
    with pytest.raises(RuntimeError, match="assistant_model="):
        drafter.generate(PROMPT, max_new_tokens=5)
    with pytest.raises(NotEnabledError, match="not a standalone model"):
        drafter.generation_config  # transformers' stock assistant path reads it first


def test_from_target_and_bind_enable_the_target():
    model = tiny_target()
    drafter = DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 2])
    assert model._is_dspark_enabled and drafter.bound_target is model
    other = tiny_target(seed=1)
    assert not getattr(other, "_is_dspark_enabled", False)
    assert drafter.bind(other) is drafter and other._is_dspark_enabled and drafter.bound_target is other


def test_options_live_only_in_drafter_options():
    """The run-time options have one home, `drafter.options` (or dspark_options= per call, test_routing.py): no
    alias attributes on the drafter, and what is set in `drafter.options` is what the next generate() uses."""
    model = tiny_target()
    torch.manual_seed(0)
    drafter = DSparkDrafter.from_target(model, block_size=3, target_layer_ids=[0, 2])
    assert drafter.options == DecodingOptions() and drafter.last_stats is None
    for name in ("verify_policy", "ngram_drafts", "device_profile", "loop"):
        assert not hasattr(DSparkDrafter, name) and not hasattr(drafter, name), name
        with pytest.raises(AttributeError, match=f"set drafter.options.{name}"):  # never a silently ignored attribute
            setattr(drafter, name, None)
    prompt = torch.tensor([[5, 17, 3, 42, 8, 11, 5, 17, 3]])
    plain = model.generate(prompt, do_sample=False, max_new_tokens=20)
    drafter.options.verify_policy, drafter.options.ngram_drafts = 1, False
    assert drafter.options == DecodingOptions(1, ngram_drafts=False)
    out = model.generate(prompt, do_sample=False, max_new_tokens=20, assistant_model=drafter)
    assert out.tolist() == plain.tolist()
    assert max(r.verified for r in drafter.last_stats.rounds) == 1
    drafter.options = DecodingOptions("all", ngram_drafts=False)
    out = model.generate(prompt, do_sample=False, max_new_tokens=20, assistant_model=drafter)
    assert out.tolist() == plain.tolist()
    rounds = [r for r in drafter.last_stats.rounds if r.drafted]
    assert rounds and all(r.verified == r.drafted for r in rounds) and max(r.verified for r in rounds) > 1
