"""Replay τ (hf_dspark/replay.py) against real speculative decoding on tiny random targets.

Greedy: the replayed rounds must equal the rounds `generate` reports, one by one (every head, a pruned draft
vocabulary, the length limit, EOS). Temperature 1: the distribution of accepted drafts per round from the
replay of plain target samples must match the one measured by running DSpark itself (chi-square homogeneity);
the negative control walks the same samples with the greedy acceptance rule and must be rejected.
"""

import pytest
import torch
from scipy.stats import chi2_contingency

from hf_dspark import DSparkDrafter
from hf_dspark.decoding.options import DecodingOptions
from hf_dspark.eval.replay import replay, responses_for, slot_scores, walk
from tests.conftest import tiny_target


def setup(head="markov", vocab=8, block=4, eos=None, draft_vocab=None, seed=0):
    model = tiny_target(vocab=vocab, hidden=16, layers=3, heads=2, kv_heads=1, seed=seed, logit_scale=3.0, eos=eos)
    torch.manual_seed(seed + 1)
    drafter = DSparkDrafter.from_target(model, block_size=block, target_layer_ids=[0, 1], head_type=head,
                                        markov_rank=4, mask_token_id=vocab - 1)
    drafter.options = DecodingOptions("all", ngram_drafts=False)  # replay replays verify-all rounds
    if draft_vocab is not None:
        drafter.set_draft_vocab(draft_vocab)
    return model, drafter


def prompts(n, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab - 1, (1, int(torch.randint(2, 7, (1,), generator=g))), generator=g) for _ in range(n)]


@pytest.mark.parametrize("head,eos,draft_vocab,max_new", [
    ("markov", None, None, 30), ("rnn", None, None, 9), ("none", None, None, 30),
    ("markov", 3, None, 30), ("markov", None, [0, 1, 2, 4, 5, 6], 30),
])
def test_greedy_replay_equals_generate_round_by_round(head, eos, draft_vocab, max_new):
    model, drafter = setup(head, eos=eos, draft_vocab=draft_vocab)
    accepted_any = False
    for ids in prompts(6, 8):
        out = model.generate(ids, assistant_model=drafter, do_sample=False, max_new_tokens=max_new)
        real = [(r.drafted, r.accepted, r.committed) for r in drafter.last_stats.rounds]
        rec = {"prompt_ids": ids[0].tolist(), "response_ids": out[0, ids.shape[1]:].tolist()}
        if len(rec["response_ids"]) < 2:
            continue
        st = replay(drafter, [rec], "greedy", max_new, progress=False)
        assert [(r.drafted, r.accepted, r.committed) for r in st.rounds] == real
        for mine, theirs in zip(st.rounds, drafter.last_stats.rounds):  # the confidences the scheduler would see
            assert mine.confidence == pytest.approx(theirs.confidence, abs=1e-5)
        accepted_any |= any(a for _, a, _ in real)
    assert accepted_any, "no draft was ever accepted: the comparison would be vacuous"


@pytest.mark.parametrize("k", [1, 2])
def test_capped_replay_equals_generate_at_a_static_length(k):
    """A static verify length k < γ − 1 runs k + 1 backbone slots (backbone_slots); slot_scores(slots=k + 1)
    walked k drafts a round must give generate's rounds, and the full γ-slot block must not be what it ran."""
    model, drafter = setup("markov", block=6)
    drafter.options = DecodingOptions(k, ngram_drafts=False)
    differs = False
    for ids in prompts(6, 8):
        out = model.generate(ids, assistant_model=drafter, do_sample=False, max_new_tokens=24)
        real = [(r.drafted, r.accepted, r.committed) for r in drafter.last_stats.rounds]
        P, resp = ids.shape[1], out[0, ids.shape[1]:].tolist()
        if len(resp) < 2:
            continue
        replayed, scores = {}, {}
        for slots in (k + 1, 6):
            scores[slots] = s = slot_scores(drafter, ids[0].tolist(), resp, slots=slots)
            rounds = walk(lambda a, j, m=s["match"]: bool(m[a - P, j]), P, P + len(resp), 24, k)
            replayed[slots] = [(r.drafted, r.accepted, r.committed) for r in rounds]
        assert replayed[k + 1] == real
        differs |= not torch.allclose(scores[6]["accept"][:, :k], scores[k + 1]["accept"][:, :k])
    with pytest.raises(ValueError, match="slots"):
        slot_scores(drafter, [1, 2], [3, 4], slots=7)
    assert differs, "full and capped blocks drafted alike on every prompt: the test could not tell them apart"


