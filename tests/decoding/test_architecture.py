"""check_architecture (decoding/architecture.py): architectures DSpark cannot serve exactly are refused, at
`from_target` and at `bind`, each with its reason in the message; the architectures it serves pass untouched.
The whole matrix of transformers' causal LMs runs in tests/test_architectures.py."""

import pytest
import torch
from transformers import BertConfig, BertLMHeadModel

from hf_dspark import DSparkDrafter
from hf_dspark.decoding.architecture import check_architecture
from hf_dspark.model.binding import UnsupportedArchitectureError
from tests.arch_matrix import build
from tests.helpers import drafter_for


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


def test_bidirectional_encoder_head_is_refused_unless_a_decoder():
    torch.manual_seed(0)
    cfg = dict(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
               max_position_embeddings=128, pad_token_id=0)
    with pytest.raises(UnsupportedArchitectureError, match="is_decoder=False"):
        DSparkDrafter.from_target(BertLMHeadModel(BertConfig(**cfg)).eval())
    DSparkDrafter.from_target(BertLMHeadModel(BertConfig(is_decoder=True, **cfg)).eval())  # as a decoder: served


def test_a_served_target_passes_untouched(llama):
    """check_architecture itself, without a drafter: a Llama passes (None), its probe forward leaves the global RNG,
    the model's class (no routing enabled) and its parameters as they were; a state-space model is refused."""
    before = {k: v.clone() for k, v in llama.state_dict().items()}
    cls = type(llama)
    torch.manual_seed(3)
    state = torch.random.get_rng_state()
    assert check_architecture(llama) is None
    assert torch.equal(torch.random.get_rng_state(), state)
    assert type(llama) is cls and not getattr(llama, "_is_dspark_enabled", False)
    assert all(torch.equal(before[k], v) for k, v in llama.state_dict().items())
    with pytest.raises(UnsupportedArchitectureError, match="stateful"):
        check_architecture(build("mamba"))
