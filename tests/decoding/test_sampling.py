"""Sampling exactness: DSpark's sampled output follows the target's distribution (not just "runs").

The negative control samples drafts from the Markov-corrected q but reports q without the Markov bias to
the verifier; the same test must reject it, which shows the test can fail. N-gram drafts (drafter.options.ngram_drafts)
get the same test, with 1-gram matches allowed so that about a third of the rounds take them here, and
their own negative control (lookup drafts reported as if drawn from a uniform q).
"""

import contextlib

import pytest
import torch

from hf_dspark.decoding import candidate
from hf_dspark.model import drafter as drafter_mod
from tests.sampling_check import (
    ALPHA,
    PROMPT,
    STEPS,
    N,
    V,
    exact_distribution,
    fit_pvalue,
    ngram_drafts,
    ngram_share,
    processors,
    sample_counts,
    sample_until_eos,
    setup,
)

CASES = {
    "temperature1-markov": (dict(head="markov"), dict()),
    "temperature0.7-topk4": (dict(head="markov"), dict(temperature=0.7, top_k=4)),
    "topp0.8-rnn": (dict(head="rnn"), dict(top_p=0.8)),
    "repetition-penalty-none-head": (dict(head="none", block=4), dict(repetition_penalty=1.5)),
    "pruned-draft-vocab-topk5": (dict(head="markov", draft_vocab=[0, 2, 3, 5, 6]), dict(top_k=5)),
    "ngram-drafts-1gram": (dict(head="markov", ngram=1), dict()),
    "ngram-drafts-1gram-temperature0.7-topk4": (dict(head="rnn", ngram=1), dict(temperature=0.7, top_k=4)),
    "ngram-drafts-shipped-sizes": (dict(head="markov", ngram=2), dict()),
}


@pytest.mark.parametrize("name", list(CASES))
def test_sampling_matches_target_distribution(name):
    setup_kw, gen = dict(CASES[name][0]), CASES[name][1]
    min_ngram = setup_kw.pop("ngram", None)
    model, drafter = setup(**setup_kw)
    exact = exact_distribution(model, PROMPT, STEPS, processors(**gen))
    with ngram_drafts(drafter, min_ngram) if min_ngram else contextlib.nullcontext():
        samples = sample_counts(model, drafter, PROMPT, STEPS, N, seed=123, **gen)
        share = ngram_share(model, drafter, **gen) if min_ngram else 0.0
    assert drafter.last_stats.rounds, "DSpark rounds must have run"
    if min_ngram == 1:  # the n-gram path carries a good share of the test (~1/3 of drafted rounds), not a stray round
        assert share > 0.25, share
    elif min_ngram:
        assert share > 0, share
    p = fit_pvalue(samples, exact)
    assert p >= ALPHA, f"{name}: speculative samples deviate from the target's law (p={p:.2e})"


@pytest.mark.parametrize("ngram", [None, 1], ids=["drafter", "with-ngrams"])
def test_sampling_with_drafted_stop_tokens_matches_target_distribution(ngram):
    """Blocks cut after a drafted EOS: the law of sequences that may end early is still the target's."""
    eos = 4
    model, drafter = setup(head="markov", block=4, eos=eos)
    exact = exact_distribution(model, PROMPT, STEPS, processors(), eos=eos)
    with ngram_drafts(drafter, ngram) if ngram else contextlib.nullcontext():
        samples = sample_until_eos(model, drafter, PROMPT, STEPS, N, seed=123, eos=eos)
    assert (samples == eos).any(1).mean() > 0.2, "too few sequences end early to test the cut"
    p = fit_pvalue(samples, exact)
    assert p >= ALPHA, f"with drafted stop tokens, samples deviate from the target's law (p={p:.2e})"


@contextlib.contextmanager
def q_without_markov_bias():
    """A deliberately wrong sampler: tokens are drawn from softmax(U + B) but the verifier is told q = softmax(U)."""
    real = drafter_mod.draft_block

    def wrong(base_logits, hidden, anchor, head, confidence, prefix_ids, processor, do_sample, **kw):
        block = real(base_logits, hidden, anchor, head, confidence, prefix_ids, processor, do_sample, **kw)
        block.logits = base_logits[: len(block.tokens)].clone()
        return block

    drafter_mod.draft_block = wrong
    try:
        yield
    finally:
        drafter_mod.draft_block = real


def test_negative_control_wrong_q_is_rejected():
    model, drafter = setup()
    exact = exact_distribution(model, PROMPT, STEPS, processors())
    with q_without_markov_bias():
        samples = sample_counts(model, drafter, PROMPT, STEPS, N, seed=123)
    p = fit_pvalue(samples, exact)
    assert p < ALPHA, f"the goodness-of-fit test failed to reject a biased sampler (p={p:.2e})"


@contextlib.contextmanager
def ngram_drafts_claim_uniform_q():
    """A deliberately wrong verifier input: n-gram drafts (a point mass) reported as drawn from a uniform q, so
    rejection sampling accepts them with min(1, V·p) instead of p."""
    real = candidate.DSparkCandidateGenerator._send

    def wrong(self, input_ids, cand, logits, drafts, conf, source, t0, lookup=()):
        if source == "ngram" and self.do_sample:
            logits = torch.zeros(1, cand.shape[1] - input_ids.shape[1], V)
        return real(self, input_ids, cand, logits, drafts, conf, source, t0, lookup)

    candidate.DSparkCandidateGenerator._send = wrong
    try:
        yield
    finally:
        candidate.DSparkCandidateGenerator._send = real


def test_negative_control_ngram_drafts_with_a_wrong_q_is_rejected():
    model, drafter = setup()
    exact = exact_distribution(model, PROMPT, STEPS, processors())
    with ngram_drafts(drafter, 1), ngram_drafts_claim_uniform_q():
        samples = sample_counts(model, drafter, PROMPT, STEPS, N, seed=123)
    p = fit_pvalue(samples, exact)
    assert p < ALPHA, f"the goodness-of-fit test failed to reject n-gram drafts verified against a wrong q (p={p:.2e})"


def test_plain_sampling_passes_the_same_test():
    """Calibration of the test itself: plain transformers sampling passes it."""
    model, _ = setup()
    exact = exact_distribution(model, PROMPT, STEPS, processors())
    torch.manual_seed(7)
    import numpy as np

    seqs = [model.generate(PROMPT, do_sample=True, max_new_tokens=STEPS, min_new_tokens=STEPS)[0, 3:].tolist()
            for _ in range(N)]
    assert fit_pvalue(np.array(seqs), exact) >= ALPHA
