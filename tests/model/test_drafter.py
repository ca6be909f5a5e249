"""DSparkDraftModel (model/drafter.py), the network alone: `from_target` and `bind`, saving and loading its own
weights only, a round (`draft`), the pruned draft vocabulary (`set_draft_vocab`, `draft_weights`) and the
calibrated confidences (`confidence_probs`)."""

import pytest
import torch
from safetensors.torch import load_file

from hf_dspark import DSparkDrafter
from hf_dspark.model.drafter import DSparkDraftModel
from hf_dspark.model.heads import DraftBlock
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


def test_a_one_file_save_over_a_sharded_one_leaves_no_stale_index(tmp_path):
    """A checkpoint saved in shards, then saved again as one file into the same folder (what calibrating a training
    checkpoint in place does): the old index, naming shards that are gone, is removed; a sharded save keeps its own."""
    model = tiny_target()
    drafter = DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 2])
    drafter.save_pretrained(tmp_path, max_shard_size="20KB")
    index = tmp_path / "model.safetensors.index.json"
    assert index.exists() and len(list(tmp_path.glob("model-*.safetensors"))) > 1
    drafter.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not index.exists()
    assert not list(tmp_path.glob("model-*.safetensors"))
    again = DSparkDrafter.from_pretrained(tmp_path, target=model)
    assert all(torch.equal(a, b) for a, b in zip(drafter.state_dict().values(), again.state_dict().values()))


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


def test_the_network_is_sized_for_its_target_and_binds_without_routing():
    """DSparkDraftModel.from_target sizes a drafter for the target (its widths and vocabulary, the highest id that is
    no special token as mask) and binds it: bound_target, base logits through the target's LM head. It enables
    nothing on the target: routing generate() is decoding's (DSparkDrafter). Unbound, `target` says so."""
    model = tiny_target()
    cls = type(model)
    net = DSparkDraftModel.from_target(model, block_size=4, target_layer_ids=[0, 2])
    assert type(net) is DSparkDraftModel and net.bound_target is model and net.target is model
    assert type(model) is cls and not getattr(model, "_is_dspark_enabled", False)
    assert (net.config.hidden_size, net.config.vocab_size, net.config.target_num_hidden_layers) == (32, 64, 4)
    assert net.config.mask_token_id == 63  # tiny_target has no EOS, PAD or BOS
    h = torch.randn(2, 32)
    with torch.no_grad():
        torch.testing.assert_close(net.base_logits(h), model.lm_head(h).float())
    unbound = DSparkDraftModel(net.config)
    assert unbound.bound_target is None
    with pytest.raises(RuntimeError, match="not bound to a target"):
        unbound.target
    assert unbound.bind(model) is unbound and unbound.bound_target is model


def test_a_round_drafts_n_tokens_with_their_logits_and_confidences():
    """draft(): a DraftBlock of n drafts (tokens [n], the logits [n, V] they were drawn from, raw and calibrated
    confidences); the same context gives the same greedy block, whose tokens are the argmax of the logits a sampled
    round of the same context returns (a greedy round returns none: the target judges its tokens)."""
    model = tiny_target()
    torch.manual_seed(1)
    net = DSparkDraftModel.from_target(model, block_size=4, target_layer_ids=[0, 2], markov_rank=8)
    n_ctx = PROMPT.shape[1] - 1  # the committed context; the prompt's last token is the anchor
    with torch.no_grad():
        hs = model(PROMPT, output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i + 1] for i in net.config.target_layer_ids], dim=-1)[:, :n_ctx]
        ctx = net.context_kv(feats, torch.arange(n_ctx)[None])
        block = net.draft(ctx, PROMPT, 3)
        again = net.draft(ctx, PROMPT, 3)
        sampled = net.draft(ctx, PROMPT, 3, do_sample=True)
    assert isinstance(block, DraftBlock)
    assert block.tokens.shape == (3,) and block.logits is None and block.conf_logits.shape == (3,)
    assert sampled.logits.shape == (3, 64) and torch.equal(block.tokens, again.tokens)
    assert block.tokens[0] == sampled.logits[0].argmax()  # the first position's q does not depend on a draw
    torch.testing.assert_close(block.confidences, net.confidence_probs(block.conf_logits).cpu())


def test_draft_weights_are_the_draft_vocabularys_rows():
    """draft_weights: the full LM head and W2 without a draft vocabulary; with one, its sorted unique ids and exactly
    their rows. set_draft_vocab(None) drops the buffer and goes back to the full vocabulary; ids outside it are
    refused."""
    model = tiny_target()
    drafter = drafter_for(model)
    head, w2 = model.lm_head.weight, drafter.markov_head.W2.weight
    vocab, rows, w2_rows = drafter.draft_weights()
    assert vocab is None and rows.weight is head and w2_rows is w2 and rows.bias is None  # no copy, no bias
    assert not any(m is rows for m in drafter.modules())  # a standalone module: in no state dict
    drafter.set_draft_vocab([40, 3, 9, 3])
    vocab, rows, w2_rows = drafter.draft_weights()
    assert vocab.tolist() == [3, 9, 40] and drafter.config.draft_vocab_size == 3
    assert torch.equal(rows.weight, head[[3, 9, 40]]) and torch.equal(w2_rows, w2[[3, 9, 40]])
    assert "draft_vocab" in dict(drafter.named_buffers())
    drafter.set_draft_vocab(None)
    assert drafter.draft_vocab is None and drafter.config.draft_vocab_size is None
    assert "draft_vocab" not in dict(drafter.named_buffers()) and drafter.draft_weights()[0] is None
    for bad in ([], [-1, 3], [64]):
        with pytest.raises(ValueError, match="draft vocabulary"):
            drafter.set_draft_vocab(bad)
