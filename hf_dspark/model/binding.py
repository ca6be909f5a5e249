"""Does this drafter fit this target (sizes, vocabulary, taps, mask token, placement)? Checks run at bind time, each
error names the mismatch. Whether speculative decoding can be exact on the target's architecture is decoding's
question (decoding/architecture.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from .files import WEIGHTS, CheckpointFilesError, weight_files


class UnsupportedArchitectureError(ValueError):
    """A target DSpark cannot serve losslessly (its cache cannot roll back, or it has no attention layers to tap)."""


def check_placement(drafter, target) -> None:
    """The drafter must sit on the device and dtype of the target's LM head. Checked at bind and again at every
    generate: `model.to(torch.bfloat16)` after binding changes the target, not the drafter."""
    head = target.get_output_embeddings().weight
    param = next(drafter.parameters())
    if param.device != head.device:
        raise ValueError(
            f"drafter is on {param.device} but the target's LM head is on {head.device}: call drafter.to(device)"
        )
    if param.dtype != head.dtype:
        raise ValueError(f"drafter dtype {param.dtype} != target dtype {head.dtype}: call drafter.to({head.dtype})")


def _special_ids(target) -> set[int]:
    ids: set[int] = set()
    for cfg in (target.config.get_text_config(), getattr(target, "generation_config", None)):
        if cfg is None:
            continue
        for name in ("eos_token_id", "pad_token_id"):
            value = getattr(cfg, name, None)
            if value is None:
                continue
            ids.update(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
    return ids


def default_mask_token_id(target) -> int:
    """The highest id that is neither EOS, PAD nor BOS. Real targets should pass an unused id instead
    (SmolLM2: 16 `<empty_output>`; Qwen3: 151669, a padding row past the tokenizer's tokens)."""
    taken = _special_ids(target) | {getattr(target.config.get_text_config(), "bos_token_id", None)}
    vocab = target.get_input_embeddings().weight.shape[0]
    return next(i for i in range(vocab - 1, -1, -1) if i not in taken)


def placement(target) -> tuple[torch.device, torch.dtype]:
    """(device, dtype) the drafter must use: those of the target's LM head, where base logits are computed.
    With device_map="auto" the tapped layers may be elsewhere; their outputs are moved to this device.
    bitsandbytes leaves the LM head unquantized by default, so its dtype is the compute dtype."""
    head = target.get_output_embeddings()
    if head is None:
        raise ValueError(f"target {type(target).__name__} has no LM head: DSpark needs a causal LM target")
    w = head.weight
    if w.device.type == "meta":
        raise ValueError("the target's LM head is offloaded (accelerate device 'meta'/disk): DSpark needs it resident "
                         "on a device; give lm_head a GPU or CPU in device_map")
    if not w.dtype.is_floating_point:
        raise ValueError(f"the target's LM head is quantized ({w.dtype}); DSpark needs a float LM head "
                         "(bitsandbytes skips lm_head by default: do not add it to the quantized modules)")
    return w.device, w.dtype


def validate_pair(drafter, target) -> None:
    """Raise ValueError naming the first way `drafter` does not fit `target`."""
    cfg = drafter.config
    if not hasattr(target, "get_output_embeddings") or target.get_output_embeddings() is None:
        raise ValueError(f"target {type(target).__name__} has no LM head: DSpark needs a causal LM target")
    if getattr(target.config, "is_encoder_decoder", False):
        raise ValueError("DSpark supports decoder-only targets only (this target is encoder-decoder)")
    tc = target.config.get_text_config()
    emb = target.get_input_embeddings().weight
    head = target.get_output_embeddings().weight
    checks = [
        ("hidden_size", cfg.hidden_size, tc.hidden_size),
        ("vocab_size", cfg.vocab_size, tc.vocab_size),
        ("embedding rows", cfg.vocab_size, emb.shape[0]),
        ("LM-head rows", cfg.vocab_size, head.shape[0]),
    ]
    if cfg.target_num_hidden_layers is not None:
        checks.append(("num_hidden_layers", cfg.target_num_hidden_layers, tc.num_hidden_layers))
    if cfg.target_model_type is not None:
        checks.append(("model_type", cfg.target_model_type, tc.model_type))
    for name, want, got in checks:
        if want != got:
            raise ValueError(
                f"wrong drafter for this target: the drafter was built for {name}={want}, the target has {got}"
            )
    n_layers = tc.num_hidden_layers
    for i in cfg.target_layer_ids:
        if not -1 <= i <= n_layers - 2:
            raise ValueError(
                f"target_layer_ids {cfg.target_layer_ids}: layer {i} is outside [-1, {n_layers - 2}] "
                f"(the target has {n_layers} layers; the last one is never tapped: its output is final-normed)"
            )
    mask = cfg.mask_token_id
    if not 0 <= mask < cfg.vocab_size:
        raise ValueError(f"mask_token_id {mask} is outside the vocabulary [0, {cfg.vocab_size})")
    if mask in _special_ids(target):
        raise ValueError(f"mask_token_id {mask} is the target's EOS or PAD id; pick an otherwise unused token id")
    check_placement(drafter, target)


# Fields of a drafter's config.json whose type a hand edit can break (checked before transformers reads them).
_CONFIG_TYPES = {
    **dict.fromkeys(("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size", "block_size", "markov_rank", "mask_token_id",
                     "max_position_embeddings"), "an integer"),
    "target_layer_ids": "a list of integers",
    "head_type": "a string",
    "architectures": "a list of strings",
}


def _is(value, kind: str) -> bool:
    if kind == "an integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "a string":
        return isinstance(value, str)
    item = int if kind == "a list of integers" else str
    return isinstance(value, list) and all(isinstance(v, item) and not isinstance(v, bool) for v in value)


def _check_local_checkpoint(cls, folder: Path) -> None:
    """Compare the safetensors header (names, shapes) with what the folder's config builds, before loading."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{config_file} is missing: a DSpark drafter folder needs the config.json that "
                         "save_pretrained writes")
    try:
        raw = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{config_file} is not valid JSON ({e}): an empty or truncated file?") from e
    if not isinstance(raw, dict) or not raw.get("target_layer_ids"):
        raise ValueError(f"{config_file} has no target_layer_ids: it is empty or not a DSpark drafter's config")
    for field, kind in _CONFIG_TYPES.items():
        value = raw.get(field)
        if value is not None and not _is(value, kind):
            raise ValueError(f"{config_file}: field {field!r} must be {kind}, got {value!r}")

    try:
        files = weight_files(folder)
    except CheckpointFilesError as e:
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in {".bin", ".pt", ".pth", ".pkl", ".ckpt"})
        what = f"only pickle checkpoints {pickles}" if pickles else f"no {WEIGHTS} or shards"
        raise ValueError(f"{folder} holds {what}; DSpark loads safetensors only ({e})") from e
    try:
        stored = {}
        for f in files:
            with safe_open(f, "pt") as sf:
                stored.update({k: tuple(sf.get_slice(k).get_shape()) for k in sf.keys()})
        config = cls.config_class.from_pretrained(folder)
    except Exception as e:
        raise ValueError(f"could not load a DSpark drafter from {folder}: {e}") from e
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in cls(config).state_dict().items()}
    problems = {
        "missing": sorted(set(expected) - set(stored)),
        "unexpected": sorted(set(stored) - set(expected)),
        "wrong shape": sorted(f"{k}: stored {stored[k]}, config says {expected[k]}"
                              for k in set(stored) & set(expected) if stored[k] != expected[k]),
    }
    problems = {k: v for k, v in problems.items() if v}
    if problems:
        raise ValueError(f"corrupt or incompatible drafter checkpoint at {folder}: {problems}")


def load_strict(cls, loader, path, *args, **kwargs):
    """Load with transformers' loader, safetensors only, and turn missing/unexpected/mismatched weights
    (which transformers would re-initialise with a warning) into an error naming them."""
    local = Path(str(path))
    if local.is_dir():
        _check_local_checkpoint(cls, local)
    kwargs["use_safetensors"] = True
    kwargs["output_loading_info"] = True
    try:
        model, info = loader(path, *args, **kwargs)
    except Exception as e:  # safetensors, OS and config errors all mean "this checkpoint cannot be used"
        raise ValueError(f"could not load a DSpark drafter from {path}: {e}") from e
    problems = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if problems:
        raise ValueError(f"corrupt or incompatible drafter checkpoint at {path}: {problems}")
    for p in model.parameters():
        if not torch.isfinite(p).all():
            raise ValueError(f"corrupt drafter checkpoint at {path}: non-finite weights")
    return model
