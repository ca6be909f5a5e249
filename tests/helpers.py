"""Test-only tools: an oracle that makes drafts partly right, so every acceptance length gets exercised."""

from __future__ import annotations

import contextlib

import torch

from hf_dspark import DSparkDrafter


@contextlib.contextmanager
def oracle_drafts(reference: torch.Tensor, p_right: float = 0.7, seed: int = 0):
    """Within the block, replace each drafted token by the reference continuation (plain generate's output)
    with probability `p_right`, else by a wrong token. Greedy verification ignores draft logits, so this
    exercises partial acceptance of every length without a trained drafter."""
    real = DSparkDrafter.draft
    gen = torch.Generator().manual_seed(seed)

    def patched(self, context_kv, prefix_ids, n, **kw):
        block = real(self, context_kv, prefix_ids, n, **kw)
        start = prefix_ids.shape[1]
        for k in range(len(block.tokens)):
            pos = start + k
            right = reference[0, pos] if pos < reference.shape[1] else block.tokens[k]
            ok = torch.rand((), generator=gen) < p_right
            block.tokens[k] = right if ok else (right + 1) % block.logits.shape[-1]
        return block

    DSparkDrafter.draft = patched
    try:
        yield
    finally:
        DSparkDrafter.draft = real
