"""DeepSpec exports a transformers 5.24 reader can parse (Gemma-4 per-layer config re-indexed to the
drafter's layers, num_global_key_value_heads always, no PretrainedConfig bookkeeping keys), and a float16 target
accepts a checkpoint whose stored embedding is its own (compared in the target's dtype)."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from hf_dspark import DSparkDrafter
from hf_dspark.model import deepspec
from tests.conftest import tiny_target
from tests.deepspec_files import checkpoint, tiny_gemma4

GENERIC = ("id2label", "label2id", "return_dict", "output_hidden_states", "output_attentions", "problem_type",
           "chunk_size_feed_forward", "is_encoder_decoder")


def _export(tmp_path, target, family, **kw):
    src = checkpoint(tmp_path / "src", target, family, **kw)
    drafter = DSparkDrafter.from_pretrained(src, target=target)
    deepspec.export(drafter, tmp_path / "out")
    return drafter, tmp_path / "out", json.loads((tmp_path / "out" / "config.json").read_text())


@pytest.mark.parametrize("k_eq_v", [True, False])
def test_gemma4_export_parses_on_this_transformers(tmp_path, k_eq_v):
    target = tiny_gemma4(layers=6)  # its only full-attention layer is 5, outside the drafter's [0, 2)
    assert list(target.config.to_dict()["per_layer_config"]) == ["5"]
    drafter, out, raw = _export(tmp_path, target, "gemma4", k_eq_v=k_eq_v)
    assert sorted(raw["per_layer_config"]) == ["0", "1"]
    parsed = AutoConfig.from_pretrained(out)  # raised "per_layer_config keys must be ... in [0, 2); got [5]"
    for i in range(raw["num_hidden_layers"]):
        assert parsed.per_layer_config[i].head_dim == raw["global_head_dim"] == drafter.config.head_dim
        assert parsed.per_layer_config[i].num_key_value_heads == drafter.config.num_key_value_heads
    assert raw["num_global_key_value_heads"] == 1  # required by DeepSpec with or without shared keys
    if not k_eq_v:
        assert raw["num_key_value_heads"] == drafter.config.num_key_value_heads == 2
    assert not set(GENERIC) & set(raw)
    again = DSparkDrafter.from_pretrained(out, target=target)
    a, b = drafter.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_qwen3_export_has_no_bookkeeping_keys(tmp_path):
    _, out, raw = _export(tmp_path, tiny_target("qwen3"), "qwen3")
    assert not set(GENERIC) & set(raw) and "per_layer_config" not in raw
    assert AutoConfig.from_pretrained(out).model_type == "qwen3"


def _as_loaded_in_fp16(target):
    """A target as `from_pretrained(bf16 file, dtype=float16)` holds it: the bf16 values cast to fp16."""
    with torch.no_grad():
        for p in target.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return target.to(torch.float16)


def test_float16_target_accepts_its_own_stored_embedding(tmp_path):
    target = tiny_target("qwen3")
    with torch.no_grad():  # values bf16 holds but fp16 flushes to zero (a real embedding always has some)
        target.get_input_embeddings().weight[:4, 0] = 1e-9
        target.get_output_embeddings().weight[:4, 1] = -1e-9
    src = checkpoint(tmp_path / "src", target, "qwen3")
    assert load_file(src / "model.safetensors")["embed_tokens.weight"][0, 0] != 0
    half = _as_loaded_in_fp16(target)
    assert half.get_input_embeddings().weight[0, 0] == 0
    drafter = DSparkDrafter.from_pretrained(src, target=half)  # refused before: "another revision of the target"
    assert drafter.dtype == torch.float16


def test_float16_target_of_another_revision_is_still_refused(tmp_path):
    target = tiny_target("qwen3")
    src = checkpoint(tmp_path / "src", target, "qwen3")
    other = _as_loaded_in_fp16(tiny_target("qwen3"))
    with torch.no_grad():
        other.get_input_embeddings().weight[3, 3] += 0.25
    with pytest.raises(ValueError, match="another revision of the target"):
        DSparkDrafter.from_pretrained(src, target=other)
