"""Pairing checks and strict loading: every mismatch is an error that names it, nothing is lost."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_dspark import DSparkConfig, DSparkDrafter
from tests.conftest import tiny_target


def make(model, **kw):
    kw.setdefault("target_layer_ids", [0, 2])
    return DSparkDrafter.from_target(model, block_size=4, **kw)


@pytest.mark.parametrize("other, message", [
    (dict(hidden=48), "hidden_size"),
    (dict(vocab=96), "vocab_size"),
    (dict(layers=6), "num_hidden_layers"),
    (dict(family="qwen3"), "model_type"),
])
def test_wrong_target_is_named(other, message):
    drafter = make(tiny_target())
    with pytest.raises(ValueError, match=message):
        drafter.bind(tiny_target(**other))


def test_last_layer_is_never_tapped():
    with pytest.raises(ValueError, match="last one is never tapped"):
        make(tiny_target(layers=4), target_layer_ids=[1, 3])


def test_mask_token_must_not_be_eos():
    model = tiny_target(eos=7)
    with pytest.raises(ValueError, match="EOS or PAD"):
        make(model, mask_token_id=7)
    assert make(model).config.mask_token_id != 7


def test_dtype_and_device_mismatch():
    model = tiny_target()
    drafter = make(model)
    with pytest.raises(ValueError, match="dtype"):
        drafter.to(torch.bfloat16).bind(model)


def test_config_validation():
    with pytest.raises(ValueError, match="head_type"):
        DSparkConfig(head_type="lstm", target_layer_ids=[0], mask_token_id=1)
    with pytest.raises(ValueError, match="block_size"):
        DSparkConfig(block_size=0, target_layer_ids=[0], mask_token_id=1)
    with pytest.raises(ValueError, match="block_size"):
        DSparkConfig(block_size=1000, target_layer_ids=[0], mask_token_id=1)
    with pytest.raises(ValueError, match="strictly increasing"):
        DSparkConfig(target_layer_ids=[2, 1], mask_token_id=1)
    ok = {"temperature": 1.0, "confidence_temperatures": [0.5, 1.0, 2.0], "prefix_survival": [0.5, 0.2, 0.1]}
    assert DSparkConfig(block_size=3, target_layer_ids=[0], mask_token_id=1, calibration=[ok]).calibration == [ok]
    for bad in ({"temperature": 1.0, "prefix_survival": [0.5, 0.2]}, {"temperature": 1.0, "prefix_survival": [0.2, 0.5, 0.1]},
                {"temperature": -1.0, "prefix_survival": [0.5, 0.2, 0.1]}, {"prefix_survival": [0.5, 0.2, 0.1]},
                {"temperature": 1.0, "prefix_survival": [1.5, 0.2, 0.1]}, {**ok, "confidence_temperatures": [1.0, 0.0, 1.0]},
                {**ok, "confidence_temperatures": [1.0]}, {**ok, "extra": 1}, [ok, dict(ok)], [], "t=1"):
        with pytest.raises(ValueError, match="calibration"):
            DSparkConfig(block_size=3, target_layer_ids=[0], mask_token_id=1, calibration=bad)


def test_calibration_per_temperature_scales_each_call_with_its_nearest_entry():
    """Entries per sampling temperature: a call takes the nearest one's STS temperatures (greedy and T = 1 differ);
    without entries, or with the temperature unknown, the top-level ones. The pre-list format (one dict, no
    temperatures of its own) is read as one entry with the top-level temperatures."""
    greedy = {"temperature": 0.0, "confidence_temperatures": [2.0, 2.0, 2.0], "prefix_survival": [0.8, 0.6, 0.5]}
    t1 = {"temperature": 1.0, "confidence_temperatures": [0.5, 0.5, 0.5], "prefix_survival": [0.4, 0.2, 0.1]}
    cfg = DSparkConfig(block_size=3, target_layer_ids=[0], mask_token_id=1, calibration=[t1, greedy],
                       confidence_temperatures=[1.5, 1.5, 1.5])
    assert [c["temperature"] for c in cfg.calibration] == [0.0, 1.0]  # canonical: sorted
    temps_at = lambda t: cfg.confidence_scaling_at(t)[0]  # noqa: E731
    assert temps_at(0.0) == [2.0] * 3 and temps_at(0.3) == [2.0] * 3
    assert temps_at(0.7) == [0.5] * 3 and temps_at(1.3) == [0.5] * 3
    assert cfg.confidence_scaling_at(None) == ([1.5] * 3, [0.0] * 3) and cfg.calibration_at(None) is None
    assert cfg.calibration_at(0.5)["temperature"] == 0.0  # a tie takes the lower
    bare = DSparkConfig(block_size=3, target_layer_ids=[0], mask_token_id=1, confidence_temperatures=[1.5, 1.5, 1.5])
    assert bare.calibration is None and bare.confidence_scaling_at(0.0) == ([1.5] * 3, [0.0] * 3)
    shifted = DSparkConfig(block_size=3, target_layer_ids=[0], mask_token_id=1,
                           calibration=[{**greedy, "confidence_biases": [-0.5, 0.0, 0.25]}])
    assert shifted.confidence_scaling_at(0.0) == ([2.0] * 3, [-0.5, 0.0, 0.25])  # an entry without biases: 0
    legacy = DSparkConfig(block_size=3, target_layer_ids=[0], mask_token_id=1, confidence_temperatures=[0.9, 1.1, 1.3],
                          calibration={"temperature": 1.0, "prefix_survival": [0.4, 0.2, 0.1]})
    assert legacy.calibration == [{"temperature": 1.0, "confidence_temperatures": [0.9, 1.1, 1.3],
                                   "prefix_survival": [0.4, 0.2, 0.1]}]
    again = DSparkConfig.from_dict(cfg.to_dict())
    assert again.calibration == cfg.calibration
    with pytest.raises(ValueError, match="calibration"):
        DSparkConfig(block_size=3, target_layer_ids=[0], mask_token_id=1,
                     calibration=[{**greedy, "confidence_biases": [0.0, float("nan"), 0.0]}])


def test_drafter_confidences_follow_the_calls_temperature():
    """draft(temperature=) and confidence_probs scale raw logits with that temperature's entry."""
    drafter = make(tiny_target())
    g = drafter.config.block_size
    drafter.config.calibration = [
        {"temperature": 0.0, "confidence_temperatures": [4.0] * g, "prefix_survival": [0.5] * g},
        {"temperature": 1.0, "confidence_temperatures": [0.25] * g, "confidence_biases": [-1.0] * g,
         "prefix_survival": [0.5] * g}]
    z = torch.full((g,), 2.0)
    assert torch.allclose(drafter.confidence_probs(z, 0.0), torch.sigmoid(z / 4.0))
    assert torch.allclose(drafter.confidence_probs(z, 1.0), torch.sigmoid(z / 0.25 - 1.0))
    assert torch.allclose(drafter.confidence_probs(z), torch.sigmoid(z / torch.tensor(drafter.config.confidence_temperatures)))


