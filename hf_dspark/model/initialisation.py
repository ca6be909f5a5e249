"""Where a new drafter's weights come from: a trained drafter of the same shape (`init_from`), or a target's decoder
layers (`warm_start`). Random initialisation is the network's own (`DSparkDraftModel.from_target`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from .drafter import DSparkDraftModel
from .files import WEIGHTS, CheckpointFilesError, weight_files

logger = logging.getLogger(__name__)

# what a drafter folder must share with the drafter it initialises (it may have fewer layers: see `_grown`)
_SAME_SHAPE = ("target_layer_ids", "block_size", "head_type", "mask_token_id", "markov_rank")
_OWN_KEYS = {"self_attn.q_norm.weight", "self_attn.k_norm.weight", "layer_scalar"}  # a target layer may lack them


def differences(saved: dict, ours, keys) -> dict:
    """{key: (saved value, ours)} for each of `keys` where a saved config disagrees with `ours`' attribute."""
    return {k: (saved.get(k), getattr(ours, k)) for k in keys if saved.get(k) != getattr(ours, k)}


def _grown(weights: dict, saved_layers: int, layers: int) -> dict:
    """`weights` of a `saved_layers`-layer drafter, grown to `layers`: each new top layer a copy of the saved top
    layer whose attention and MLP outputs are zero, so it adds nothing to the residual stream and the grown
    drafter drafts exactly as the saved one until training moves it (the zero projections get gradients at once)."""
    top = f"layers.{saved_layers - 1}."
    start = {"self_attn.o_proj.weight": torch.zeros_like, "mlp.down_proj.weight": torch.zeros_like,
             "layer_scalar": torch.ones_like}  # the rest: copies
    grown = dict(weights)
    for i in range(saved_layers, layers):
        for k, v in weights.items():
            if k.startswith(top):
                name = k[len(top):]
                grown[f"layers.{i}.{name}"] = start.get(name, torch.clone)(v)
    return grown


def init_from(drafter: DSparkDraftModel, folder) -> None:
    """Load a trained drafter's weights (and its draft vocabulary, if it has one) into `drafter`, built with the
    same shape or with more layers (the new top layers start as identities, `_grown`): a run that continues
    another under a new schedule, on more data or deeper, or a resume. Refuses a drafter with other taps, block,
    head, mask token, more layers or other tensor shapes. A bf16 file is cast to `drafter`'s dtype (warned)."""
    from safetensors.torch import load_file

    folder, config = Path(folder), Path(folder) / "config.json"
    try:
        files = weight_files(folder) if config.is_file() else None
    except CheckpointFilesError:
        files = None
    if files is None:
        raise ValueError(f"init_from={folder}: no config.json / {WEIGHTS} (give a drafter folder, e.g. "
                         "<run>/checkpoint-<step>/drafter)")
    saved = json.loads(config.read_text())
    differ = differences(saved, drafter.config, _SAME_SHAPE)
    saved_layers, layers = saved.get("num_hidden_layers"), drafter.config.num_hidden_layers
    if not isinstance(saved_layers, int) or not 0 < saved_layers <= layers:
        differ["num_hidden_layers"] = (saved_layers, layers)
    weights = {k: v for f in files for k, v in load_file(f).items()}
    if not differ and saved_layers < layers:
        new = (f"layer {saved_layers} starts as an identity" if layers == saved_layers + 1
               else f"layers {saved_layers}-{layers - 1} start as identities")
        logger.warning("init_from=%s has %d layers: %s (a copy of its top layer with zero output projections)",
                       folder, saved_layers, new)
        weights = _grown(weights, saved_layers, layers)
    if "draft_vocab" in weights:
        drafter.set_draft_vocab(weights["draft_vocab"])
    ours = drafter.state_dict()
    wrong = sorted(set(ours) ^ set(weights)) + [k for k in ours.keys() & weights.keys()
                                                 if ours[k].shape != weights[k].shape]
    if differ or wrong:
        raise ValueError(f"init_from={folder} does not fit this run's drafter: config (theirs vs ours) {differ}, "
                         f"tensors {wrong[:6]}")
    lower = sorted({str(v.dtype) for k, v in weights.items() if v.is_floating_point()
                    and v.dtype != ours[k].dtype})
    if lower:
        logger.warning("init_from=%s holds %s weights: cast to the drafter's", folder, lower)
    drafter.load_state_dict({k: v.to(ours[k].dtype) for k, v in weights.items()})


def warm_start(drafter: DSparkDraftModel, decoder, layers: list[int]) -> None:
    """Copy a target's decoder layers `decoder.layers[layers[i]]` into drafter layer i (same module names and
    shapes: norms, q/k/v/o projections, MLP) and its final norm into the drafter's. The drafter's fc/heads stay
    random, and so do the q/k norms (at 1) where the target has none."""
    if len(layers) != len(drafter.layers):
        raise ValueError(f"warm_start names {len(layers)} target layers for a drafter with {len(drafter.layers)}")
    n = len(decoder.layers)
    for i, li in enumerate(layers):
        if not -n <= li < n:
            raise ValueError(f"warm_start layer {li} is outside the target's {n} layers")
        missing, unexpected = drafter.layers[i].load_state_dict(decoder.layers[li].state_dict(), strict=False)
        if unexpected or set(missing) - _OWN_KEYS:
            raise ValueError(f"target layer {li} does not fit drafter layer {i}: missing {missing}, unexpected {unexpected}")
    drafter.norm.load_state_dict(decoder.norm.state_dict())
