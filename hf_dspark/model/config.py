"""DSparkConfig: the drafter's shape, plus the few facts about its target needed to validate a pairing."""

from __future__ import annotations

import copy
import math

from transformers import AutoConfig, PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .binding import UnsupportedArchitectureError
from .heads import HEADS
from .variants import VARIANTS

HEAD_TYPES = tuple(HEADS)

# Target fields the drafter copies: width, heads, FFN, norms and RoPE must equal the target's
# because the drafter shares the target's embedding and LM head and taps its residual stream.
_COPIED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "rope_parameters",
    "max_position_embeddings",
    "attention_bias",
)


def _target_field(tc, name):
    """tc.<name>, or None if absent. Heterogeneous configs (transformers 5.24 `per_layer_config`, e.g. Gemma-4) refuse
    global reads of per-layer fields: the drafter then takes the first full-attention layer's value."""
    try:
        return getattr(tc, name, None)
    except RuntimeError:  # transformers' AmbiguousGlobalPerLayerAttributeError
        if not getattr(tc, "is_heterogeneous", False):
            raise
        layers = list(tc.per_layer_config)
        types = list(getattr(tc, "layer_types", None) or [])
        full = [cfg for cfg, kind in zip(layers, types) if kind == "full_attention"]
        return getattr((full or layers)[0], name, None)


def drafter_rope(rope):
    """The drafter's RoPE from the target's: a flat dict as is; per layer type ({"sliding_attention": {...},
    "full_attention": {...}}, Gemma-3/4, OLMo-3) the full-attention entry (DeepSpec's choice), else the first."""
    if isinstance(rope, dict) and rope and all(isinstance(v, dict) for v in rope.values()):
        return copy.deepcopy(rope.get("full_attention", next(iter(rope.values()))))
    return copy.deepcopy(rope)


def default_target_layer_ids(num_layers: int, num_taps: int = 5) -> list[int]:
    """DFlash's rule: `num_taps` layers evenly spaced from layer 1 to layer L-3, never the last layer.

    SmolLM2 (L=30) → [1, 8, 14, 20, 27]; Qwen3-4B (L=36) → [1, 9, 17, 25, 33].
    Shallow targets get every layer except the last, up to `num_taps` of them.
    """
    if num_layers < 2:
        raise ValueError(f"a target needs at least 2 layers to be tapped, got {num_layers}")
    if num_layers - 3 <= num_taps:
        return list(range(num_layers - 1))[-num_taps:]
    step = (num_layers - 4) / (num_taps - 1) if num_taps > 1 else 0
    return sorted({int(round(1 + i * step)) for i in range(num_taps)})


def calibration_entries(calibration, confidence_temperatures) -> list[dict] | None:
    """config.calibration in its canonical form: a list of entries sorted by temperature (copies). A bare dict
    is one entry (without `confidence_temperatures` it takes the top-level temperatures); anything else is
    returned as is, for validate() to name."""
    if calibration is None:
        return None
    if isinstance(calibration, dict):
        calibration = [{"confidence_temperatures": list(confidence_temperatures), **calibration}]
    if not isinstance(calibration, (list, tuple)) or not all(isinstance(c, dict) for c in calibration):
        return calibration
    entries = [{k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in c.items()} for c in calibration]
    try:
        return sorted(entries, key=lambda c: c["temperature"])
    except (KeyError, TypeError):
        return entries


