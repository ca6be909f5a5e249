"""Named refusals: architectures DSpark cannot serve exactly, options transformers'
assisted decoding cannot honour, and misleading messages made precise. Each test checks the message."""

import json

import pytest
import torch
from transformers import BertConfig, BertLMHeadModel

from hf_dspark import DSparkConfig, DSparkDrafter
from hf_dspark.model.binding import UnsupportedArchitectureError
from tests.arch_matrix import build
from tests.conftest import tiny_target
from tests.helpers import PROMPT, drafter_for

# ---- architectures that cannot be served ------------------------------------------------------------------


@pytest.mark.parametrize("model_type, why", [
    ("mamba", "stateful \\(recurrent / state-space\\) model"),  # config has no attention heads at all
    ("qwen3_next", "stateful"),  # accepted by from_target before, refused only later by transformers
    ("deepseek_v32", "indexed \\(top-k sparse\\) attention"),
    ("openai-gpt", "returns no KV cache"),
    ("xlnet", "cache of its own kind"),
    ("electra", "factorised embedding"),
    ("prophetnet", "cannot verify several new tokens"),
])
def test_unservable_architectures_are_refused_at_from_target(model_type, why):
    with pytest.raises(UnsupportedArchitectureError, match=why):
        DSparkDrafter.from_target(build(model_type))


def test_unservable_target_is_refused_at_bind_too(llama):
    drafter = drafter_for(llama)
    with pytest.raises(UnsupportedArchitectureError, match="stateful"):
        drafter.bind(build("mamba"))


def test_attention_free_config_is_named_not_an_attribute_error():
    """A config without attention heads (a state-space model's) cannot size a drafter."""
    mamba = build("mamba").config
    with pytest.raises(UnsupportedArchitectureError, match="no attention heads"):
        DSparkConfig.for_target(mamba)


def test_bidirectional_encoder_head_is_refused_unless_a_decoder():
    torch.manual_seed(0)
    cfg = dict(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
               max_position_embeddings=128, pad_token_id=0)
    with pytest.raises(UnsupportedArchitectureError, match="is_decoder=False"):
        DSparkDrafter.from_target(BertLMHeadModel(BertConfig(**cfg)).eval())
    DSparkDrafter.from_target(BertLMHeadModel(BertConfig(is_decoder=True, **cfg)).eval())  # as a decoder: served


# ---- generate options assisted decoding cannot honour ------------------------------------------------


def test_output_attentions_in_a_dict_is_refused_by_name(llama):
    drafter = drafter_for(llama)
    with pytest.raises(NotImplementedError, match="output_attentions=True with return_dict_in_generate=True"):
        llama.generate(PROMPT, max_new_tokens=5, assistant_model=drafter, output_attentions=True,
                       return_dict_in_generate=True)


def test_use_cache_false_is_refused_by_name(llama):
    drafter = drafter_for(llama)
    with pytest.raises(ValueError, match="use_cache=False"):
        llama.generate(PROMPT, max_new_tokens=5, assistant_model=drafter, use_cache=False)


# ---- messages that used to say something else ----------------------------------------------------------------


def test_unbound_drafter_is_not_said_to_be_bound_to_another_model(llama, tmp_path):
    drafter_for(llama).save_pretrained(tmp_path)
    loose = DSparkDrafter.from_pretrained(tmp_path)  # no target=
    with pytest.raises(ValueError, match="not bound to a target"):
        llama.generate(PROMPT, max_new_tokens=5, assistant_model=loose)


@pytest.mark.parametrize("damage, message", [
    ("missing", "config.json is missing"),
    ("empty file", "config.json is not valid JSON"),
    ("empty object", "config.json has no target_layer_ids"),
])
def test_missing_or_empty_config_json_is_named(llama, tmp_path, damage, message):
    drafter_for(llama).save_pretrained(tmp_path)
    config = tmp_path / "config.json"
    if damage == "missing":
        config.unlink()
    else:
        config.write_text("" if damage == "empty file" else "{}")
    with pytest.raises(ValueError, match=message):
        DSparkDrafter.from_pretrained(tmp_path, target=llama)


@pytest.mark.parametrize("field, value", [
    ("mask_token_id", "x"),
    ("markov_rank", -1),
    ("rope_parameters", {"rope_type": "nonsense", "rope_theta": 10000.0}),
    ("rope_parameters", {"rope_type": "default"}),
])
def test_bad_config_values_are_named(llama, tmp_path, field, value):
    drafter_for(llama).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg[field] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=field):
        DSparkDrafter.from_pretrained(tmp_path, target=llama)


def test_target_cast_after_binding_is_refused_at_generate():
    model = tiny_target()
    drafter = drafter_for(model)
    model.to(torch.bfloat16)
    with pytest.raises(ValueError, match="drafter dtype torch.float32 != target dtype torch.bfloat16"):
        model.generate(PROMPT, max_new_tokens=5, assistant_model=drafter)
    drafter.to(torch.bfloat16)  # what the message asks for: then it runs
    assert model.generate(PROMPT, max_new_tokens=5, assistant_model=drafter).shape[1] == PROMPT.shape[1] + 5
