"""Test-only tools: an oracle that makes drafts partly right, so every acceptance length gets exercised."""

from __future__ import annotations

import contextlib

import torch

from hf_dspark import DSparkDrafter
from hf_dspark.decoding.ngram import NgramIndex


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


@contextlib.contextmanager
def oracle_ngrams(reference: torch.Tensor, vocab: int, p_right: float = 0.7, every: int = 2, seed: int = 0):
    """N-gram drafts that fire every `every`-th lookup whatever the text: the reference continuation, each token
    kept with probability `p_right` (else shifted by one), so the no-logits verification path sees partial
    acceptance of every length on targets whose own output never repeats."""
    real = NgramIndex.draft
    gen = torch.Generator().manual_seed(seed)
    calls = [0]

    def patched(self, num):
        real(self, num)  # keep the index's own bookkeeping
        calls[0] += 1
        start = len(self.seq)
        if num <= 0 or calls[0] % every or start >= reference.shape[1]:
            return []
        right = reference[0, start:start + num].tolist()
        return [t if torch.rand((), generator=gen) < p_right else (t + 1) % vocab for t in right]

    NgramIndex.draft = patched
    try:
        yield
    finally:
        NgramIndex.draft = real
