"""Tiny seeded random targets and drafters: the suite's workhorses (real SmolLM2 only where the test is about it)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the suite may reach the Hub
if not os.path.exists("/dev/nvidia0"):  # Triton picks interpreter vs compiler at first import: CPU = interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

torch.set_num_threads(int(os.environ.get("HF_DSPARK_TEST_THREADS", "1")))


def tiny_target(family: str = "llama", vocab: int = 64, layers: int = 4, hidden: int = 32, heads: int = 4,
                kv_heads: int = 2, seed: int = 0, eos: int | None = None, logit_scale: float = 1.0):
    """A random decoder-only LM built from a config (no download), fp32, eval mode."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, intermediate_size=2 * hidden, max_position_embeddings=256,
                  eos_token_id=eos, pad_token_id=None, bos_token_id=None, tie_word_embeddings=False)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=hidden // heads, **common))
    else:
        raise ValueError(family)
    if logit_scale != 1.0:  # sharper target distributions (tiny random LMs are near-uniform)
        with torch.no_grad():
            model.lm_head.weight.mul_(logit_scale)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = None
    return model.eval()


@pytest.fixture
def llama():
    return tiny_target("llama")


@pytest.fixture
def qwen3():
    return tiny_target("qwen3")


@pytest.fixture(scope="session")
def char_tokenizer():
    """A 64-character tokenizer (a-z, A-Z, 0-9, space, '.') for stop strings and streamers on tiny targets."""
    import string

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = string.ascii_lowercase + string.ascii_uppercase + string.digits + " ."
    t = Tokenizer(models.WordLevel(vocab={c: i for i, c in enumerate(chars)}, unk_token="."))
    t.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    t.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=t)
