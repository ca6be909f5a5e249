"""model/initialisation.py: a warm start copies the named target layers; init_from loads a drafter folder of the
same shape (one file or shards, with its draft vocabulary) and refuses any other."""

import pytest
import torch

from hf_dspark import DSparkDrafter
from hf_dspark.model.initialisation import init_from, warm_start
from tests._tiny import tiny_target

torch.set_num_threads(1)


def test_warm_start_copies_the_named_target_layers():
    t = tiny_target()
    decoder = t.get_decoder()
    d = DSparkDrafter.from_target(t, num_hidden_layers=2)
    random_init = {k: v.clone() for k, v in d.state_dict().items()}
    warm_start(d, decoder, [-1, 1])
    layers = decoder.layers
    for i, li in enumerate([-1, 1]):
        ours, theirs = d.layers[i].state_dict(), layers[li].state_dict()
        assert set(theirs) <= set(ours)
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert not torch.equal(d.layers[0].mlp.up_proj.weight, layers[1].mlp.up_proj.weight)  # layer 0 ← target -1
    assert torch.equal(d.norm.weight, decoder.norm.weight)
    assert not torch.equal(random_init["layers.0.self_attn.q_proj.weight"], layers[-1].self_attn.q_proj.weight)
    assert torch.equal(d.fc.weight, random_init["fc.weight"])  # fc and heads stay as they were
    with pytest.raises(ValueError, match="outside the target"):
        warm_start(DSparkDrafter.from_target(t, num_hidden_layers=1), decoder, [9])
    with pytest.raises(ValueError, match="2 target layers for a drafter with 1"):
        warm_start(DSparkDrafter.from_target(t, num_hidden_layers=1), decoder, [0, 1])


@pytest.mark.parametrize("shard", [None, "20KB"])
def test_init_from_loads_a_drafter_folder_of_the_same_shape(tmp_path, shard):
    t = tiny_target()
    saved = DSparkDrafter.from_target(t, num_hidden_layers=1, markov_rank=8).set_draft_vocab([0, 2, 5, 9])
    saved.save_pretrained(tmp_path / "d", **({"max_shard_size": shard} if shard else {}))
    assert (tmp_path / "d" / "model.safetensors.index.json").is_file() == bool(shard)
    fresh = DSparkDrafter.from_target(t, num_hidden_layers=1, markov_rank=8)
    init_from(fresh, tmp_path / "d")
    a, b = saved.state_dict(), fresh.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # incl. the draft vocabulary
    with pytest.raises(ValueError, match="does not fit.*markov_rank"):
        init_from(DSparkDrafter.from_target(t, num_hidden_layers=1, markov_rank=4), tmp_path / "d")
    with pytest.raises(ValueError, match="no config.json"):
        init_from(fresh, tmp_path / "nothing")
    (tmp_path / "d" / "config.json").unlink()
    with pytest.raises(ValueError, match="no config.json"):
        init_from(fresh, tmp_path / "d")


def test_init_from_grows_a_shallower_drafter_without_changing_its_drafts(tmp_path):
    t = tiny_target()
    torch.manual_seed(0)
    saved = DSparkDrafter.from_target(t, num_hidden_layers=1, markov_rank=8)
    saved.save_pretrained(tmp_path / "d")
    deeper = DSparkDrafter.from_target(t, num_hidden_layers=3, markov_rank=8)
    init_from(deeper, tmp_path / "d")
    a, b = saved.state_dict(), deeper.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(b["layers.2.mlp.up_proj.weight"], a["layers.0.mlp.up_proj.weight"])  # a copy of the top
    assert not b["layers.1.self_attn.o_proj.weight"].any() and not b["layers.2.mlp.down_proj.weight"].any()

    d, n = saved.config.hidden_size, 5
    feats = torch.randn(1, n, d * len(saved.config.target_layer_ids))
    block, pos = torch.randn(1, 4, d), torch.arange(n, n + 4)[None]

    def hidden(net):
        return net.backbone(block, pos, net.context_kv(feats, torch.arange(n)[None]))

    assert torch.equal(hidden(saved), hidden(deeper))  # identities until trained
    hidden(deeper).square().sum().backward()
    assert deeper.layers[2].self_attn.o_proj.weight.grad.abs().sum() > 0  # ... and they learn at once
    deeper.save_pretrained(tmp_path / "e")
    with pytest.raises(ValueError, match="does not fit.*num_hidden_layers"):  # never shallower
        init_from(DSparkDrafter.from_target(t, num_hidden_layers=1, markov_rank=8), tmp_path / "e")
