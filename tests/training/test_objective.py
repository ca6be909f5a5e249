"""training/objective.py: the teacher-forced forward over anchor blocks and the simulated τ it reports."""

import math

import torch

from hf_dspark.model.drafter import DSparkDraftModel
from hf_dspark.training.anchors import sample_blocks
from hf_dspark.training.objective import DraftObjective, simulated_tau
from tests.conftest import tiny_target


def test_simulated_tau_on_hand_terms():
    terms = {
        "valid": torch.tensor([[True, True, True], [True, True, False]]),  # the second block is not whole: skipped
        "conf_label": torch.tensor([[0.5, 0.5, 0.5], [1.0, 1.0, 1.0]]),
        "draft_top": torch.tensor([[4, 9, 6], [1, 1, 1]]),
        "target_top": torch.tensor([[4, 8, 6], [1, 1, 1]]),
    }
    out = simulated_tau(terms)
    assert out == {"tau_t1": 1 + 0.5 + 0.25 + 0.125, "tau_greedy": 2.0, "blocks": 1}
    none = simulated_tau({**terms, "valid": torch.zeros(2, 3, dtype=torch.bool)})
    assert math.isnan(none["tau_t1"]) and none["blocks"] == 0


def test_forward_gives_per_slot_terms_of_kept_blocks_in_the_draft_vocabulary():
    target = tiny_target()
    torch.manual_seed(0)
    drafter = DSparkDraftModel.from_target(target, block_size=3, target_layer_ids=[0, 2], markov_rank=4)
    drafter.set_draft_vocab(range(0, 64, 2))
    ids = torch.randint(0, 64, (2, 12))
    loss_mask = torch.ones(2, 12, dtype=torch.long)
    loss_mask[:, :4] = 0  # a 4-token prompt
    lengths = torch.tensor([12, 9])
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
        blocks = sample_blocks(ids, loss_mask, lengths, num_anchors=4, block_size=3, mask_token_id=1,
                               generators=[torch.Generator().manual_seed(i) for i in range(2)])
        terms = DraftObjective(drafter)(torch.cat([hs[1], hs[3]], -1), target.model.norm(hs[-1]), blocks)
    kept = int(blocks.keep.sum())
    assert kept == 8
    for key in ("ce", "l1", "conf", "conf_label", "valid", "draft_top", "target_top"):
        assert terms[key].shape == (kept, 3), key
    assert set(terms["draft_top"].flatten().tolist()) <= set(range(0, 64, 2))  # drafts come from the pruned rows
    assert torch.isfinite(terms["ce"][terms["valid"]]).all()
