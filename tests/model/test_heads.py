"""The sequential heads, the confidence head and the reference sampler (model/heads.py). The Triton kernels that
replace parts of it are checked against it in tests/model/test_kernels.py."""


import numpy as np
import torch

from hf_dspark.model.heads import draw
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
