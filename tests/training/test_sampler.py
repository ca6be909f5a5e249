"""Continuous batching: greedy rows equal per-prompt `generate`; sampled rows follow the top-p law (G-test)."""


import pytest
import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

from tests._tiny import tiny_target
from tests.sampling_check import _g_test

from hf_dspark.training.sampler import Job, answer, sample


@pytest.mark.parametrize("capacity,compact", [(1024, 1024), (24, 1024), (1024, 4)])
def test_greedy_rows_equal_generate(capacity, compact, monkeypatch):
    # capacity 24 forces growth and right-aligned pads; compact 4 drops dead columns
    # on the left every few steps while the buffer has room
    from hf_dspark.training import sampler

    drops = []
    shift = sampler._SlotCache.shift
    monkeypatch.setattr(sampler._SlotCache, "shift", lambda self, drop, **kw: drops.append(drop) or shift(self, drop, **kw))
    t = tiny_target()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 60, (int(n),), generator=g).tolist() for n in torch.randint(2, 12, (9,), generator=g)]
    jobs = [Job(str(i), p, temperature=0.0) for i, p in enumerate(prompts)]
    got = dict((j.key, r) for j, r in answer(t, jobs, [2], max_new_tokens=10, slots=4, prefill_batch=2,
                                             capacity=capacity, compact=compact))
    assert len(got) == len(jobs)
    for j in jobs:
        ref = t.generate(torch.tensor([j.prompt_ids]), max_new_tokens=10, do_sample=False, pad_token_id=0,
                         eos_token_id=2)[0, len(j.prompt_ids):].tolist()
        assert got[j.key] == ref
    assert compact > 4 or any(drops)  # the compaction under test did run
    assert t.config._attn_implementation != "dspark_grouped_decode"  # restored afterwards


def _warped_probs(logits, temperature, top_p):
    procs = LogitsProcessorList([TemperatureLogitsWarper(temperature), TopPLogitsWarper(top_p)])
    return procs(None, logits[None].clone())[0].softmax(-1)


# head 3: the nucleus does not fit the head, the full-sort path runs; top-p 1: no nucleus, a plain draw
@pytest.mark.parametrize("head,temperature,top_p,wrong_top_p", [(256, 0.7, 0.9, 0.8), (3, 0.7, 0.9, 0.8),
                                                                (256, 1.0, 1.0, 0.95)])
def test_sample_follows_transformers_top_p(head, temperature, top_p, wrong_top_p):
    torch.manual_seed(0)
    logits = torch.randn(40) * 2
    p = _warped_probs(logits, temperature, top_p)
    n = 20000
    gen = torch.Generator().manual_seed(1)
    draws = sample(logits.expand(n, -1), temperature, top_p, gen, head=head)
    assert set(draws.tolist()) <= set(torch.nonzero(p).flatten().tolist())  # never outside the nucleus
    assert _g_test(torch.bincount(draws, minlength=40).numpy(), p.numpy()) > 1e-3
    # negative control: the same test rejects draws from a narrower nucleus
    wrong = sample(logits.expand(n, -1), temperature, wrong_top_p, gen, head=head)
    assert _g_test(torch.bincount(wrong, minlength=40).numpy(), p.numpy()) < 1e-6


def test_jobs_are_sorted_by_prompt_length_within_windows_only():
    from hf_dspark.training.sampler import Job, by_length_in_windows

    jobs = [Job(str(i), [0] * n) for i, n in enumerate([5, 1, 3, 9, 2, 2, 7])]
    out = by_length_in_windows(jobs, 3)
    assert [j.key for j in out] == ["1", "2", "0", "4", "5", "3", "6"]  # windows {0,1,2} {3,4,5} {6}, stable
    assert by_length_in_windows(jobs, 0) == jobs and sorted(j.key for j in out) == sorted(j.key for j in jobs)
