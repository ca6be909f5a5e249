"""DSparkStats (decoding/stats.py): the metrics, defined once, on hand-built rounds, and the records a generate()
call leaves in `drafter.last_stats`."""


import pytest

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