def test_walk_trims_blocks_at_the_length_limit_and_stops_at_the_end():
    rounds = walk(lambda a, j: True, P=3, L=3 + 10, max_new_tokens=10, block_size=4)
    assert [(r.drafted, r.accepted, r.committed) for r in rounds] == [(4, 4, 5), (3, 3, 4)]
    rounds = walk(lambda a, j: True, P=3, L=3 + 6, max_new_tokens=10, block_size=4)  # EOS at the 6th token
    assert [(r.drafted, r.accepted, r.committed) for r in rounds] == [(4, 4, 5)]


def test_greedy_replay_refuses_sampled_responses():
    model, drafter = setup()
    torch.manual_seed(0)
    recs = []
    for ids in prompts(4, 8):
        out = model.generate(ids, do_sample=True, top_k=0, max_new_tokens=20)
        recs.append({"prompt_ids": ids[0].tolist(), "response_ids": out[0, ids.shape[1]:].tolist()})
    with pytest.raises(ValueError, match="not .*greedy"):
        replay(drafter, recs, "greedy", 20, progress=False)


def test_each_mode_replays_the_answers_decoded_its_way():
    """One answer set of `hf-dspark data` holds greedy (#0) and sampled answers: greedy replays temperature 0,
    t1 replays temperature 1 without top-p; a set with neither for the mode is refused, saying what it holds."""
    recs = [{"id": "a#0", "temperature": 0.0, "top_p": None}, {"id": "a#1", "temperature": 1.0, "top_p": 1.0},
            {"id": "b#1", "temperature": 1.0, "top_p": None}, {"id": "c#1", "temperature": 1.0, "top_p": 0.9},
            {"id": "d#1", "temperature": 0.7, "top_p": 1.0}, {"id": "old"}]
    assert [r["id"] for r in responses_for(recs, "greedy")] == ["a#0", "old"]
    assert [r["id"] for r in responses_for(iter(recs), "t1")] == ["a#1", "b#1", "old"]
    with pytest.raises(ValueError, match=r"mode 'greedy'.*\(0.7, 1.0\)"):
        responses_for([recs[4]], "greedy")
    with pytest.raises(ValueError, match="mode"):
        responses_for(recs, "t0.7")


def _hist(rounds, block):
    return [sum(r.accepted == k for r in rounds) for k in range(block + 1)]


def test_t1_replay_matches_real_speculative_sampling():
    model, drafter = setup("markov", vocab=6, block=3, seed=2)
    N, T = 80, 10
    ps = prompts(N, 6, seed=1)
    torch.manual_seed(0)
    real = []
    for ids in ps:
        model.generate(ids, assistant_model=drafter, do_sample=True, top_k=0, max_new_tokens=T)
        real += drafter.last_stats.rounds
    torch.manual_seed(1)
    recs = []
    for ids in ps:  # plain samples of the target at T = 1
        out = model.generate(ids, do_sample=True, top_k=0, max_new_tokens=T)
        recs.append({"prompt_ids": ids[0].tolist(), "response_ids": out[0, ids.shape[1]:].tolist()})
    h_real, h_replay = _hist(real, 3), _hist(replay(drafter, recs, "t1", T, samples=3, progress=False).rounds, 3)
    assert sum(h_real[1:]) > 0.3 * len(real), h_real  # drafts do get accepted: the comparison is not vacuous
    assert chi2_contingency([h_real, h_replay])[1] > 1e-3, (h_real, h_replay)
    # negative control: the greedy rule (accept iff the drafter's argmax is the emitted token) on the same samples
    wrong = []
    for r in recs:
        P, m = len(r["prompt_ids"]), slot_scores(drafter, r["prompt_ids"], r["response_ids"])["match"]
        wrong += walk(lambda a, j: bool(m[a - P, j]), P, P + len(r["response_ids"]), T, 3)
    assert chi2_contingency([h_real, _hist(wrong, 3)])[1] < 1e-3, _hist(wrong, 3)
