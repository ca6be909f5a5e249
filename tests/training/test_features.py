"""training/features.py: tapped layers and the final-normed state; per-sequence computation and its cache."""

import pytest
import torch

from hf_dspark.training.features import target_features
from tests._tiny import tiny_target

torch.set_num_threads(1)


def test_features_are_raw_tapped_layers_and_final_normed_state():
    t = tiny_target()
    ids = torch.randint(3, 64, (2, 9))
    attn = torch.ones_like(ids)
    feats, last = target_features(t, ids, attn, [0, 2])
    ref = t(ids, attention_mask=attn, output_hidden_states=True)
    assert torch.allclose(feats[..., :32], ref.hidden_states[1], atol=1e-5)
    assert torch.allclose(feats[..., 32:], ref.hidden_states[3], atol=1e-5)
    assert torch.allclose(t.lm_head(last), ref.logits, atol=1e-4)  # final-normed: gives the target logits


def test_feature_source_computes_each_sequence_unpadded_and_caches_it(tmp_path, monkeypatch):
    """A right-padded batch → each row's features as its own unpadded forward gives them (the padding is never
    computed), zeros past its length; the cache stores them (bf16) and a later call reads instead of running."""
    from hf_dspark.training import features
    from hf_dspark.training.features import FeatureSource

    t = tiny_target()
    lengths = torch.tensor([10, 6, 3])
    ids = torch.randint(3, 64, (3, 10)) * (torch.arange(10)[None] < lengths[:, None])
    keys = ["a:0#0", "a:1#0", "b:2#1"]
    for cache in (None, tmp_path / "cache"):
        feats, last = FeatureSource(t, [0, 2], cache)(keys, ids, lengths)
        tol = 1e-5 if cache is None else 0.02  # the cache holds bf16
        for b, L in enumerate(lengths.tolist()):
            f, h = target_features(t, ids[b : b + 1, :L], torch.ones(1, L, dtype=torch.long), [0, 2])
            assert torch.allclose(feats[b, :L], f[0], atol=tol, rtol=tol) and torch.allclose(last[b, :L], h[0], atol=tol, rtol=tol)
            assert not feats[b, L:].any() and not last[b, L:].any()
    monkeypatch.setattr(features, "target_features", lambda *a, **k: pytest.fail("recomputed a cached sequence"))
    again = FeatureSource(t, [0, 2], tmp_path / "cache")(keys, ids, lengths)
    assert torch.equal(again[0], feats) and torch.equal(again[1], last)


def test_a_write_killed_midway_leaves_no_cached_file(tmp_path, monkeypatch):
    """The cache is written to a partial file and renamed: a kill mid-write cannot leave a truncated entry that a
    resumed run would read."""
    from hf_dspark.training import features
    from hf_dspark.training.features import FeatureSource

    def killed(tensors, path):
        open(path, "wb").write(b"trunc")
        raise KeyboardInterrupt

    monkeypatch.setattr(features, "save_file", killed)
    t = tiny_target()
    ids, lengths = torch.randint(3, 64, (1, 5)), torch.tensor([5])
    with pytest.raises(KeyboardInterrupt):
        FeatureSource(t, [0, 2], tmp_path)(["a:0#0"], ids, lengths)
    assert not (tmp_path / "a_0#0.safetensors").exists()
    monkeypatch.undo()
    feats, _ = FeatureSource(t, [0, 2], tmp_path)(["a:0#0"], ids, lengths)  # recomputed, then read back
    assert (tmp_path / "a_0#0.safetensors").exists() and feats.abs().sum() > 0
