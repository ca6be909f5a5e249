"""Frozen-target features for training, through the same channel as inference.

Tapped features are the raw outputs of the tapped layers, read exactly as the candidate generator reads
them at inference (`output_hidden_states=[i+1 for i in taps]`, then `hidden_states[i+1]`); the target
distribution comes from the FINAL-NORMED last hidden state through the LM head. Features are computed on
the fly, or cached per sequence on disk (bf16 safetensors) for small multi-epoch runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def base_model(target):
    """The decoder stack without the LM head (its output is final-normed)."""
    return target.get_decoder() if hasattr(target, "get_decoder") else target.model


@torch.no_grad()
def target_features(target, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, taps: list[int]):
    """input_ids/attention_mask [B, n] (right padded; None: no padding) → (features [B, n, m·d], last_hidden [B, n, d]).

    features = concat over taps of layer i's raw output (hidden_states[i+1]); last_hidden is final-normed,
    so LMHead(last_hidden[:, t]) is the target's next-token distribution after token t.
    """
    out = base_model(target)(
        input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=[i + 1 for i in taps], use_cache=False
    )
    hs = out.hidden_states
    feats = torch.cat([hs[i + 1] for i in taps], dim=-1)
    return feats, out.last_hidden_state


class FeatureSource:
    """Features for a batch of sequences: computed online, or read from / written to a per-sequence disk cache.

    The cache stores each sequence unpadded under `<cache_dir>/<key>.safetensors` in bf16 (≈2·(m+1)·d bytes per
    token), so a cached feature set is reused across epochs and by resumed runs.
    """

    def __init__(self, target, taps: list[int], cache_dir: str | Path | None = None):
        self.target, self.taps = target, list(taps)
        self.cache = Path(cache_dir) if cache_dir else None
        if self.cache:
            self.cache.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.cache / (key.replace("/", "_").replace(":", "_") + ".safetensors")

    def __call__(self, keys: list[str], input_ids: torch.Tensor, lengths: torch.Tensor):
        """keys [B] sequence ids, input_ids [B, n] right padded, lengths [B] → (features, last_hidden) float32."""
        B, n = input_ids.shape
        device = input_ids.device
        if self.cache is None:
            return self._padded([self._one(input_ids[b], int(lengths[b])) for b in range(B)], n, device)
        missing = [b for b, k in enumerate(keys) if not self._path(k).exists()]
        for b in missing:
            f, h = self._one(input_ids[b], int(lengths[b]))
            path = self._path(keys[b])
            tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")  # a kill mid-write leaves no truncated file
            save_file({"features": f.to(torch.bfloat16).contiguous(), "last_hidden": h.to(torch.bfloat16).contiguous()},
                      str(tmp))
            os.replace(tmp, path)
        loaded = []
        for k in keys:
            t = load_file(str(self._path(k)))
            loaded.append((t["features"], t["last_hidden"]))
        return self._padded(loaded, n, device)

    def _one(self, ids: torch.Tensor, length: int):
        """One sequence's unpadded features ([L, m·d], [L, d]). A forward per sequence, not per padded batch: the
        padding of a batch of 8 answers costs ~1.45x the tokens and ~1.85x the attention (SmolLM2's answer
        lengths), and without a mask the attention takes the causal kernel; the target's forward is ~half a
        training step where features are not cached yet."""
        f, h = target_features(self.target, ids[None, :length], None, self.taps)
        return f[0], h[0]

    def _padded(self, items, n: int, device):
        """[(features [L_b, m·d], last_hidden [L_b, d])] → right-padded float32 [B, n, m·d], [B, n, d]."""
        feats = torch.zeros(len(items), n, len(self.taps) * self._width(), device=device)
        last = torch.zeros(len(items), n, self._width(), device=device)
        for b, (f, h) in enumerate(items):
            feats[b, : f.shape[0]] = f.float()
            last[b, : h.shape[0]] = h.float()
        return feats, last

    def _width(self) -> int:
        return self.target.config.get_text_config().hidden_size
