"""DeepSpec DSpark / DFlash checkpoints (`deepseek-ai/dspark_*_block7`, `dflash_*_block7`): import and export.

The on-disk format (one `model.safetensors` or an index + shards, and a `config.json` that is the target's text
config plus DSpark fields) is described in docs/deepspec.md.
Our drafter's modules carry DeepSpec's names, so `KEY_TABLE` is the identity except for the two tensors DeepSpec
stores as copies of the target's (`embed_tokens`, `lm_head`): we check them against the bound target and drop
them. Strict: a missing or unexpected key, a wrong shape, or a config value that disagrees with a tensor shape is a
`DeepSpecFormatError` naming it. Calibration temperatures are never in DeepSpec files; ours live beside the
checkpoint in `dspark_calibration.json` (`CALIBRATION_FILE`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import PretrainedConfig
from transformers.initialization import no_init_weights

from .binding import placement, validate_pair
from .config import DSparkConfig, calibration_entries
from .files import HUB_KWARGS, WEIGHTS, resolve, weight_files
from .heads import HEADS
from .variants import VARIANTS

logger = logging.getLogger(__name__)

ARCHITECTURES = {v.deepspec_architecture: name for name, v in VARIANTS.items()}  # architectures[0] → layer_variant
_FOREIGN = {
    "Qwen3Eagle3Model": "a DeepSpec Eagle3 drafter (autoregressive, not DSpark)",
    "Gemma4Eagle3Model": "a DeepSpec Eagle3 drafter (autoregressive, not DSpark)",
    "Eagle3DraftModel": "an Eagle3 drafter (autoregressive, not DSpark)",
    "DFlashDraftModel": "a z-lab DFlash drafter (nested dflash_config, no anchor prediction): not supported",
}
HEAD_TYPE_OF = {cls.deepspec_name: name for name, cls in HEADS.items() if cls is not None}  # markov_head_type → ours
GEMMA_TARGET_TYPES = ("gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text")
CALIBRATION_FILE = "dspark_calibration.json"
_IGNORED = re.compile(r"(^|\.)(inv_freq|original_inv_freq|\w*_inv_freq|embed_scale)$")  # non-persistent buffers

# The one mapping table: (DeepSpec key, our key or None = the target's tensor, shape in config terms, present when).
# {i} is a drafter layer. Symbols: V vocab_size, d hidden_size, m len(target_layer_ids), H num_attention_heads,
# h head width, K KV heads, F intermediate_size, r markov_rank, c confidence-head input width (d + r or d).
KEY_TABLE: list[tuple[str, str | None, str, str]] = [
    ("embed_tokens.weight", None, "V, d", "shared"),
    ("lm_head.weight", None, "V, d", "shared"),
    ("fc.weight", "fc.weight", "d, m*d", "always"),
    ("hidden_norm.weight", "hidden_norm.weight", "d", "always"),
    ("norm.weight", "norm.weight", "d", "always"),
    ("layers.{i}.input_layernorm.weight", "layers.{i}.input_layernorm.weight", "d", "always"),
    ("layers.{i}.self_attn.q_proj.weight", "layers.{i}.self_attn.q_proj.weight", "H*h, d", "always"),
    ("layers.{i}.self_attn.k_proj.weight", "layers.{i}.self_attn.k_proj.weight", "K*h, d", "always"),
    ("layers.{i}.self_attn.v_proj.weight", "layers.{i}.self_attn.v_proj.weight", "K*h, d", "v_proj"),
    ("layers.{i}.self_attn.o_proj.weight", "layers.{i}.self_attn.o_proj.weight", "d, H*h", "always"),
    ("layers.{i}.self_attn.q_norm.weight", "layers.{i}.self_attn.q_norm.weight", "h", "always"),
    ("layers.{i}.self_attn.k_norm.weight", "layers.{i}.self_attn.k_norm.weight", "h", "always"),
    ("layers.{i}.post_attention_layernorm.weight", "layers.{i}.post_attention_layernorm.weight", "d", "always"),
    ("layers.{i}.pre_feedforward_layernorm.weight", "layers.{i}.pre_feedforward_layernorm.weight", "d", "sandwich"),
    ("layers.{i}.post_feedforward_layernorm.weight", "layers.{i}.post_feedforward_layernorm.weight", "d", "sandwich"),
    ("layers.{i}.mlp.gate_proj.weight", "layers.{i}.mlp.gate_proj.weight", "F, d", "always"),
    ("layers.{i}.mlp.up_proj.weight", "layers.{i}.mlp.up_proj.weight", "F, d", "always"),
    ("layers.{i}.mlp.down_proj.weight", "layers.{i}.mlp.down_proj.weight", "d, F", "always"),
    ("layers.{i}.layer_scalar", "layers.{i}.layer_scalar", "1", "sandwich_optional"),  # missing → 1.0
    ("markov_head.markov_w1.weight", "markov_head.markov_w1.weight", "V, r", "markov"),
    ("markov_head.markov_w2.weight", "markov_head.markov_w2.weight", "V, r", "markov"),
    *((f"markov_head.{t}", f"markov_head.{t}", shape, f"head:{name}")  # each head type's own tensors (heads.HEADS)
      for name, cls in HEADS.items() if cls is not None for t, shape in cls.extra_tensors),
    ("confidence_head.proj.weight", "confidence_head.proj.weight", "1, c", "confidence"),
    ("confidence_head.proj.bias", "confidence_head.proj.bias", "1", "confidence"),
]
_SYMBOLS = {"V": "vocab_size", "d": "hidden_size", "m": "len(target_layer_ids)", "H": "num_attention_heads",
            "h": "head width", "K": "KV heads", "F": "intermediate_size", "r": "markov_rank",
            "c": "confidence input (d + r if confidence_head_with_markov else d)"}


class DeepSpecFormatError(ValueError):
    """A DeepSpec checkpoint that does not match the documented format (the message names the key or field)."""


# ---- files ----------------------------------------------------------------------------------------------
def read_config(path, **kwargs) -> dict | None:
    """The raw config.json of `path` as a dict, or None if there is none."""
    f = resolve(path, "config.json", kwargs)
    return json.loads(f.read_text()) if f is not None else None


def is_deepspec_checkpoint(path, **kwargs) -> bool:
    """True if `path` holds a DeepSpec DSpark/DFlash drafter; raises for a known foreign drafter format."""
    if isinstance(path, DSparkConfig):
        return False
    try:
        raw = read_config(path, **kwargs)
    except (OSError, ValueError):
        return False
    if not isinstance(raw, dict):
        return False  # not a config at all: the loader names it
    archs = raw.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise ValueError(f"{path}: config field 'architectures' must be a list of class names, got {archs!r}")
    arch = (archs or [None])[0]
    if arch in _FOREIGN:
        raise DeepSpecFormatError(f"{path} holds {_FOREIGN[arch]} (architectures[0] = {arch!r})")
    return arch in ARCHITECTURES


def _normalise_keys(stored) -> dict[str, str]:
    """DeepSpec name → stored name: strip torch.compile's `_orig_mod.` and a uniform `model.` prefix; drop
    non-persistent RoPE / embed-scale buffers some writers include."""
    clean = {s: s.replace("_orig_mod.", "") for s in stored}
    strip = bool(clean) and all(n.startswith("model.") for n in clean.values())
    out = {}
    for s, n in clean.items():
        key = n[len("model."):] if strip else n
        if not _IGNORED.search(key):
            out[key] = s
    return out


def read_header(files: list[Path]) -> dict[str, tuple[tuple[int, ...], Path, str]]:
    """DeepSpec key → (shape, file, stored name), without reading tensor data."""
    out = {}
    for f in files:
        with safe_open(f, "pt") as sf:
            for key, name in _normalise_keys(list(sf.keys())).items():
                out[key] = (tuple(sf.get_slice(name).get_shape()), f, name)
    return out


def _tensor(entry) -> torch.Tensor:
    _, f, name = entry
    with safe_open(f, "pt") as sf:
        return sf.get_tensor(name)


# ---- config ---------------------------------------------------------------------------------------------
def _require(raw: dict, names, why: str = "") -> None:
    missing = [n for n in names if n not in raw]
    if missing:
        raise DeepSpecFormatError(f"DeepSpec config.json lacks required field(s) {missing}{why}")


def config_from_deepspec(raw: dict) -> DSparkConfig:
    """A DeepSpec config.json (dict) → our DSparkConfig. Errors name the field."""
    arch = (raw.get("architectures") or [None])[0]
    if arch not in ARCHITECTURES:
        raise DeepSpecFormatError(f"architectures[0] = {arch!r}: not a DeepSpec DSpark drafter {sorted(ARCHITECTURES)}")
    gemma = ARCHITECTURES[arch] == "gemma4"
    _require(raw, ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                   "rms_norm_eps", "block_size", "mask_token_id", "target_layer_ids", "markov_rank",
                   "enable_confidence_head", "num_target_layers"])
    rank = raw["markov_rank"]
    if rank > 0:
        _require(raw, ["markov_head_type"], " (markov_rank > 0)")
        if raw["markov_head_type"] not in HEAD_TYPE_OF:
            raise DeepSpecFormatError(f"markov_head_type {raw['markov_head_type']!r} is not one of {sorted(HEAD_TYPE_OF)}")
    if raw["enable_confidence_head"]:
        _require(raw, ["confidence_head_with_markov"], " (enable_confidence_head is true)")
    if gemma:
        _require(raw, ["global_head_dim", "attention_k_eq_v", "hidden_activation", "final_logit_softcapping",
                       "num_kv_shared_layers", "use_double_wide_mlp", "rope_parameters"], " (Gemma4 drafter)")
        if raw.get("enable_moe_block"):
            raise DeepSpecFormatError("enable_moe_block is true: DeepSpec's Gemma4 drafter asserts it false")
        if raw.get("hidden_size_per_layer_input", 0):
            raise DeepSpecFormatError("hidden_size_per_layer_input is non-zero: DeepSpec's Gemma4 drafter asserts 0")
        n, shared = raw["num_hidden_layers"], raw["num_kv_shared_layers"]
        if raw["use_double_wide_mlp"] and 0 < n - shared < n:
            raise DeepSpecFormatError(f"use_double_wide_mlp with num_kv_shared_layers={shared} makes drafter layers "
                                      f"{list(range(n - shared, n))} double width: not supported (no released file)")
        k_eq_v = bool(raw["attention_k_eq_v"])
        kv_field = "num_global_key_value_heads" if k_eq_v else "num_key_value_heads"
        _require(raw, [kv_field], f" (Gemma4, attention_k_eq_v={k_eq_v})")
        rope = raw["rope_parameters"].get("full_attention") if isinstance(raw["rope_parameters"], dict) else None
        if rope is None:  # DeepSpec format: only the full_attention entry counts; the top-level pair is an artefact
            raise DeepSpecFormatError("Gemma4 rope_parameters has no 'full_attention' entry")
        geometry = dict(head_dim=raw["global_head_dim"], num_key_value_heads=raw[kv_field],
                        hidden_act=raw["hidden_activation"], attention_k_eq_v=k_eq_v, target_model_type=None)
    else:
        _require(raw, ["head_dim", "num_key_value_heads"], " (Qwen3 drafter)")
        rope = raw.get("rope_parameters") or {}
        if "rope_theta" not in rope:  # transformers 4.x wrote a top-level rope_theta
            _require(raw, ["rope_theta"], " (no rope_parameters.rope_theta)")
            rope = {"rope_type": "default", **rope, "rope_theta": raw["rope_theta"]}
        geometry = dict(head_dim=raw["head_dim"], num_key_value_heads=raw["num_key_value_heads"],
                        hidden_act=raw.get("hidden_act", "silu"), target_model_type=raw.get("model_type"))
    return DSparkConfig(
        block_size=raw["block_size"], num_hidden_layers=raw["num_hidden_layers"],
        target_layer_ids=list(raw["target_layer_ids"]), mask_token_id=raw["mask_token_id"],
        head_type=HEAD_TYPE_OF[raw["markov_head_type"]] if rank > 0 else "none", markov_rank=rank,
        confidence_head=bool(raw["enable_confidence_head"]),
        confidence_head_with_markov=bool(raw.get("confidence_head_with_markov", False)),
        qk_norm=True, layer_variant=ARCHITECTURES[arch], target_num_hidden_layers=raw["num_target_layers"],
        vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"], intermediate_size=raw["intermediate_size"],
        num_attention_heads=raw["num_attention_heads"], rms_norm_eps=raw["rms_norm_eps"],
        rope_parameters=copy.deepcopy(rope), max_position_embeddings=raw.get("max_position_embeddings", 8192),
        attention_bias=bool(raw.get("attention_bias", False)), **geometry,
    )


# ---- keys and shapes ------------------------------------------------------------------------------------
@dataclass
class _Dims:
    config: DSparkConfig

    def values(self) -> dict[str, int]:
        c = self.config
        r = c.markov_rank if c.head_type != "none" else 0
        with_prev = c.confidence_head_with_markov and r > 0
        return dict(V=c.vocab_size, d=c.hidden_size, m=len(c.target_layer_ids), H=c.num_attention_heads,
                    h=c.head_dim, K=c.num_key_value_heads, F=c.intermediate_size, r=r, c=c.hidden_size + r * with_prev)

    def present(self, when: str) -> bool:
        c = self.config
        return {"always": True, "shared": True, "v_proj": not c.attention_k_eq_v,
                "sandwich": VARIANTS[c.layer_variant].sandwich,
                "sandwich_optional": VARIANTS[c.layer_variant].sandwich,
                "markov": c.head_type != "none", "confidence": c.confidence_head}.get(when, when == f"head:{c.head_type}")


def expected_keys(config: DSparkConfig) -> dict[str, tuple[str | None, tuple[int, ...], str, str]]:
    """DeepSpec key → (our key or None, shape, shape in config terms, presence rule) for this config."""
    dims = _Dims(config)
    values = dims.values()
    out = {}
    for ds, ours, shape, when in KEY_TABLE:
        if not dims.present(when):
            continue
        numbers = tuple(int(eval(s, {"__builtins__": {}}, values)) for s in shape.split(", "))  # noqa: S307 (table)
        for i in range(config.num_hidden_layers) if "{i}" in ds else [None]:
            key = ds.format(i=i) if i is not None else ds
            out[key] = (ours.format(i=i) if (ours and i is not None) else ours, numbers, shape, when)
    return out


def check_keys(header: dict, config: DSparkConfig, where) -> None:
    """Missing / unexpected / wrongly shaped tensors → one DeepSpecFormatError naming each."""
    expected = expected_keys(config)
    values = _Dims(config).values()
    legend = ", ".join(f"{k}={values[k]} ({_SYMBOLS[k]})" for k in values)
    missing = {k: f"[{e[2]}] = {list(e[1])}" for k, e in expected.items()
               if k not in header and e[3] not in ("sandwich_optional", "shared")}
    unexpected = sorted(set(header) - set(expected))
    wrong = {k: f"stored {list(header[k][0])}, config says [{e[2]}] = {list(e[1])}"
             for k, e in expected.items() if k in header and tuple(header[k][0]) != e[1]}
    parts = [f"missing: {'; '.join(f'{k} {v}' for k, v in missing.items())}" if missing else "",
             f"unexpected: {', '.join(unexpected)}" if unexpected else "",
             f"wrong shape: {'; '.join(f'{k}: {v}' for k, v in wrong.items())}" if wrong else ""]
    problems = " | ".join(p for p in parts if p)
    if problems:
        hint = ""
        if any(k.endswith("v_proj.weight") for k in unexpected) or any(k.endswith("v_proj.weight") for k in missing):
            hint = f"; attention_k_eq_v={config.attention_k_eq_v} disagrees with the stored v_proj"
        raise DeepSpecFormatError(f"DeepSpec checkpoint {where} does not match its config: {problems}{hint} "
                                  f"(shapes in config terms: {legend})")


# ---- calibration sidecar --------------------------------------------------------------------------------
def fingerprint(fc_weight: torch.Tensor) -> str:
    """sha256 of the stored fc.weight bytes: ties a calibration file to one set of trained weights."""
    return hashlib.sha256(fc_weight.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def write_calibration(folder, temperatures, fc_weight: torch.Tensor, calibration: list[dict] | None = None,
                      **info) -> Path:
    """Write `dspark_calibration.json` beside a DeepSpec checkpoint: the per-position STS temperatures and, if
    given, the entries per sampling temperature (`config.calibration`: their STS temperatures and measured
    survival, the draft gate's prior, policy.py)."""
    out = Path(folder) / CALIBRATION_FILE
    payload = {"format": "hf_dspark.calibration/1", "confidence_temperatures": [float(t) for t in temperatures],
               "fc_weight_sha256": fingerprint(fc_weight), **info}
    if calibration is not None:
        payload["calibration"] = calibration
    out.write_text(json.dumps(payload, indent=2))
    return out


def save_calibration(drafter, folder=None, **info) -> Path:
    """Write a DeepSpec-loaded drafter's fitted temperatures to `folder` (default: beside its checkpoint), keyed by
    the checkpoint's own fc.weight bytes. The DeepSpec files themselves are never rewritten."""
    src = drafter.deepspec_source
    if src is None:
        raise ValueError("this drafter was not loaded from a DeepSpec checkpoint: use drafter.save_pretrained")
    fc = _tensor(read_header(weight_files(src))["fc.weight"])
    return write_calibration(folder or src, drafter.config.confidence_temperatures, fc, drafter.config.calibration,
                             **info)


def _read_calibration(path, config: DSparkConfig, fc_weight: torch.Tensor, explicit) -> bool:
    """Apply the sidecar's temperatures (and measured survival, if any) to `config` → whether one applied."""
    f = Path(explicit) if explicit is not None else resolve(path, CALIBRATION_FILE, {})
    if f is None or not f.is_file():
        if explicit is not None:
            raise FileNotFoundError(f"calibration file {explicit} does not exist")
        return False
    data = json.loads(f.read_text())
    temps = data.get("confidence_temperatures")
    if data.get("fc_weight_sha256") != fingerprint(fc_weight):
        logger.warning("%s was fitted for other weights (fc.weight hash differs): ignored, confidences uncalibrated", f)
        return False
    if not isinstance(temps, list) or len(temps) != config.block_size:
        raise DeepSpecFormatError(f"{f}: confidence_temperatures must hold block_size={config.block_size} values")
    config.confidence_temperatures = [float(t) for t in temps]
    config.calibration = calibration_entries(data.get("calibration"), config.confidence_temperatures)
    try:
        config.validate()
    except ValueError as e:
        raise DeepSpecFormatError(f"{f}: {e}") from None
    return True


# ---- import ---------------------------------------------------------------------------------------------
def _check_family(raw: dict, config: DSparkConfig, target) -> None:
    tc = target.config.get_text_config()
    top = getattr(target.config, "model_type", None)
    if config.layer_variant == "gemma4":
        if tc.model_type not in GEMMA_TARGET_TYPES and top not in GEMMA_TARGET_TYPES:
            raise ValueError(f"wrong target: a Gemma4DSparkModel drafter needs a Gemma-4 target, got {tc.model_type!r}")
        cap = getattr(tc, "final_logit_softcapping", None)
        if cap != raw.get("final_logit_softcapping"):
            logger.warning("drafter final_logit_softcapping=%s, target's is %s: the target's is applied",
                           raw.get("final_logit_softcapping"), cap)
    theta = (getattr(tc, "rope_parameters", None) or {})
    theta = (theta.get("full_attention", theta) or {}).get("rope_theta")
    if theta is not None and theta != config.rope_parameters.get("rope_theta"):
        logger.warning("drafter RoPE theta %s differs from the target's %s", config.rope_parameters.get("rope_theta"), theta)


def _shared_tensors(header: dict, target, where) -> None:
    """DeepSpec stores frozen copies of the target's embedding and LM head. Policy: compare them bitwise with the
    target's (in the target's dtype, or cast to the stored one); equal → drop them and use the target's modules;
    different → error (the drafter was trained against another target revision); absent (stripped file) → use the
    target's."""
    for key, getter in (("embed_tokens.weight", "get_input_embeddings"), ("lm_head.weight", "get_output_embeddings")):
        if key not in header:
            logger.info("%s has no %s: using the target's", where, key)
            continue
        stored = _tensor(header[key])
        mine = getattr(target, getter)().weight
        if mine.device.type == "meta":
            raise ValueError(f"cannot check {key}: the target's copy is offloaded (meta device)")
        if tuple(stored.shape) != tuple(mine.shape):
            raise ValueError(f"{key}: stored {list(stored.shape)}, the target's is {list(mine.shape)}: wrong target")
        # a target loaded from a bf16 file in another dtype holds stored.to(its dtype): compare in that dtype too,
        # since fp16 → bf16 is not exact for values below fp16's range (bf16 → fp16 → bf16 loses them)
        mine = mine.detach().to("cpu")
        theirs = mine.to(stored.dtype)
        if not (torch.equal(stored.to(mine.dtype), mine) or torch.equal(theirs, stored)):
            diff = (theirs.float() - stored.float()).abs().max().item()
            raise ValueError(f"{key} in {where} differs from the target's (max |Δ| = {diff:.3g} in {stored.dtype}): "
                             "this drafter was trained with another revision of the target")


def load(path, target=None, *, drafter_class, dtype: torch.dtype | None = None, calibration=None, **kwargs):
    """Load a DeepSpec DSpark/DFlash checkpoint (local folder or Hub id) into a `drafter_class` (DSparkDrafter:
    DSparkDrafter.from_pretrained calls this) bound to `target`.

    dtype: defaults to the target LM head's dtype (files are bf16; fp32 on CPU is exact). calibration: path of a
    `dspark_calibration.json` (default: the one beside the weights, if any). Other kwargs: Hub download options.
    """
    if target is None:
        raise ValueError("a DeepSpec checkpoint needs its target: DSparkDrafter.from_pretrained(path, target=model)")
    unknown = set(kwargs) - set(HUB_KWARGS) - {"dtype", "torch_dtype"}
    if unknown:
        raise TypeError(f"unexpected argument(s) for a DeepSpec checkpoint: {sorted(unknown)}")
    raw = read_config(path, **kwargs)
    if raw is None:
        raise DeepSpecFormatError(f"{path}: no config.json")
    config = config_from_deepspec(raw)
    header = read_header(weight_files(path, **kwargs))
    check_keys(header, config, path)
    _check_family(raw, config, target)
    fc = _tensor(header["fc.weight"])
    if not _read_calibration(path, config, fc, calibration) and config.confidence_head:
        logger.warning("no %s beside %s: confidence temperatures are 1 (uncalibrated); run `hf-dspark calibrate`",
                       CALIBRATION_FILE, path)
    device, target_dtype = placement(target)
    with no_init_weights():
        drafter = drafter_class(config)
    state = {ours: _tensor(header[ds]) for ds, (ours, *_rest) in expected_keys(config).items()
             if ours is not None and ds in header}
    for name, buf in drafter.state_dict().items():  # optional persistent buffers (Gemma4 layer_scalar → 1.0)
        state.setdefault(name, torch.ones_like(buf) if name.endswith("layer_scalar") else buf)
    drafter.load_state_dict(state, strict=True)
    for name, p in drafter.state_dict().items():
        if p.is_floating_point() and not torch.isfinite(p).all():
            raise DeepSpecFormatError(f"{path}: non-finite values in {name}")
    drafter.deepspec_source = str(path)
    drafter = drafter.to(device=device, dtype=dtype or kwargs.get("dtype") or target_dtype).eval()
    validate_pair(drafter, target)  # shape/depth/vocab mismatches first: they explain a differing embedding
    _shared_tensors(header, target, path)
    return drafter.bind(target)


# ---- export ---------------------------------------------------------------------------------------------
_DROP = ("_name_or_path", "architectures", "auto_map", "quantization_config", "torch_dtype", "dtype",
         "transformers_version", "_attn_implementation", "_attn_implementation_autoset", "layer_types",
         "tie_word_embeddings", "_commit_hash", "text_config", "vision_config", "audio_config")


# PretrainedConfig's own bookkeeping (id2label, return_dict, output_hidden_states, ...): never in a DeepSpec file
_GENERIC = frozenset(PretrainedConfig().to_dict()) - {"architectures", "dtype", "model_type", "transformers_version"}


def _full_attention_entry(tc) -> tuple[int, dict] | None:
    """(index, per-layer overrides) of the target's first full-attention layer in a heterogeneous (5.24
    `per_layer_config`) text config, e.g. Gemma-4's global head_dim / KV heads; None for a homogeneous config."""
    per_layer = tc.to_dict().get("per_layer_config") or {}
    types = list(getattr(tc, "layer_types", None) or [])
    for i, kind in enumerate(types):
        if kind == "full_attention" and (str(i) in per_layer or i in per_layer):
            return i, dict(per_layer.get(str(i), per_layer.get(i)))
    return None


def to_deepspec_config(drafter, dtype: torch.dtype) -> dict:
    """Our drafter + its bound target → a DeepSpec config.json dict (target text config + DSpark fields)."""
    c, tc = drafter.config, drafter.target.config.get_text_config()
    gemma = c.layer_variant == "gemma4"
    raw = {k: v for k, v in tc.to_dict().items() if k not in _DROP and k not in _GENERIC}
    raw.pop("per_layer_config", None)  # target layer indices: re-indexed to the drafter's layers below
    raw.update(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
               num_attention_heads=c.num_attention_heads, rms_norm_eps=c.rms_norm_eps,
               max_position_embeddings=c.max_position_embeddings, attention_bias=c.attention_bias)
    if gemma:
        raw.update(global_head_dim=c.head_dim, attention_k_eq_v=c.attention_k_eq_v, hidden_activation=c.hidden_act,
                   final_logit_softcapping=getattr(tc, "final_logit_softcapping", None), enable_moe_block=False,
                   hidden_size_per_layer_input=0, num_kv_shared_layers=0, use_double_wide_mlp=False,
                   target_model_type=getattr(drafter.target.config, "model_type", tc.model_type),
                   target_text_model_type=tc.model_type)
        full = _full_attention_entry(tc)
        if c.attention_k_eq_v:
            raw["num_global_key_value_heads"] = c.num_key_value_heads
        else:  # DeepSpec requires the global count either way; the drafter's own KV heads are num_key_value_heads
            raw["num_key_value_heads"] = c.num_key_value_heads
            raw["num_global_key_value_heads"] = (full[1] if full else {}).get(
                "num_key_value_heads", getattr(tc, "num_global_key_value_heads", c.num_key_value_heads))
        if full is not None:  # every drafter layer is a full-attention layer: keys in [0, num_hidden_layers),
            # values the drafter's own geometry (a 5.24 reader takes head_dim / KV heads per layer from here)
            entry = {**full[1], "head_dim": c.head_dim, "num_key_value_heads": c.num_key_value_heads}
            raw["per_layer_config"] = {str(i): dict(entry) for i in range(c.num_hidden_layers)}
        target_rope = dict(getattr(tc, "rope_parameters", None) or {})
        raw["rope_parameters"] = {**target_rope, "full_attention": copy.deepcopy(c.rope_parameters),
                                  "rope_type": "default", "rope_theta": None}  # what DeepSpec writes
    else:
        raw.update(head_dim=c.head_dim, num_key_value_heads=c.num_key_value_heads, hidden_act=c.hidden_act,
                   rope_parameters=copy.deepcopy(c.rope_parameters))
        raw.pop("rope_theta", None)
    rank = c.markov_rank if c.head_type != "none" else 0
    raw.update(
        architectures=["Gemma4DSparkModel" if gemma else "Qwen3DSparkModel"],
        num_hidden_layers=c.num_hidden_layers, num_target_layers=tc.num_hidden_layers,
        target_layer_ids=list(c.target_layer_ids), block_size=c.block_size, mask_token_id=c.mask_token_id,
        num_anchors=512,  # training-only in DeepSpec; written for format completeness
        markov_rank=rank, enable_confidence_head=bool(c.confidence_head), tie_word_embeddings=False,
        layer_types=["full_attention"] * c.num_hidden_layers, dtype=str(dtype).removeprefix("torch."),
    )
    if rank:
        raw["markov_head_type"] = {v: k for k, v in HEAD_TYPE_OF.items()}[c.head_type]
    if c.confidence_head:
        raw["confidence_head_with_markov"] = bool(c.confidence_head_with_markov and rank > 0)
    raw["transformers_version"] = transformers.__version__
    return dict(sorted(raw.items()))


def export(drafter, folder, dtype: torch.dtype | None = None) -> Path:
    """Write a bound drafter as a DeepSpec checkpoint: config.json, model.safetensors (with the target's embedding
    and LM head copied in, as DeepSpec does) and, if it has a confidence head, dspark_calibration.json.
    dtype: default the drafter's (exact round trip); torch.bfloat16 matches the released files."""
    c = drafter.config
    if not c.qk_norm:
        raise ValueError("DeepSpec drafters always have q/k norms: a drafter with qk_norm=False cannot be exported")
    if drafter.draft_vocab is not None:
        raise ValueError("DeepSpec has no pruned draft vocabulary: call drafter.set_draft_vocab(None) before export")
    dtype = dtype or drafter.dtype
    ours = drafter.state_dict()
    tensors = {}
    for ds, (mine, *_rest) in expected_keys(c).items():
        if mine is None:
            getter = "get_input_embeddings" if ds.startswith("embed_tokens") else "get_output_embeddings"
            t = getattr(drafter.target, getter)().weight
        else:
            t = ours.pop(mine)
        tensors[ds] = t.detach().to("cpu", dtype).clone().contiguous()  # clone: tied target weights share storage
    left = [k for k in ours if not k.endswith("layer_scalar")]
    if left:
        raise ValueError(f"drafter tensors with no DeepSpec name (KEY_TABLE is incomplete): {left}")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(to_deepspec_config(drafter, dtype), indent=2) + "\n")
    save_file(tensors, out / WEIGHTS, metadata={"format": "pt"})
    if c.confidence_head:
        write_calibration(out, c.confidence_temperatures, tensors["fc.weight"], c.calibration)
    return out
