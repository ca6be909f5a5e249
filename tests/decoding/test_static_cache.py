"""A static KV cache (`cache_implementation="static"` or an empty StaticCache object) under DSpark: rolled back by
moving its position, so greedy output equals plain generate's and sampling follows the target's law."""

import pytest
import torch
from transformers import StaticCache

from hf_dspark import DSparkDrafter
from tests.conftest import tiny_target
from tests.helpers import oracle_drafts
from tests.sampling_check import ALPHA, exact_distribution, fit_pvalue, processors

PROMPT = torch.tensor([[5, 17, 3, 42, 8, 11, 5, 17, 3]])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("policy", ["all", 2])
def test_greedy_on_a_static_cache_equals_plain(family, policy):
    """Every acceptance length (oracle drafts right with p 0.7), n-gram rounds included, on both ways of asking for
    a static cache; plain generate runs on its default cache."""
    model = tiny_target(family)
    torch.manual_seed(0)
    drafter = DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 2])
    drafter.options.verify_policy = policy
    plain = model.generate(PROMPT, do_sample=False, max_new_tokens=40)
    for kw in (dict(cache_implementation="static"),
               dict(past_key_values=StaticCache(config=model.config, max_cache_len=64))):
        with oracle_drafts(plain):
            out = model.generate(PROMPT, do_sample=False, max_new_tokens=40, assistant_model=drafter, **kw)
        assert out.tolist() == plain.tolist(), kw
        accepted = {r.accepted for r in drafter.last_stats.rounds if r.verified}
        assert len(accepted) > 2, accepted  # partial and full acceptance both happened


def test_sampling_on_a_static_cache_follows_the_targets_law():
    """G-test of DSpark's sampled continuations on a static cache against the exact law (V = 8, every sequence of
    STEPS tokens enumerable): rejection sampling and the rollback both run on the static cache."""
    from tests.sampling_check import N, PROMPT as SMALL, STEPS, sample_counts, setup

    model, drafter = setup(head="markov")
    exact = exact_distribution(model, SMALL, STEPS, processors())
    samples = sample_counts(model, drafter, SMALL, STEPS, N, seed=7, cache_implementation="static")
    assert any(r.verified > r.accepted for r in drafter.last_stats.rounds)  # rejections happened
    p = fit_pvalue(samples, exact)
    assert p >= ALPHA, f"static cache: samples deviate from the target's law (p={p:.2e})"


def test_other_cache_implementations_are_refused_by_name():
    model = tiny_target()
    drafter = DSparkDrafter.from_target(model, block_size=3, target_layer_ids=[0, 2])
    for impl in ("offloaded", "quantized", "offloaded_static"):
        with pytest.raises(NotImplementedError, match=f"cache_implementation='{impl}'"):
            model.generate(PROMPT, max_new_tokens=4, assistant_model=drafter, cache_implementation=impl)


def test_negative_control_a_static_cache_that_is_not_rolled_back_differs(monkeypatch):
    """The greedy test can fail: when StaticLayer.crop leaves one rejected draft in the cache (a room of 128
    positions, so the cache does not overflow) the output is not plain generate's."""
    from transformers.cache_utils import StaticLayer

    model = tiny_target()
    torch.manual_seed(0)
    drafter = DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 2])
    drafter.options.verify_policy = "all"
    plain = model.generate(PROMPT, do_sample=False, max_new_tokens=40)
    crop = StaticLayer.crop
    monkeypatch.setattr(StaticLayer, "crop", lambda self, n: crop(self, n + 1) if n < -1 else None)
    with oracle_drafts(plain):
        out = model.generate(PROMPT, do_sample=False, max_new_tokens=40, assistant_model=drafter,
                             past_key_values=StaticCache(config=model.config, max_cache_len=128))
    assert out.tolist() != plain.tolist()
