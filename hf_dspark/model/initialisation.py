"""Where a new drafter's weights come from: a trained drafter of the same shape (`init_from`), or a target's decoder
layers (`warm_start`). Random initialisation is the network's own (`DSparkDraftModel.from_target`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from .drafter import DSparkDraftModel
from .files import WEIGHTS, CheckpointFilesError, weight_files

logger = logging.getLogger(__name__)

# what a drafter folder must share with the drafter it initialises
_SAME_SHAPE = ("target_layer_ids", "block_size", "head_type", "mask_token_id", "num_hidden_layers", "markov_rank")
_OWN_KEYS = {"self_attn.q_norm.weight", "self_attn.k_norm.weight", "layer_scalar"}  # a target layer may lack them


def differences(saved: dict, ours, keys) -> dict:
    """{key: (saved value, ours)} for each of `keys` where a saved config disagrees with `ours`' attribute."""
    return {k: (saved.get(k), getattr(ours, k)) for k in keys if saved.get(k) != getattr(ours, k)}


def init_from(drafter: DSparkDraftModel, folder) -> None:
    """Load a trained drafter's weights (and its draft vocabulary, if it has one) into `drafter`, built with the
    same shape: a run that continues another under a new schedule or on more data, or a resume. Refuses a drafter
    with other taps, block, head, mask token or tensor shapes. A bf16 file is cast to `drafter`'s dtype (warned)."""
    from safetensors.torch import load_file

    folder, config = Path(folder), Path(folder) / "config.json"
    try:
        files = weight_files(folder) if config.is_file() else None
    except CheckpointFilesError:
        files = None
    if files is None:
        raise ValueError(f"init_from={folder}: no config.json / {WEIGHTS} (give a drafter folder, e.g. "
                         "<run>/checkpoint-<step>/drafter)")
    differ = differences(json.loads(config.read_text()), drafter.config, _SAME_SHAPE)
    weights = {k: v for f in files for k, v in load_file(f).items()}
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