def test_save_load_round_trip_stores_no_target_weights(tmp_path):
    model = tiny_target()
    drafter = make(model)
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


def test_missing_unexpected_and_corrupt_checkpoints(tmp_path):
    model = tiny_target()
    make(model).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")

    missing = dict(weights)
    del missing["fc.weight"]
    save_file(missing, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="fc.weight"):
        DSparkDrafter.from_pretrained(tmp_path, target=model)

    extra = dict(weights, **{"surprise.weight": torch.zeros(2)})
    save_file(extra, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="surprise.weight"):
        DSparkDrafter.from_pretrained(tmp_path, target=model)

    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    raw = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="could not load"):
        DSparkDrafter.from_pretrained(tmp_path, target=model)


def test_pickle_checkpoints_are_never_loaded(tmp_path):
    model = tiny_target()
    drafter = make(model)
    drafter.config.save_pretrained(tmp_path)
    torch.save(drafter.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="safetensors only"):
        DSparkDrafter.from_pretrained(tmp_path, target=model)


def test_config_for_wrong_shape_is_named(tmp_path):
    model = tiny_target()
    make(model).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["markov_rank"] = 16  # no longer matches the stored W1/W2
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="markov_w1.weight: stored"):
        DSparkDrafter.from_pretrained(tmp_path, target=model)


def test_unbound_drafter_on_a_plain_model_explains_itself():
    model = tiny_target()
    cfg = DSparkConfig.for_target(model.config, block_size=4, target_layer_ids=[0, 2], mask_token_id=60)
    with pytest.raises(RuntimeError, match="not a standalone model"):
        model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=5, assistant_model=DSparkDrafter(cfg))
