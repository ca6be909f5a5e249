"""DSparkStats (decoding/stats.py): the metrics, defined once, on hand-built rounds, and the records a generate()
call leaves in `drafter.last_stats`."""

import math

import pytest

from hf_dspark.decoding.stats import DSparkStats, Round
from tests.helpers import BLOCK, PROMPT, drafter_for, oracle_drafts


def test_stats_are_consistent(llama):
    drafter = drafter_for(llama)
    free = llama.generate(PROMPT, do_sample=False, max_new_tokens=60)
    with oracle_drafts(free):
        llama.generate(PROMPT, do_sample=False, max_new_tokens=60, assistant_model=drafter)
    st = drafter.last_stats
    assert all(r.accepted <= r.verified <= r.drafted <= BLOCK for r in st.rounds)
    assert all(r.committed in (r.accepted, r.accepted + 1) for r in st.rounds)
    assert all(len(r.target_probs) == r.verified for r in st.rounds)
    assert all(len(r.confidence) == r.drafted for r in st.rounds)
    # Greedy: every accepted draft is the target's argmax, and a rejected one is not.
    assert st.tau == pytest.approx(sum(r.committed for r in st.rounds) / len(st.rounds))
    cond = st.conditional_acceptance
    assert all(0.0 <= c <= 1.0 for c in cond)


def _round(drafted, verified, accepted, committed, source="dspark"):
    return Round(drafted=drafted, verified=verified, accepted=accepted, committed=committed, draft_time=0.5,
                 verify_time=1.0, source=source)


def test_metrics_on_hand_built_rounds():
    """τ counts the bonus token; acceptance_rate[k] = accepted ≥ k / verified ≥ k; conditional_acceptance[k] =
    accepted ≥ k / (verified ≥ k and accepted ≥ k - 1); a round without drafts is a round of τ = 1."""
    st = DSparkStats(block_size=3, new_tokens=9)
    for r in (_round(3, 3, 3, 4), _round(3, 2, 1, 2), _round(0, 0, 0, 1), _round(2, 2, 0, 1, "ngram")):
        st.add(r)
    assert st.tau == pytest.approx(8 / 4)
    assert (st.drafted_rounds, st.ngram_rounds) == (3, 1)
    assert st.acceptance_rate == pytest.approx([2 / 3, 1 / 3, 1.0])
    assert st.conditional_acceptance == pytest.approx([2 / 3, 1 / 2, 1.0])
    assert st.acceptance_histogram == {0: 2, 1: 1, 3: 1} and st.verify_lengths == {0: 1, 2: 2, 3: 1}
    assert (st.draft_time, st.verify_time) == (2.0, 4.0)
    summary = st.summary()
    assert (summary["tau"], summary["rounds"], summary["ngram_rounds"]) == (st.tau, 4, 1)
    assert summary["conditional_acceptance"] == st.conditional_acceptance
    assert "τ=2.00 over 4 rounds (3 drafted, 1 by n-grams)" in str(st)


def test_no_rounds_and_positions_never_verified():
    st = DSparkStats(block_size=2)
    assert st.tau == 0.0 and st.tokens_per_second == 0.0 and st.acceptance_histogram == {}
    st.add(_round(1, 1, 0, 1))
    assert st.acceptance_rate[0] == 0.0 and st.conditional_acceptance[0] == 0.0
    assert math.isnan(st.acceptance_rate[1]) and math.isnan(st.conditional_acceptance[1])