class DSparkConfig(PretrainedConfig):
    r"""Configuration of a DSpark drafter.

    Args:
        block_size (`int`, defaults to 7): γ, draft tokens per round (= drafter input slots).
        num_hidden_layers (`int`, defaults to 2): depth of the parallel backbone.
        target_layer_ids (`list[int]`): 0-based target decoder layers whose raw outputs are tapped.
        mask_token_id (`int`): id whose frozen embedding fills slots 1..γ-1; must not be EOS or PAD.
        head_type (`str`): "markov" (low-rank W2·W1[prev]), "gated" (W2·(σ(W_g[h;W1[prev]])⊙W1[prev]), DeepSpec's
            code-only variant), "rnn" (gated state) or "none" (DFlash ablation).
        markov_rank (`int`, defaults to 128): r, width of W1/W2 (and of the RNN state).
        confidence_head (`bool`, defaults to True): predict per-position survival c_k.
        confidence_head_with_markov (`bool`, defaults to True): the confidence head reads [h ; W1[prev]] (else h only).
        confidence_temperatures (`list[float]`): per-position temperatures fitted by
            `hf-dspark calibrate` (sequential temperature scaling; the last calibration's); 1.0 = uncalibrated.
            Used where `calibration` has no entry (or the call's temperature is unknown).
        calibration (`list[dict]`, *optional*): one entry per sampling temperature t calibrated at (0 = greedy),
            `{"temperature": t, "confidence_temperatures": [γ], "confidence_biases": [γ], "prefix_survival": [γ]}`
            (the scaling fitted there, c_k = σ(z_k / T_k + b_k), biases optional and 0 by default, and the fraction
            of held-out rounds whose first k drafts all survived). A generate call
            scales confidences with the entry nearest its temperature (a draft's survival law differs between
            greedy and sampling), and the draft gate starts from `prefix_survival` when the call decodes at
            exactly t, instead of learning it again. A single dict is read as one entry (without
            `confidence_temperatures`: with the top-level temperatures).
        qk_norm (`bool`, defaults to True): per-head RMSNorm on queries/keys (Qwen3-style drafter layers).
        layer_variant (`str`, defaults to "default"): "default" = pre-norm Llama/Qwen3 layers; "gemma4" = DeepSpec's
            Gemma-4 drafter layers (sandwich norms, fp32 Gemma RMSNorm, scale-free RMSNorm on V, attention scale 1,
            `layer_scalar` buffer).
        attention_k_eq_v (`bool`, defaults to False): values reuse the key projection (no `v_proj`; Gemma-4).
        draft_vocab_size (`int`, *optional*): if set, drafts come from a pruned vocabulary of this many token
            ids (stored as the `draft_vocab` tensor): the drafter's LM-head rows over 49k tokens dominate its
            cost on CPU, and q = 0 outside the subset keeps sampling exact. None = the full vocabulary.
        target_model_type / target_num_hidden_layers: what the drafter was built for (checked at bind).
        Every other field (`hidden_size`, `vocab_size`, RoPE, ...) is copied from the target.
    """

    model_type = "dspark"

    def __init__(
        self,
        block_size: int = 7,
        num_hidden_layers: int = 2,
        target_layer_ids: list[int] | None = None,
        mask_token_id: int | None = None,
        head_type: str = "markov",
        markov_rank: int = 128,
        confidence_head: bool = True,
        confidence_head_with_markov: bool = True,
        confidence_temperatures: list[float] | None = None,
        calibration: list[dict] | dict | None = None,
        qk_norm: bool = True,
        layer_variant: str = "default",
        attention_k_eq_v: bool = False,
        draft_vocab_size: int | None = None,
        target_model_type: str | None = None,
        target_num_hidden_layers: int | None = None,
        vocab_size: int = 49152,
        hidden_size: int = 576,
        intermediate_size: int = 1536,
        num_attention_heads: int = 9,
        num_key_value_heads: int = 3,
        head_dim: int | None = None,
        hidden_act: str = "silu",
        rms_norm_eps: float = 1e-5,
        rope_parameters: dict | None = None,
        max_position_embeddings: int = 8192,
        attention_bias: bool = False,
        initializer_range: float = 0.02,
        **kwargs,
    ):
        kwargs.setdefault("tie_word_embeddings", False)  # the LM head is the target's, never ours
        super().__init__(**kwargs)
        self.block_size = block_size
        self.num_hidden_layers = num_hidden_layers
        self.target_layer_ids = list(target_layer_ids) if target_layer_ids is not None else None
        self.mask_token_id = mask_token_id
        self.head_type = head_type
        self.markov_rank = markov_rank
        self.confidence_head = confidence_head
        self.confidence_head_with_markov = confidence_head_with_markov
        self.confidence_temperatures = (
            list(confidence_temperatures) if confidence_temperatures is not None
            else [1.0] * block_size if type(block_size) is int and block_size > 0 else []  # else validate() names it
        )
        self.calibration = calibration_entries(calibration, self.confidence_temperatures)
        self.qk_norm = qk_norm
        self.layer_variant = layer_variant
        self.attention_k_eq_v = attention_k_eq_v
        self.draft_vocab_size = draft_vocab_size
        self.target_model_type = target_model_type
        self.target_num_hidden_layers = target_num_hidden_layers
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = rope_parameters or {"rope_type": "default", "rope_theta": 10000.0}
        self.max_position_embeddings = max_position_embeddings
        self.attention_bias = attention_bias
        self.initializer_range = initializer_range
        self.validate()

    def validate(self) -> None:
        """Checks that need no target; binding checks the rest."""
        if type(self.block_size) is not int or not 1 <= self.block_size <= 64:  # bool is an int: refused too
            raise ValueError(f"block_size must be an int in [1, 64], got {self.block_size!r}")
        if self.head_type not in HEAD_TYPES:
            raise ValueError(f"head_type must be one of {HEAD_TYPES}, got {self.head_type!r}")
        if self.layer_variant not in VARIANTS:
            raise ValueError(f"layer_variant must be one of {tuple(VARIANTS)}, got {self.layer_variant!r}")
        if self.num_hidden_layers < 1:
            raise ValueError(f"num_hidden_layers must be >= 1, got {self.num_hidden_layers}")
        if type(self.mask_token_id) is not int and self.mask_token_id is not None:
            raise ValueError(f"mask_token_id must be an int token id, got {self.mask_token_id!r}")
        if type(self.markov_rank) is not int or self.markov_rank < (1 if self.head_type != "none" else 0):
            raise ValueError(
                f"markov_rank must be an int >= 1 for head_type={self.head_type!r}, got {self.markov_rank!r}"
            )
        self._validate_rope()
        if len(self.confidence_temperatures) != self.block_size:
            raise ValueError(
                f"confidence_temperatures has {len(self.confidence_temperatures)} entries, "
                f"block_size is {self.block_size}"
            )
        if any(not t > 0 for t in self.confidence_temperatures):
            raise ValueError(f"confidence_temperatures must be > 0, got {self.confidence_temperatures}")
        if self.calibration is not None:
            if not isinstance(self.calibration, list) or not self.calibration:
                raise ValueError(f"calibration must be a non-empty list of entries, got {self.calibration!r}")
            for c in self.calibration:
                self._validate_calibration_entry(c)
            ts = [c["temperature"] for c in self.calibration]
            if len(set(ts)) != len(ts):
                raise ValueError(f"calibration has several entries for one temperature: {ts}")
        if self.draft_vocab_size is not None and not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must be in [1, vocab_size={self.vocab_size}], got {self.draft_vocab_size}")
        ids = self.target_layer_ids
        if ids is not None and (not ids or any(b <= a for a, b in zip(ids, ids[1:])) or ids[0] < -1):
            raise ValueError(f"target_layer_ids must be strictly increasing ids >= -1, got {ids}")

    def _validate_calibration_entry(self, c) -> None:
        g = self.block_size
        ok = isinstance(c, dict) and {"temperature", "confidence_temperatures", "prefix_survival"} <= set(c) \
            <= {"temperature", "confidence_temperatures", "confidence_biases", "prefix_survival"}
        if ok:
            t, temps, rates, biases = (c["temperature"], c["confidence_temperatures"], c["prefix_survival"],
                                       c.get("confidence_biases", [0.0] * g))
            ok = (not isinstance(t, bool) and isinstance(t, (int, float)) and t >= 0
                  and isinstance(rates, list) and len(rates) == g and all(0 <= r <= 1 for r in rates)
                  and all(b <= a for a, b in zip(rates, rates[1:]))
                  and isinstance(temps, list) and len(temps) == g and all(x > 0 for x in temps)
                  and isinstance(biases, list) and len(biases) == g and all(math.isfinite(b) for b in biases))
        if not ok:
            raise ValueError(
                "a calibration entry must be {'temperature': t >= 0, 'confidence_temperatures': [block_size values "
                "> 0], 'confidence_biases' (optional): [block_size finite values], 'prefix_survival': [block_size "
                "non-increasing rates in [0, 1]]}, got " + repr(c)
            )

    def calibration_at(self, temperature: float | None) -> dict | None:
        """The calibration entry measured nearest to a call's sampling temperature (0 = greedy; ties: the lower
        one); None without entries or when the temperature is unknown."""
        # called every drafted round: a list is read as it is (min needs no order); only a single dict is converted
        entries = self.calibration if isinstance(self.calibration, list) else \
            calibration_entries(self.calibration, self.confidence_temperatures)
        if not entries or temperature is None:
            return None
        return min(entries, key=lambda c: (abs(c["temperature"] - float(temperature)), c["temperature"]))

    def confidence_scaling_at(self, temperature: float | None) -> tuple[list[float], list[float]]:
        """([γ] STS temperatures, [γ] biases) for a call sampling at `temperature` (0 = greedy, None = unknown):
        the nearest calibration entry's, else the top-level temperatures with no bias."""
        entry = self.calibration_at(temperature)
        if entry is None:
            return list(self.confidence_temperatures), [0.0] * len(self.confidence_temperatures)
        temps = list(entry["confidence_temperatures"])
        return temps, list(entry.get("confidence_biases", [0.0] * len(temps)))

    def _validate_rope(self) -> None:
        rope, types = self.rope_parameters, ("default", *ROPE_INIT_FUNCTIONS)
        if not isinstance(rope, dict) or rope.get("rope_type", "default") not in types:
            got = rope.get("rope_type") if isinstance(rope, dict) else rope
            raise ValueError(f"rope_parameters must be a dict whose rope_type is one of {types}; got {got!r}")
        theta = rope.get("rope_theta")
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
            raise ValueError(f"rope_parameters needs a positive rope_theta, got {theta!r} in {rope}")
        self.rope_parameters = {"rope_type": "default", **rope}

    @classmethod
    def for_target(cls, target_config, **overrides) -> "DSparkConfig":
        """A drafter config sized for `target_config` (the text config of any attention decoder). Raises
        UnsupportedArchitectureError for a target without attention heads (state-space / recurrent models)."""
        tc = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        if _target_field(tc, "num_attention_heads") is None:
            raise UnsupportedArchitectureError(
                f"{tc.model_type} has no attention heads (num_attention_heads): DSpark drafts from an attention "
                "decoder's tapped layers and rolls its KV cache back; state-space / recurrent models are not supported"
            )
        fields = {}
        for name in _COPIED:
            value = _target_field(tc, name)
            if value is not None:
                fields[name] = copy.deepcopy(value)
        if "rope_parameters" in fields:
            fields["rope_parameters"] = drafter_rope(fields["rope_parameters"])
            fields["rope_parameters"].setdefault("rope_theta", 10000.0)  # optional in 5.x configs: their default
        if isinstance(fields.get("intermediate_size"), (list, tuple)):  # one width per layer (Gemma-3n): the widest
            fields["intermediate_size"] = max(fields["intermediate_size"])
        fields.setdefault("intermediate_size", 4 * tc.hidden_size)  # GPT-2-style configs leave it unset
        if fields.get("head_dim") is None:
            fields["head_dim"] = tc.hidden_size // fields["num_attention_heads"]
        fields.setdefault("num_key_value_heads", fields["num_attention_heads"])
        fields["target_model_type"] = tc.model_type
        fields["target_num_hidden_layers"] = tc.num_hidden_layers
        fields["target_layer_ids"] = default_target_layer_ids(tc.num_hidden_layers)
        fields.update(overrides)
        return cls(**fields)


AutoConfig.register("dspark", DSparkConfig, exist_ok=True)  # AutoConfig.from_pretrained reads drafter folders
