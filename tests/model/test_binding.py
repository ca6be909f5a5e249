"""Pairing checks and strict loading: every mismatch is an error that names it, nothing is lost."""

import json
import pickle

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_dspark import DSparkDrafter
from tests.conftest import tiny_target
from tests.helpers import drafter_for


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


def saved(model, tmp_path, **kw):
    drafter_for(model, **kw).save_pretrained(tmp_path)
    return tmp_path


def test_non_finite_weights_are_refused(llama, tmp_path):
    path = saved(llama, tmp_path)
    weights = load_file(path / "model.safetensors")
    weights["fc.weight"][0, 0] = float("nan")
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="non-finite"):
        DSparkDrafter.from_pretrained(path, target=llama)


@pytest.mark.parametrize("damage", ["garbage header", "empty file", "flipped header length"])
def test_damaged_safetensors_are_named(llama, tmp_path, damage):
    path = saved(llama, tmp_path)
    f = path / "model.safetensors"
    raw = bytearray(f.read_bytes())
    if damage == "garbage header":
        raw[8:40] = b"\xff" * 32
    elif damage == "empty file":
        raw = bytearray()
    else:  # the 8-byte little-endian header length now points far past the end of the file
        raw[0:8] = (len(raw) * 10).to_bytes(8, "little")
    f.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="could not load"):
        DSparkDrafter.from_pretrained(path, target=llama)


class _Tripwire:
    """Unpickling this creates a file: proof that a pickle was executed."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.mark.parametrize("with_safetensors", [False, True])
def test_pickle_checkpoints_are_never_unpickled(llama, tmp_path, with_safetensors):
    marker = tmp_path / "unpickled"
    folder = tmp_path / "ckpt"
    drafter = drafter_for(llama)
    if with_safetensors:
        drafter.save_pretrained(folder)
    else:
        drafter.config.save_pretrained(folder)
    for name in ("pytorch_model.bin", "model.pt", "weights.pkl"):
        (folder / name).write_bytes(pickle.dumps({"fc.weight": _Tripwire(marker)}))
    if with_safetensors:  # safetensors wins; the pickles beside it are never opened
        again = DSparkDrafter.from_pretrained(folder, target=llama)
        assert torch.equal(again.fc.weight, drafter.fc.weight)
    else:
        with pytest.raises(ValueError, match="safetensors only"):
            DSparkDrafter.from_pretrained(folder, target=llama)
    assert not marker.exists()


def test_mask_token_equal_to_pad_or_any_eos_is_refused():
    model = tiny_target()
    model.generation_config.pad_token_id = 9
    with pytest.raises(ValueError, match="EOS or PAD"):
        drafter_for(model, mask_token_id=9)
    model = tiny_target()
    model.generation_config.eos_token_id = [7, 12]  # a list of EOS ids: every one counts
    with pytest.raises(ValueError, match="EOS or PAD"):
        drafter_for(model, mask_token_id=12)
    for bad in (-1, 64):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            drafter_for(model, mask_token_id=bad)


def test_checkpoint_whose_mask_token_is_the_targets_eos(tmp_path):
    path = saved(tiny_target(), tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    eos_target = tiny_target(eos=cfg["mask_token_id"])
    with pytest.raises(ValueError, match="EOS or PAD"):
        DSparkDrafter.from_pretrained(path, target=eos_target)


@pytest.mark.parametrize("gamma", [0, 1000])
def test_absurd_block_size_in_a_checkpoint(llama, tmp_path, gamma):
    path = saved(llama, tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["block_size"] = gamma
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="block_size"):
        DSparkDrafter.from_pretrained(path, target=llama)


@pytest.mark.parametrize("field,value", [("hidden_size", "64"), ("target_layer_ids", [0, "2"]), ("architectures", 5),
                                         ("block_size", 4.0), ("head_type", 3)])
def test_a_config_field_of_the_wrong_type_is_named(llama, tmp_path, field, value):
    path = saved(llama, tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg[field] = value
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"'{field}' must be"):
        DSparkDrafter.from_pretrained(path, target=llama)


def test_a_config_that_is_not_an_object_is_named(llama, tmp_path):
    path = saved(llama, tmp_path)
    (path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a DSpark drafter's config"):
        DSparkDrafter.from_pretrained(path, target=llama)


@pytest.mark.parametrize("damage, message", [
    ("missing", "config.json is missing"),
    ("empty file", "config.json is not valid JSON"),
    ("empty object", "config.json has no target_layer_ids"),
])
def test_missing_or_empty_config_json_is_named(llama, tmp_path, damage, message):
    drafter_for(llama).save_pretrained(tmp_path)
    config = tmp_path / "config.json"
    if damage == "missing":
        config.unlink()
    else:
        config.write_text("" if damage == "empty file" else "{}")
    with pytest.raises(ValueError, match=message):
        DSparkDrafter.from_pretrained(tmp_path, target=llama)


@pytest.mark.parametrize("field, value", [
    ("mask_token_id", "x"),
    ("markov_rank", -1),
    ("rope_parameters", {"rope_type": "nonsense", "rope_theta": 10000.0}),
    ("rope_parameters", {"rope_type": "default"}),
])
def test_bad_config_values_are_named(llama, tmp_path, field, value):
    drafter_for(llama).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg[field] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=field):
        DSparkDrafter.from_pretrained(tmp_path, target=llama)
