"""DSparkConfig (model/config.py): validation of every field a drafter's config can carry, calibration entries
per sampling temperature, and `for_target` sizing a drafter for a target's config."""

import pytest

from hf_dspark import DSparkConfig, DSparkDrafter
from hf_dspark.model.binding import UnsupportedArchitectureError
from hf_dspark.model.config import calibration_entries, default_target_layer_ids
from tests import arch_matrix
from tests.arch_matrix import build
from tests.conftest import tiny_target


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


@pytest.mark.parametrize("gamma", [0, -3, 65, 10**6, 7.0, True, "7", None])
def test_absurd_block_sizes_are_named(gamma):
    with pytest.raises(ValueError, match="block_size"):
        DSparkConfig(block_size=gamma, target_layer_ids=[0], mask_token_id=1)


def test_attention_free_config_is_named_not_an_attribute_error():
    """A config without attention heads (a state-space model's) cannot size a drafter."""
    mamba = build("mamba").config
    with pytest.raises(UnsupportedArchitectureError, match="no attention heads"):
        DSparkConfig.for_target(mamba)


@pytest.mark.parametrize("model_type", ["gemma3_text", "gemma4_text", "olmo3"])
def test_rope_per_layer_type_gives_the_drafter_the_full_attention_entry(model_type):
    model = arch_matrix.build(model_type)
    drafter = DSparkDrafter.from_target(model, block_size=4, num_hidden_layers=1, markov_rank=8)
    rope = model.config.get_text_config().rope_parameters
    assert set(rope) >= {"sliding_attention", "full_attention"}  # the per-layer-type form of item 1
    assert drafter.config.rope_parameters["rope_theta"] == rope["full_attention"]["rope_theta"]


def test_for_target_copies_the_geometry_and_taps_below_the_last_layer():
    """for_target: the target's widths, heads, vocabulary and RoPE, what it was built for (model_type, depth), and
    DFlash's default taps (never the last layer); overrides win."""
    target = tiny_target(layers=4).config
    cfg = DSparkConfig.for_target(target, mask_token_id=5)
    assert (cfg.hidden_size, cfg.vocab_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (32, 64, 4, 2)
    assert cfg.head_dim == 8 and (cfg.target_model_type, cfg.target_num_hidden_layers) == ("llama", 4)
    assert cfg.target_layer_ids == default_target_layer_ids(4) == [0, 1, 2]
    assert cfg.rope_parameters["rope_theta"] == target.rope_parameters["rope_theta"]
    assert DSparkConfig.for_target(target, mask_token_id=5, target_layer_ids=[1]).target_layer_ids == [1]
    assert default_target_layer_ids(30) == [1, 8, 14, 20, 27] and default_target_layer_ids(36) == [1, 9, 17, 25, 33]
    with pytest.raises(ValueError, match="at least 2 layers"):
        default_target_layer_ids(1)


def test_calibration_entries_are_sorted_copies():
    """calibration_entries: entries sorted by temperature, as copies (the caller's lists stay as they were); a bare
    dict is one entry with the top-level temperatures; what is not entries is returned for validate() to name."""
    t1 = {"temperature": 1.0, "confidence_temperatures": (0.5, 0.5), "prefix_survival": [0.4, 0.2]}
    greedy = {"temperature": 0.0, "confidence_temperatures": [2.0, 2.0], "prefix_survival": [0.8, 0.6]}
    out = calibration_entries([t1, greedy], [1.0, 1.0])
    assert [c["temperature"] for c in out] == [0.0, 1.0] and out[1]["confidence_temperatures"] == [0.5, 0.5]
    out[0]["prefix_survival"].append(0.0)
    assert greedy["prefix_survival"] == [0.8, 0.6]
    assert calibration_entries({"temperature": 1.0, "prefix_survival": [0.4, 0.2]}, (0.9, 1.1)) == [
        {"temperature": 1.0, "confidence_temperatures": [0.9, 1.1], "prefix_survival": [0.4, 0.2]}]
    assert calibration_entries(None, [1.0]) is None and calibration_entries("t=1", [1.0]) == "t=1"
