"""The CLI tests' folders: a tiny target (with the character tokenizer) and an untrained drafter saved on disk, and
a private cache so a measured device profile never leaks between tests."""

import pytest
import torch

from hf_dspark import DSparkDrafter
from tests.conftest import tiny_target


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path / "cache"))  # the scheduler's profile is measured there


@pytest.fixture
def folders(tmp_path, char_tokenizer):
    model = tiny_target()
    model.save_pretrained(tmp_path / "target")
    char_tokenizer.save_pretrained(tmp_path / "target")
    torch.manual_seed(0)
    DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 2]).save_pretrained(tmp_path / "drafter")
    return tmp_path / "target", tmp_path / "drafter"
