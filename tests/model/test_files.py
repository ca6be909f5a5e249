"""model/files.py: the one weight-file listing (model.safetensors, or the shards its index names; never pickles)."""

import json

import pytest

from hf_dspark.model.files import INDEX, WEIGHTS, CheckpointFilesError, index_shards, weight_files


def _index(folder, shards):
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": {f"t{i}": s for i, s in enumerate(shards)}}))


def test_one_file_checkpoint_lists_it(tmp_path):
    (tmp_path / WEIGHTS).write_bytes(b"x")
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")  # a pickle beside it is never listed
    assert weight_files(tmp_path) == [tmp_path / WEIGHTS]


def test_sharded_checkpoint_lists_each_shard_once_sorted(tmp_path):
    _index(tmp_path, ["b.safetensors", "a.safetensors", "b.safetensors"])
    for s in ("a.safetensors", "b.safetensors"):
        (tmp_path / s).write_bytes(b"x")
    assert index_shards(tmp_path / INDEX) == ["a.safetensors", "b.safetensors"]
    assert weight_files(tmp_path) == [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]


def test_missing_shards_are_named(tmp_path):
    _index(tmp_path, ["a.safetensors", "b.safetensors"])
    (tmp_path / "a.safetensors").write_bytes(b"x")
    with pytest.raises(CheckpointFilesError, match=r"missing: \['b.safetensors'\]"):
        weight_files(tmp_path)


def test_no_weights_at_all_is_refused_by_name(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointFilesError, match="no model.safetensors and no model.safetensors.index.json"):
        weight_files(tmp_path)


def test_subfolder_is_looked_in(tmp_path):
    (tmp_path / "drafter").mkdir()
    (tmp_path / "drafter" / WEIGHTS).write_bytes(b"x")
    assert weight_files(tmp_path, subfolder="drafter") == [tmp_path / "drafter" / WEIGHTS]
