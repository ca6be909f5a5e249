"""Goodness-of-fit of speculative sampling against the target's exact distribution, by enumeration.

On a tiny-vocabulary target the distribution of the first T generated tokens is computable exactly: run the
target over every prefix (V^t of them at step t), apply the same logits processors plain `generate` would,
and multiply. We then sample N generations with DSpark and G-test each position's marginal and the joint of
the first two drafted positions against the exact law. Used by test_sampling.py (and the scheduler tests).
Below the test itself: the tiny pair it runs on (`setup`, V = 8 tokens, STEPS, N samples), shared by every file that
G-tests a decoding set-up.
"""

from __future__ import annotations

import contextlib
import functools
import itertools

import numpy as np
import torch
from scipy import stats
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from hf_dspark import DSparkDrafter
from hf_dspark.decoding import candidate
from hf_dspark.decoding.ngram import NgramIndex
from hf_dspark.decoding.options import DecodingOptions
from tests.conftest import tiny_target
from tests.helpers import spread_confidence, synthetic_profile

# Significance level of every goodness-of-fit test in the suite, set from the tests' size and power, not from any
# one outcome: ~15 fixed-seed G-tests run under the null, so α = 1e-4 keeps the suite's family-wise false-alarm
# rate near 0.15% (at α = 0.01 it was ~14%, and any change in how the RNG is consumed re-rolls every test),
# while every negative control stays far below it: a wrong q gives p ≈ 5e-245; the look-ahead scheduler of
# §6.4 gives p = 7e-9, 1e-6, 3e-10 at seeds 123, 1, 2 (measured 2026-11-29).
ALPHA = 1e-4


def processors(temperature=1.0, top_k=None, top_p=None, repetition_penalty=None) -> LogitsProcessorList:
    """The list plain `generate` builds for these options (same classes, same order)."""
    out = LogitsProcessorList()
    if repetition_penalty is not None:
        out.append(RepetitionPenaltyLogitsProcessor(repetition_penalty))
    if temperature != 1.0:
        out.append(TemperatureLogitsWarper(temperature))
    if top_k is not None:
        out.append(TopKLogitsWarper(top_k))
    if top_p is not None:
        out.append(TopPLogitsWarper(top_p))
    return out


@torch.no_grad()
def exact_distribution(model, prompt: torch.Tensor, steps: int, procs: LogitsProcessorList,
                       eos: int | None = None) -> np.ndarray:
    """Exact probability of every continuation: array [V]*steps (float64). With `eos`, generation ends at it and
    the positions after it hold `eos` (how `sample_until_eos` pads a shorter output)."""
    V = model.config.vocab_size
    joint = np.ones([1])
    for t in range(steps):
        conts = torch.tensor(list(itertools.product(range(V), repeat=t)), dtype=torch.long).view(V**t, t)
        ids = torch.cat([prompt.expand(V**t, -1), conts], dim=1)
        logits = model(ids).logits[:, -1].float()
        probs = torch.softmax(procs(ids, logits), dim=-1).double().numpy()  # [V^t, V]
        if eos is not None:
            ended = (conts == eos).any(1).numpy()
            probs[ended] = np.eye(V)[eos]
        joint = (joint.reshape(-1, 1) * probs).reshape(-1)
    return joint.reshape([V] * steps)


def sample_counts(model, drafter, prompt, steps: int, n: int, seed: int, **gen) -> np.ndarray:
    """The tokens of `n` speculative generations of exactly `steps` tokens: array [n, steps]."""
    torch.manual_seed(seed)
    seqs = []
    for _ in range(n):
        out = model.generate(prompt, do_sample=True, max_new_tokens=steps, min_new_tokens=steps,
                             assistant_model=drafter, **gen)
        seqs.append(out[0, prompt.shape[1]:].tolist())
    return np.array(seqs).reshape(n, steps)


def sample_until_eos(model, drafter, prompt, steps: int, n: int, seed: int, eos: int, **gen) -> np.ndarray:
    """[n, steps] tokens of `n` speculative generations that may end at `eos`, padded with `eos`."""
    torch.manual_seed(seed)
    seqs = []
    for _ in range(n):
        out = model.generate(prompt, do_sample=True, max_new_tokens=steps, assistant_model=drafter, **gen)
        new = out[0, prompt.shape[1]:].tolist()
        seqs.append(new + [eos] * (steps - len(new)))
    return np.array(seqs)


