"""DSparkDraftModel (model/drafter.py), the network alone: `from_target` and `bind`, saving and loading its own
weights only, a round (`draft`), the pruned draft vocabulary (`set_draft_vocab`, `draft_weights`) and the
calibrated confidences (`confidence_probs`)."""

import pytest
import torch
from safetensors.torch import load_file

from hf_dspark import DSparkDrafter
from tests.conftest import tiny_target
from tests.helpers import PROMPT, assert_identical, drafter_for


def test_save_load_round_trip_stores_no_target_weights(tmp_path):
    model = tiny_target()
    drafter = DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 2])  # default options, as loaded
    drafter.save_pretrained(tmp_path)
    keys = load_file(tmp_path / "model.safetensors").keys()
    assert not any("embed" in k or "lm_head" in k for k in keys)
    again = DSparkDrafter.from_pretrained(tmp_path, target=model)
    for (k, a), (_, b) in zip(drafter.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), k
    ids = torch.tensor([[3, 4, 5, 6]])
    torch.manual_seed(0)
    x = model.generate(ids, do_sample=True, max_new_tokens=12, assistant_model=drafter)
    torch.manual_seed(0)
    y = model.generate(ids, do_sample=True, max_new_tokens=12, assistant_model=again)
    assert x.tolist() == y.tolist()


def test_drafter_confidences_follow_the_calls_temperature():
    """draft(temperature=) and confidence_probs scale raw logits with that temperature's entry."""
    drafter = drafter_for(tiny_target())
    g = drafter.config.block_size
    drafter.config.calibration = [
        {"temperature": 0.0, "confidence_temperatures": [4.0] * g, "prefix_survival": [0.5] * g},
        {"temperature": 1.0, "confidence_temperatures": [0.25] * g, "confidence_biases": [-1.0] * g,
         "prefix_survival": [0.5] * g}]
    z = torch.full((g,), 2.0)
    assert torch.allclose(drafter.confidence_probs(z, 0.0), torch.sigmoid(z / 4.0))
    assert torch.allclose(drafter.confidence_probs(z, 1.0), torch.sigmoid(z / 0.25 - 1.0))
    assert torch.allclose(drafter.confidence_probs(z), torch.sigmoid(z / torch.tensor(drafter.config.confidence_temperatures)))


@pytest.mark.parametrize("head", ["markov", "rnn"])
def test_pruned_draft_vocabulary_keeps_greedy_identity(llama, head):
    drafter = drafter_for(llama, head)
    free = llama.generate(PROMPT, do_sample=False, max_new_tokens=40)
    drafter.set_draft_vocab(free[0].unique().tolist()[::2])  # half of the tokens it will need: many misses
    assert drafter.config.draft_vocab_size == len(drafter.draft_vocab)
    assert_identical(llama, drafter, oracle=False, max_new_tokens=40)
    st = drafter.last_stats
    drafted = {t for r in st.rounds for t in r.tokens}
    assert drafted <= set(drafter.draft_vocab.tolist())


def test_pruned_draft_vocabulary_round_trips(llama, tmp_path):
    drafter = drafter_for(llama)
    drafter.set_draft_vocab([9, 3, 3, 40, 7])
    drafter.save_pretrained(tmp_path)
    again = DSparkDrafter.from_pretrained(tmp_path, target=llama)
    assert again.draft_vocab.tolist() == [3, 7, 9, 40] and again.config.draft_vocab_size == 4


def test_non_finite_drafter_logits_are_named_when_sampling(llama):
    drafter = drafter_for(llama)
    handle = drafter.norm.register_forward_hook(lambda m, a, out: out * float("nan"))
    try:
        with pytest.raises(ValueError, match=r"the drafter produced NaN/\+inf logits"):
            llama.generate(PROMPT, max_new_tokens=8, do_sample=True, assistant_model=drafter)
        plain = llama.generate(PROMPT, max_new_tokens=8, do_sample=False)  # greedy: drafts are only proposals
        assert llama.generate(PROMPT, max_new_tokens=8, do_sample=False, assistant_model=drafter).tolist() == plain.tolist()
    finally:
        handle.remove()
