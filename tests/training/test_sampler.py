"""Continuous batching: greedy rows equal per-prompt `generate`; sampled rows follow the top-p law (G-test)."""


import pytest
import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

from tests._tiny import tiny_target
from tests.sampling_check import _g_test

from hf_dspark.training.sampler import Job, answer, draw, sample


@pytest.mark.parametrize("bucket", [64, 4])
def test_greedy_rows_equal_generate(bucket, monkeypatch):
    # bucket 4 grows the buffers every few steps, pads them on the left for longer prompts and drops dead
    # columns on the left as soon as four are free
    from hf_dspark.training import sampler

    monkeypatch.setattr(sampler, "BUCKET", bucket)
    drops = []
    fit = sampler._SlotCache.fit
    monkeypatch.setattr(sampler._SlotCache, "fit",
                        lambda self, drop=0, **kw: drops.append(drop) or fit(self, drop, **kw))
    t = tiny_target()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 60, (int(n),), generator=g).tolist() for n in torch.randint(2, 12, (9,), generator=g)]
    jobs = [Job(str(i), p, temperature=0.0) for i, p in enumerate(prompts)]
    got = dict((j.key, r) for j, r in answer(t, jobs, [2], max_new_tokens=10, slots=4, prefill_batch=2))
    assert len(got) == len(jobs)
    for j in jobs:
        ref = t.generate(torch.tensor([j.prompt_ids]), max_new_tokens=10, do_sample=False, pad_token_id=0,
                         eos_token_id=2)[0, len(j.prompt_ids):].tolist()
        assert got[j.key] == ref
    assert bucket > 4 or any(drops)  # the compaction under test did run
    assert t.config._attn_implementation != "dspark_grouped_decode"  # restored afterwards



def test_rows_finishing_apart_stay_packed_and_equal_generate(monkeypatch):
    # weights with a large spread make each answer depend on its context, and several EOS ids end answers at
    # different steps, so finished rows hand their slots to the last live row (a KV copy) again and again
    from hf_dspark.training import sampler

    moves = []
    move = sampler._SlotCache.move
    monkeypatch.setattr(sampler._SlotCache, "move", lambda self, *a: moves.append(a) or move(self, *a))
    rows = []
    t = tiny_target()
    for p in t.parameters():
        if p.dim() == 2:
            p.data.normal_(0, 0.5, generator=torch.Generator().manual_seed(p.numel()))
    forward = t.forward
    monkeypatch.setattr(t, "forward", lambda *a, **k: rows.append(k["input_ids"].shape[0]) or forward(*a, **k))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 60, (int(n),), generator=g).tolist() for n in torch.randint(2, 12, (12,), generator=g)]
    jobs = [Job(str(i), p, temperature=0.0) for i, p in enumerate(prompts)]
    eos = [2, 5, 7, 11]
    got = dict((j.key, r) for j, r in answer(t, jobs, eos, max_new_tokens=24, slots=4, prefill_batch=2))
    steps = rows[:]
    lengths = set()
    for j in jobs:
        ref = t.generate(torch.tensor([j.prompt_ids]), max_new_tokens=24, do_sample=False, pad_token_id=0,
                         eos_token_id=eos)[0, len(j.prompt_ids):].tolist()
        assert got[j.key] == ref
        lengths.add(len(ref))
    assert len(lengths) > 3 and len(moves) > 2  # answers ended apart and rows were moved
    assert 1 in steps and max(steps) == 4  # the last answer drained alone: no step computes free slots

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


def test_draw_follows_weights_across_blocks():
    # 90 weights in blocks of 16 (the last one padded), spanning six orders of magnitude, some zero
    g = torch.Generator().manual_seed(0)
    w = torch.rand(90, generator=g) * 10.0 ** -torch.randint(0, 6, (90,), generator=g)
    w[[0, 17, 40, 89]] = 0.0
    n = 60000
    got = draw(w.expand(n, -1), torch.Generator().manual_seed(1), block=16)
    assert not set(got.tolist()) & {0, 17, 40, 89}  # a zero weight is never drawn
    assert _g_test(torch.bincount(got, minlength=90).numpy(), (w / w.sum()).double().numpy()) > 1e-3
    # negative control: moving a tenth of the top weight's mass to another index is detected
    off = w.clone()
    top = int(w.argmax())
    off[top], off[(top + 1) % 90] = w[top] * 0.9, w[(top + 1) % 90] + w[top] * 0.1
    assert _g_test(torch.bincount(got, minlength=90).numpy(), (off / off.sum()).double().numpy()) < 1e-6