def _g_test(observed: np.ndarray, expected_p: np.ndarray) -> float:
    """G-test p-value, pooling cells whose expected count is < 5 into one."""
    n = observed.sum()
    exp = expected_p * n
    small = exp < 5
    obs_c = np.append(observed[~small], observed[small].sum())
    exp_c = np.append(exp[~small], exp[small].sum())
    keep = exp_c > 0
    obs_c, exp_c = obs_c[keep], exp_c[keep]
    if len(obs_c) < 2:
        return 1.0
    exp_c = exp_c * obs_c.sum() / exp_c.sum()
    return float(stats.power_divergence(obs_c, exp_c, lambda_="log-likelihood").pvalue)


def fit_pvalue(samples: np.ndarray, exact: np.ndarray) -> float:
    """Bonferroni-combined p-value over each position's marginal and the joint of positions 2-3."""
    steps, V = samples.shape[1], exact.shape[0]
    pvals = []
    for t in range(steps):
        marg = exact.sum(axis=tuple(i for i in range(steps) if i != t))
        pvals.append(_g_test(np.bincount(samples[:, t], minlength=V), marg))
    if steps >= 3:
        pair = exact.sum(axis=tuple(i for i in range(steps) if i not in (1, 2))).reshape(-1)
        pvals.append(_g_test(np.bincount(samples[:, 1] * V + samples[:, 2], minlength=V * V), pair))
    return min(1.0, min(pvals) * len(pvals))


# ---- the pair the G-tests run on: a V = 8 target whose law over STEPS tokens is enumerable --------------------

V, STEPS, N = 8, 5, 600
PROMPT = torch.tensor([[1, 5, 2]])


def setup(head="markov", block=3, seed=0, draft_vocab=None, eos=None):
    model = tiny_target(vocab=V, hidden=16, layers=3, heads=2, kv_heads=1, seed=seed, logit_scale=6.0, eos=eos)
    torch.manual_seed(seed + 1)
    drafter = DSparkDrafter.from_target(model, block_size=block, target_layer_ids=[0, 1], head_type=head,
                                        markov_rank=4, mask_token_id=V - 1)
    drafter.options = DecodingOptions("all", ngram_drafts=False)  # these cases are about every head under "all"
    if draft_vocab is not None:
        drafter.set_draft_vocab(draft_vocab)
    if drafter.markov_head is not None:  # a strong sequential bias, so q differs a lot from the base logits
        with torch.no_grad():
            for p in drafter.markov_head.parameters():
                p.normal_(0.0, 1.0)
    return model, drafter


@contextlib.contextmanager
def ngram_drafts(drafter, min_ngram):
    """drafter.options.ngram_drafts on, with n-grams down to `min_ngram` tokens (the shipped index starts at 2)."""
    real = candidate.NgramIndex
    candidate.NgramIndex = functools.partial(NgramIndex, min_ngram=min_ngram)
    drafter.options.ngram_drafts = True
    try:
        yield
    finally:
        candidate.NgramIndex = real


def ngram_share(model, drafter, calls=30, **gen) -> float:
    """Share of rounds with drafts that took n-gram drafts, over `calls` sampled generations."""
    torch.manual_seed(0)
    lookup = drafted = 0
    for _ in range(calls):
        model.generate(PROMPT, do_sample=True, max_new_tokens=STEPS, assistant_model=drafter, **gen)
        lookup += drafter.last_stats.ngram_rounds
        drafted += drafter.last_stats.drafted_rounds
    return lookup / drafted


GENTLE = [1.0, 1.5, 1.8, 2.0]  # Θ_1 > Θ_0 iff a_1 > .5: every length 0..3 gets chosen


def scheduled_setup(policy, verify_time=GENTLE):
    """setup()'s pair with spread confidences, a synthetic profile on `verify_time` and `policy`."""
    model, drafter = setup(head="markov")
    spread_confidence(drafter)
    drafter.options.device_profile = synthetic_profile(model, drafter, verify_time)
    drafter.options.verify_policy = policy
    return model, drafter
