"""training/losses.py: position weights, the DSpark loss by hand, invalid slots, DFlash weights, draft-vocabulary terms."""

import math

import pytest
import torch

from hf_dspark.training.losses import LossWeights, dspark_loss, position_weights

torch.set_num_threads(1)


def test_position_weights():
    w = position_weights(7, 4.0)
    assert torch.allclose(w, torch.tensor([1, 0.7788, 0.6065, 0.4724, 0.3679, 0.2865, 0.2231]), atol=1e-4)


def test_losses_hand_computed():
    # one block of γ = 2, V = 2. Draft p = [0.5, 0.5] at both slots; target [1, 0] then [0.5, 0.5] (logits ±inf-ish).
    draft = torch.zeros(1, 2, 2)
    target = torch.tensor([[[30.0, -30.0], [0.0, 0.0]]])
    labels = torch.tensor([[0, 1]])
    valid = torch.tensor([[True, True]])
    conf = torch.zeros(1, 2)  # σ(0) = 0.5
    loss, m = dspark_loss(draft, target, labels, valid, conf)
    w0, w1 = 1.0, math.exp(-1 / 4)
    # L1 (no ½): slot 0 |.5-1|+|.5-0| = 1, slot 1 0.  CE: log 2 at both slots.
    assert m["l1"].item() == pytest.approx((w0 * 1 + w1 * 0) / (w0 + w1), abs=1e-5)
    assert m["ce"].item() == pytest.approx(math.log(2), abs=1e-5)
    # confidence labels 1 - ½·L1 = 0.5 and 1.0; BCE(logit 0, y) = log 2 whatever y.
    assert m["conf"].item() == pytest.approx(math.log(2), abs=1e-5)
    assert loss.item() == pytest.approx(0.1 * math.log(2) + 0.9 * m["l1"].item() + math.log(2), abs=1e-5)


def test_losses_invalid_slots_and_conf_label_detached():
    torch.manual_seed(0)
    draft = torch.randn(3, 4, 10, requires_grad=True)
    target = torch.randn(3, 4, 10)
    labels = torch.randint(0, 10, (3, 4))
    valid = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    conf = torch.randn(3, 4, requires_grad=True)
    _, m = dspark_loss(draft, target, labels, valid, conf)
    # changing invalid slots changes nothing
    draft2 = draft.detach().clone()
    draft2[0, 2:] += 5
    draft2[2] -= 3
    _, m2 = dspark_loss(draft2, target, labels, valid, conf)
    for k in m:
        assert m[k].item() == pytest.approx(m2[k].item(), abs=1e-6)
    # the confidence loss reaches the conf logits but not the draft logits (its label is detached)
    m["conf"].backward()
    assert draft.grad is None and conf.grad.abs().sum() > 0


def test_dflash_weights():
    w = LossWeights.dflash()
    assert (w.ce, w.l1, w.conf, w.decay) == (1.0, 0.0, 0.0, 4.0)


def test_draft_vocabulary_terms_equal_drafting_from_it():
    from hf_dspark.training.losses import block_terms

    torch.manual_seed(0)
    V, vocab = 12, torch.tensor([0, 2, 3, 7, 11])
    draft_sub = torch.randn(4, 3, vocab.numel())
    target = torch.randn(4, 3, V)
    labels = torch.tensor([[0, 7, 5], [11, 3, 1], [2, 2, 2], [9, 0, 7]])
    pruned = block_terms(draft_sub, target, labels, None, vocab)
    full = torch.full((4, 3, V), -torch.inf)
    full[..., vocab] = draft_sub  # q = 0 outside the draft vocabulary, as when drafting
    q, p = full.softmax(-1), target.softmax(-1)
    assert torch.allclose(pruned["l1"], (q - p).abs().sum(-1), atol=1e-5)
    inside = torch.isin(labels, vocab)
    ce = -q.gather(-1, labels.unsqueeze(-1)).squeeze(-1).log()
    assert torch.allclose(pruned["ce"][inside], ce[inside], atol=1e-5)
    assert torch.all(pruned["ce"][~inside] == 0)
