"""Synthetic DeepSpec checkpoints written from the documented format alone (deepspec-checkpoints.md §2-§3),
independently of hf_dspark.model.deepspec: every config field and tensor key as DeepSpec writes them, tiny sizes,
random bf16 values, embedding / LM head copied from the target."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Gemma4ForCausalLM, Gemma4TextConfig


def tiny_gemma4(vocab: int = 64, layers: int = 4, hidden: int = 32, seed: int = 0, logit_scale: float = 1.0):
    """A random Gemma-4 text LM (k_eq_v global layers, softcap 30, proportional RoPE), fp32, built from a config."""
    torch.manual_seed(seed)
    cfg = Gemma4TextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=16, num_global_key_value_heads=1,
        attention_k_eq_v=True, hidden_size_per_layer_input=0, vocab_size_per_layer_input=vocab, sliding_window=16,
        layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"], final_logit_softcapping=30.0,
        max_position_embeddings=256, pad_token_id=None, bos_token_id=None, eos_token_id=None, tie_word_embeddings=True,
    )
    model = Gemma4ForCausalLM(cfg)
    if logit_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(logit_scale)  # tied: scales the embedding too, as intended for sharp laws
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model.eval()


def qwen3_config(target, *, layers=2, taps=(0, 2), block=4, mask=None, rank=8, head="vanilla", conf=True,
                 with_markov=True) -> dict:
    """config.json of a Qwen3DSparkModel drafter for `target` (§2.6 layout)."""
    tc = target.config
    cfg = {
        "architectures": ["Qwen3DSparkModel"], "attention_bias": False, "attention_dropout": 0.0,
        "block_size": block, "bos_token_id": None, "dtype": "bfloat16", "enable_confidence_head": conf,
        "eos_token_id": tc.eos_token_id, "head_dim": tc.head_dim, "hidden_act": "silu", "hidden_size": tc.hidden_size,
        "initializer_range": 0.02, "intermediate_size": tc.intermediate_size,
        "layer_types": ["full_attention"] * layers, "markov_rank": rank,
        "mask_token_id": tc.vocab_size - 1 if mask is None else mask,
        "max_position_embeddings": tc.max_position_embeddings, "max_window_layers": tc.num_hidden_layers,
        "model_type": "qwen3", "num_anchors": 512, "num_attention_heads": tc.num_attention_heads,
        "num_hidden_layers": layers, "num_key_value_heads": tc.num_key_value_heads,
        "num_target_layers": tc.num_hidden_layers, "pad_token_id": None, "rms_norm_eps": tc.rms_norm_eps,
        "rope_parameters": {"rope_theta": tc.rope_parameters["rope_theta"], "rope_type": "default"},
        "sliding_window": None, "target_layer_ids": list(taps), "tie_word_embeddings": False,
        "transformers_version": "5.10.2", "use_cache": True, "use_sliding_window": False, "vocab_size": tc.vocab_size,
    }
    if rank > 0:
        cfg["markov_head_type"] = head
    if conf:
        cfg["confidence_head_with_markov"] = with_markov
    return cfg


def gemma4_config(target, *, layers=2, taps=(0, 2), block=4, mask=4, rank=8, head="vanilla", conf=True,
                  with_markov=True, k_eq_v=True) -> dict:
    """config.json of a Gemma4DSparkModel drafter for a Gemma-4 `target` (§2.2, §2.3, §2.5 layout)."""
    tc = target.config
    cfg = {
        "architectures": ["Gemma4DSparkModel"], "attention_bias": False, "attention_dropout": 0.0,
        "attention_k_eq_v": k_eq_v, "block_size": block, "bos_token_id": 2, "dtype": "bfloat16",
        "enable_confidence_head": conf, "enable_moe_block": False, "eos_token_id": 1,
        "final_logit_softcapping": tc.final_logit_softcapping, "global_head_dim": 16, "head_dim": 8,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": tc.hidden_size, "hidden_size_per_layer_input": 0,
        "initializer_range": 0.02, "intermediate_size": tc.intermediate_size, "layer_types": ["full_attention"] * layers,
        "markov_rank": rank, "mask_token_id": mask, "max_position_embeddings": tc.max_position_embeddings,
        "model_type": "gemma4_unified_text", "num_anchors": 512, "num_attention_heads": tc.num_attention_heads,
        "num_global_key_value_heads": 1, "num_hidden_layers": layers, "num_key_value_heads": 2,
        "num_kv_shared_layers": 0, "num_target_layers": tc.num_hidden_layers, "pad_token_id": 0,
        "rms_norm_eps": tc.rms_norm_eps,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
            "rope_type": "default", "rope_theta": None,  # §2.5: added by RoPE standardisation, to be ignored
        },
        "sliding_window": 16, "target_layer_ids": list(taps), "target_model_type": "gemma4_unified",
        "target_text_model_type": "gemma4_unified_text", "tie_word_embeddings": False,
        "transformers_version": "5.10.2", "use_bidirectional_attention": "vision", "use_cache": True,
        "use_double_wide_mlp": False, "vocab_size": tc.vocab_size, "vocab_size_per_layer_input": tc.vocab_size,
    }
    if rank > 0:
        cfg["markov_head_type"] = head
    if conf:
        cfg["confidence_head_with_markov"] = with_markov
    return cfg


def tensors_for(cfg: dict, target, seed: int = 0, scale: float = 0.3) -> dict[str, torch.Tensor]:
    """The state dict DeepSpec saves for `cfg` (§3.2-§3.4): documented keys and shapes, random bf16 values."""
    g = torch.Generator().manual_seed(seed)
    gemma = cfg["architectures"][0] == "Gemma4DSparkModel"
    d, V, m, H, F = cfg["hidden_size"], cfg["vocab_size"], len(cfg["target_layer_ids"]), cfg["num_attention_heads"], cfg["intermediate_size"]
    h = cfg["global_head_dim"] if gemma else cfg["head_dim"]
    K = cfg["num_global_key_value_heads"] if gemma and cfg["attention_k_eq_v"] else cfg["num_key_value_heads"]
    r = cfg["markov_rank"]

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    def norm(n):
        return (1.0 + 0.1 * torch.randn(n, generator=g)).to(torch.bfloat16)

    t = {"embed_tokens.weight": target.get_input_embeddings().weight.detach().to(torch.bfloat16).clone(),
         "lm_head.weight": target.get_output_embeddings().weight.detach().to(torch.bfloat16).clone(),
         "fc.weight": rnd(d, m * d), "hidden_norm.weight": norm(d), "norm.weight": norm(d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        t |= {p + "input_layernorm.weight": norm(d), p + "post_attention_layernorm.weight": norm(d),
              p + "self_attn.q_proj.weight": rnd(H * h, d), p + "self_attn.k_proj.weight": rnd(K * h, d),
              p + "self_attn.o_proj.weight": rnd(d, H * h), p + "self_attn.q_norm.weight": norm(h),
              p + "self_attn.k_norm.weight": norm(h), p + "mlp.gate_proj.weight": rnd(F, d),
              p + "mlp.up_proj.weight": rnd(F, d), p + "mlp.down_proj.weight": rnd(d, F)}
        if not (gemma and cfg["attention_k_eq_v"]):
            t[p + "self_attn.v_proj.weight"] = rnd(K * h, d)
        if gemma:
            t |= {p + "pre_feedforward_layernorm.weight": norm(d), p + "post_feedforward_layernorm.weight": norm(d),
                  p + "layer_scalar": torch.ones(1, dtype=torch.bfloat16)}
    if r > 0:
        t |= {"markov_head.markov_w1.weight": rnd(V, r), "markov_head.markov_w2.weight": rnd(V, r)}
        if cfg["markov_head_type"] == "gated":
            t |= {"markov_head.gate_proj.weight": rnd(r, d + r), "markov_head.gate_proj.bias": rnd(r)}
        if cfg["markov_head_type"] == "rnn":
            t |= {"markov_head.joint_proj.weight": rnd(3 * r, 2 * r + d), "markov_head.joint_proj.bias": rnd(3 * r)}
    if cfg["enable_confidence_head"]:
        width = d + r if cfg["confidence_head_with_markov"] else d
        t |= {"confidence_head.proj.weight": rnd(1, width), "confidence_head.proj.bias": rnd(1)}
    return t


def write(folder, cfg: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """Save as `save_pretrained` does: config.json + one model.safetensors with metadata format=pt."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def checkpoint(folder, target, family="qwen3", seed=0, **cfg_kw) -> Path:
    cfg = (gemma4_config if family == "gemma4" else qwen3_config)(target, **cfg_kw)
    return write(folder, cfg, tensors_for(cfg, target, seed=seed))
