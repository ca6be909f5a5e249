"""The sequential heads, the confidence head and the reference sampler (model/heads.py). The Triton kernels that
replace parts of it are checked against it in tests/model/test_kernels.py."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hf_dspark.model.heads import HEADS, ConfidenceHead, build_head, draw, sequential_draft
from tests.sampling_check import ALPHA, _g_test


def test_draw_follows_softmax_and_never_draws_a_zero():
    """heads.draw (the reference path's per-token sampler): its counts pass the G-test against softmax(z), tokens
    of probability 0 (the draft vocabulary's -inf) are never drawn, even when the uniform rounds onto the CDF's
    end; a sampler off by a little (a shifted CDF) fails the same test."""
    z = torch.tensor([[0.0, float("-inf"), 1.0, 2.0, -1.0, float("-inf")]])
    p = torch.softmax(z, -1)[0].numpy()
    torch.manual_seed(0)
    xs = np.array([int(draw(z)) for _ in range(20_000)])
    counts = np.bincount(xs, minlength=6)
    assert counts[1] == counts[5] == 0
    assert _g_test(counts, p) > ALPHA
    wrong = np.roll(p, 1)  # negative control: the same counts against a slightly different law
    assert _g_test(counts, (p + 0.05 * wrong) / (p + 0.05 * wrong).sum()) < ALPHA
    real = torch.rand
    try:  # the largest double below 1: u rounds onto cdf[-1], and the last token with mass is drawn, not the -inf
        torch.rand = lambda *a, **k: torch.full((1, 1), 1 - 2**-53, dtype=torch.float64)
        assert int(draw(z)) == 4
    finally:
        torch.rand = real


def _config(head_type):
    return SimpleNamespace(head_type=head_type, vocab_size=16, markov_rank=4, hidden_size=8)


def test_build_head_makes_the_configured_head():
    for name, cls in HEADS.items():
        head = build_head(_config(name))
        assert head is None if cls is None else type(head) is cls, name


@pytest.mark.parametrize("head_type", [name for name, cls in HEADS.items() if cls is not None])
def test_block_is_the_steps_teacher_forced(head_type):
    """A head's `block` (every position at once, teacher-forced, as training runs it) equals its `step` applied left
    to right (as drafting runs it), biases and previous-token embeddings alike; through `w2` rows (a pruned draft
    vocabulary) the same columns of the bias."""
    torch.manual_seed(0)
    head = build_head(_config(head_type))
    prev, h = torch.randint(0, 16, (2, 5)), torch.randn(2, 5, 8)
    with torch.no_grad():
        bias, emb = head.block(prev, h)
        state, biases, embs = None, [], []
        for k in range(5):
            b, e, state = head.step(prev[:, k], h[:, k], state)
            biases.append(b)
            embs.append(e)
        rows = torch.tensor([1, 4, 9])
        pruned, _ = head.block(prev, h, head.W2.weight[rows])
    assert bias.shape == (2, 5, 16) and emb.shape == (2, 5, 4)
    torch.testing.assert_close(bias, torch.stack(biases, 1))
    torch.testing.assert_close(emb, torch.stack(embs, 1))
    torch.testing.assert_close(pruned, bias[..., rows])


def test_confidence_head_reads_the_previous_token_only_when_told():
    torch.manual_seed(0)
    h, e = torch.randn(3, 8), torch.randn(3, 4)
    with torch.no_grad():
        with_prev = ConfidenceHead(12)
        z = with_prev(h, e)
        torch.testing.assert_close(z, with_prev.proj(torch.cat([h, e], -1)).squeeze(-1))
        alone = ConfidenceHead(8, use_prev=False)
        torch.testing.assert_close(alone(h, e), alone(h, None))
    assert z.shape == (3,)


@pytest.mark.parametrize("pruned", [False, True], ids=["full-vocab", "pruned-vocab"])
@pytest.mark.parametrize("with_processor", [False, True], ids=["raw", "processed"])
def test_greedy_drafts_without_logits_are_the_same_tokens(pruned, with_processor):
    """need_logits=False (greedy rounds: nothing needs q) returns no logits and the same tokens and confidences as
    the full path, whose tokens are its logits' argmax: on a pruned vocabulary without processors it takes the
    argmax over the draft vocabulary's own columns, which must map back to the same full-vocabulary ids. Sampled
    drafts must keep q."""
    torch.manual_seed(0)
    head = build_head(_config("rnn"))
    confidence = ConfidenceHead(8 + 4)
    vocab = torch.tensor([0, 2, 3, 7, 11, 15]) if pruned else None
    n = 6
    base = torch.randn(n, 6 if pruned else 16)
    w2 = head.W2.weight[vocab] if pruned else None

    def penalty(ids, z):  # a processor that reads the drafts so far, as transformers' penalties do
        return z - 0.5 * torch.zeros_like(z).scatter_(1, ids, 1.0)

    processor = penalty if with_processor else None
    args = (base, torch.randn(n, 8), torch.tensor(3), head, confidence, torch.tensor([[1, 5, 3]]), processor, False)
    with torch.no_grad():
        full = sequential_draft(*args, vocab=vocab, w2=w2, vocab_size=16)
        fast = sequential_draft(*args, vocab=vocab, w2=w2, vocab_size=16, need_logits=False)
    assert fast.logits is None and full.logits.shape == (n, 16)
    assert torch.equal(fast.tokens, full.tokens) and torch.equal(full.tokens, full.logits.argmax(-1))
    assert torch.equal(fast.conf_logits, full.conf_logits)
    if pruned:
        assert set(fast.tokens.tolist()) <= set(vocab.tolist())
    with pytest.raises(ValueError, match="sampled drafts need their logits"):
        sequential_draft(*args[:-1], True, vocab=vocab, w2=w2, vocab_size=16, need_logits=False)


@pytest.mark.parametrize("warpers", ["none", "temperature-top-k", "top-p-min-p"])
def test_sampled_drafts_on_the_draft_vocabulary_are_the_full_rows_draws(warpers, monkeypatch):
    """A sampled draft whose processors are all row-wise warpers (heads.ROW_WARPERS) is processed and drawn on the
    draft vocabulary's V' columns: from the same seed, the same tokens and the same q rows (-inf outside the draft
    vocabulary) as the full-vocabulary path, which a processor outside ROW_WARPERS still takes."""
    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import (MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)

    torch.manual_seed(0)
    head = build_head(_config("markov"))
    vocab = torch.tensor([0, 2, 3, 7, 11, 15])
    n = 6
    base, hidden = torch.randn(n, 6) * 2, torch.randn(n, 8)
    chosen = {"none": [], "temperature-top-k": [TemperatureLogitsWarper(0.7), TopKLogitsWarper(3)],
              "top-p-min-p": [TopPLogitsWarper(0.8), MinPLogitsWarper(0.1)]}[warpers]

    def identity(ids, z):  # not a row warper: sends the draft down the full-vocabulary path
        return z

    from hf_dspark.model import heads

    widths, real_draw = [], heads.draw
    monkeypatch.setattr(heads, "draw", lambda z: (widths.append(z.shape[-1]), real_draw(z))[1])
    runs = {}
    for name, procs in (("narrow", LogitsProcessorList(chosen) if chosen else None),
                        ("full", LogitsProcessorList([*chosen, identity]))):
        torch.manual_seed(5)
        with torch.no_grad():
            runs[name] = sequential_draft(base, hidden, torch.tensor(3), head, None, torch.tensor([[1, 5, 3]]), procs,
                                          True, vocab=vocab, w2=head.W2.weight[vocab], vocab_size=16)
    narrow, full = runs["narrow"], runs["full"]
    assert widths == [6] * n + [16] * n  # drawn over V' columns, then over V
    assert narrow.tokens.tolist() == full.tokens.tolist() and set(narrow.tokens.tolist()) <= set(vocab.tolist())
    assert narrow.logits.shape == (n, 16)
    outside = torch.ones(16, dtype=torch.bool)
    outside[vocab] = False
    assert torch.isneginf(narrow.logits[:, outside]).all()
    torch.testing.assert_close(narrow.logits, full.logits, rtol=1e-6, atol=1e-6)
    assert torch.isfinite(narrow.logits[torch.arange(n), narrow.tokens]).all()  # every token has mass in its q
