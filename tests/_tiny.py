"""Tiny seeded Llama targets and synthetic 'regenerated' data for the training tests."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_target(seed: int = 0, vocab: int = 64, layers: int = 4):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    from hf_dspark.decoding.routing import enable

    return enable(model)


@torch.no_grad()
def target_records(target, n: int, prompt_len: int = 6, resp_len: int = 40, seed: int = 0) -> list[dict]:
    """Prompts of random tokens answered by the target itself (greedy, so the data is learnable)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, target.config.vocab_size, (n, prompt_len), generator=g)
    out = target.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                          max_new_tokens=resp_len, min_new_tokens=resp_len, pad_token_id=0)
    return [{"id": f"tiny:{i}", "ids": out[i].tolist(), "n_prompt": prompt_len} for i in range(n)]
