"""Test-only tools shared by several test files: oracles that make drafts partly right (so every acceptance length
gets exercised), the suite's standard drafter on a tiny target and its greedy-identity check, and synthetic device
profiles."""

from __future__ import annotations

import contextlib

import torch

from hf_dspark import DSparkDrafter
from hf_dspark.decoding.ngram import NgramIndex
from hf_dspark.decoding.options import DecodingOptions
from hf_dspark.decoding.profile import DeviceProfile, profile_key


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
            block.tokens[k] = right if ok else (right + 1) % self.config.vocab_size
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


BLOCK = 4
PROMPT = torch.tensor([[5, 17, 3, 42, 8, 11]])


def drafter_for(model, head="markov", **kw):
    """A drafter under "all", no n-grams: most tests that use it are about the round mechanics of verify-all."""
    torch.manual_seed(1)
    drafter = DSparkDrafter.from_target(model, block_size=BLOCK, target_layer_ids=[0, 2], head_type=head,
                                        markov_rank=8, **kw)
    drafter.options = DecodingOptions("all", ngram_drafts=False)
    return drafter


def assert_identical(model, drafter, oracle=True, **gen):
    """Greedy output with `drafter` equals plain generate's (drafts partly right with `oracle`); returns plain's."""
    plain = model.generate(PROMPT, do_sample=False, **gen)
    if oracle:
        with oracle_drafts(plain):
            spec = model.generate(PROMPT, do_sample=False, assistant_model=drafter, **gen)
    else:
        spec = model.generate(PROMPT, do_sample=False, assistant_model=drafter, **gen)
    assert spec.tolist() == plain.tolist()
    return plain


def synthetic_profile(model, drafter, verify_time, loop: str = "assisted") -> DeviceProfile:
    return DeviceProfile(key=profile_key(model, drafter, loop), verify_time=list(verify_time), draft_time=0.0,
                         rollback_time=0.0, cache_len=0, warmup=0, repeats=0)


def spread_confidence(drafter):
    """Random confidence weights of unit scale: c_k spreads over (0, 1) and depends strongly on x_{k-1}."""
    with torch.no_grad():
        drafter.confidence_head.proj.weight.normal_(0.0, 1.0)
        drafter.confidence_head.proj.bias.zero_()
