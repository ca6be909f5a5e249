"""DSparkDraftModel: context fusion of tapped target layers + a parallel block backbone + sequential heads.

The network only: it drafts a block (`draft`) from context K/V and knows nothing of verification, routing or
run-time options (decoding/assistant.py makes it generate()'s assistant, DSparkDrafter).
Shapes: B batch, n context positions, Q block slots (γ at inference), d hidden, m taps, V vocabulary.
The target's embedding and LM head are shared and frozen: never parameters of the drafter, never saved
with it, attached by `bind(target)`.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRotaryEmbedding, rotate_half

from . import deepspec
from .binding import default_mask_token_id, load_strict, placement, validate_pair
from .config import DSparkConfig
from .files import INDEX, index_shards
from .heads import ConfidenceHead, DraftBlock, build_head, draft_block, fuse_context
from .variants import VARIANTS


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, n, hd]; cos/sin [B, n, hd]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


class DSparkAttention(nn.Module):
    """KV injection: queries come from block slots only; keys/values from [context ; block] with shared W_K/W_V.

    Layer variants (variants.py) may give values a weightless RMSNorm and set the attention scale (Gemma-4: 1.0, the
    q/k norms replace h^-1/2); with config.attention_k_eq_v there is no v_proj and values are the raw key projection.
    """

    def __init__(self, config: DSparkConfig):
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.n_heads, self.n_kv, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        variant = VARIANTS[config.layer_variant]
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=config.attention_bias)
        self.k_proj = nn.Linear(d, self.n_kv * hd, bias=config.attention_bias)
        if not config.attention_k_eq_v:
            self.v_proj = nn.Linear(d, self.n_kv * hd, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=False)
        Norm = variant.norm
        norm = (lambda: Norm(hd, eps=config.rms_norm_eps)) if config.qk_norm else nn.Identity
        self.q_norm, self.k_norm = norm(), norm()
        self.v_norm = variant.value_norm(hd, config.rms_norm_eps) if variant.value_norm else None
        self.scale = variant.attention_scale  # None: SDPA's default h^-1/2

    def _heads(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        B, n, _ = x.shape
        return x.view(B, n, n_heads, self.head_dim).transpose(1, 2)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, n, d] → k, v [B, n_kv, n, hd] (k normed and rotated)."""
        k_raw = self._heads(self.k_proj(x), self.n_kv)
        k = _rope(self.k_norm(k_raw), cos, sin)
        v = k_raw if not hasattr(self, "v_proj") else self._heads(self.v_proj(x), self.n_kv)
        return k, (v if self.v_norm is None else self.v_norm(v))

    def forward(self, h, cos, sin, ctx_k, ctx_v, mask=None):
        """h [B, Q, d]; ctx_k/ctx_v [B, n_kv, n, hd]; mask None (all visible) or bool [B, 1, Q, n+Q]."""
        q = _rope(self.q_norm(self._heads(self.q_proj(h), self.n_heads)), cos, sin)
        k, v = self.kv(h, cos, sin)
        k, v = torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=self.n_heads != self.n_kv)
        return self.o_proj(out.transpose(1, 2).flatten(2))


class DSparkLayer(nn.Module):
    """Pre-norm: h + Attn(norm(h)); h + MLP(norm(h)). Sandwich variants (Gemma-4): h + post(Attn(pre(h)));
    h + post_ff(MLP(pre_ff(h))); then × layer_scalar (a persistent [1] buffer, 1.0 unless a checkpoint says otherwise)."""

    def __init__(self, config: DSparkConfig):
        super().__init__()
        variant = VARIANTS[config.layer_variant]
        d, eps, Norm = config.hidden_size, config.rms_norm_eps, variant.norm
        self.input_layernorm = Norm(d, eps=eps)
        self.self_attn = DSparkAttention(config)
        self.post_attention_layernorm = Norm(d, eps=eps)
        self.mlp = LlamaMLP(config)
        self.sandwich = variant.sandwich
        if self.sandwich:
            self.pre_feedforward_layernorm = Norm(d, eps=eps)
            self.post_feedforward_layernorm = Norm(d, eps=eps)
            self.register_buffer("layer_scalar", torch.ones(1))

    def forward(self, h, cos, sin, ctx_k, ctx_v, mask=None):
        if self.sandwich:
            h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), cos, sin, ctx_k, ctx_v, mask))
            h = h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
            return h * self.layer_scalar
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, ctx_k, ctx_v, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DSparkDraftModel(PreTrainedModel):
    """The DSpark drafter network for one target model: `from_target(model)` builds a fresh one sized for it,
    `from_pretrained(path, target=model)` loads a trained one; `draft(...)` runs one round. What trains; the
    assistant users pass to generate() is its subclass hf_dspark.DSparkDrafter."""

    config_class = DSparkConfig
    base_model_prefix = "dspark"
    main_input_name = "input_ids"
    _no_split_modules = ["DSparkLayer"]
    _supports_sdpa = True

    def __init__(self, config: DSparkConfig):
        super().__init__(config)
        d, m = config.hidden_size, len(config.target_layer_ids or [])
        if m == 0:
            raise ValueError("DSparkConfig.target_layer_ids is empty: the drafter needs at least one tapped layer")
        if config.mask_token_id is None:
            raise ValueError("DSparkConfig.mask_token_id is not set")
        config.mlp_bias = getattr(config, "mlp_bias", False)
        self.fc = nn.Linear(m * d, d, bias=False)
        Norm = VARIANTS[config.layer_variant].norm
        self.hidden_norm = Norm(d, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(DSparkLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = Norm(d, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        # Module names follow DeepSpec's checkpoints (markov_head.markov_w1, confidence_head.proj, ...): markov_head
        # is the sequential head of any type (MarkovHead, RNNHead, ...; None for the DFlash ablation).
        self.markov_head = build_head(config)
        rank = config.markov_rank if self.markov_head is not None else 0
        with_prev = config.confidence_head_with_markov and rank > 0
        self.confidence_head = ConfidenceHead(d + rank if with_prev else d, use_prev=with_prev) if config.confidence_head else None
        if config.draft_vocab_size is not None:  # the pruned draft vocabulary, saved with the weights
            self.register_buffer("draft_vocab", torch.arange(config.draft_vocab_size))
        else:
            self.draft_vocab = None
        self.__dict__["_target"] = None  # a plain attribute: the target is never a submodule of ours
        self.deepspec_source: str | None = None  # the DeepSpec checkpoint this drafter was loaded from (deepspec.py)
        self.post_init()

    # ---- binding ---------------------------------------------------------------------------------
    @property
    def target(self):
        if self._target is None:
            raise RuntimeError("this drafter is not bound to a target: call drafter.bind(model) first")
        return self._target

    @property
    def bound_target(self):
        """The target this drafter is bound to, or None."""
        return self._target

    def bind(self, target) -> DSparkDraftModel:
        """Share `target`'s embedding, LM head and taps, after checking the pair fits (sizes, vocabulary, taps,
        mask token, placement). Raises ValueError naming the first mismatch."""
        validate_pair(self, target)
        self.__dict__["_target"] = target
        return self

    @classmethod
    def from_target(cls, target, **overrides) -> DSparkDraftModel:
        """A fresh, randomly initialised drafter sized for `target` (the start for training and for tests).
        `overrides` are DSparkConfig fields (block_size, num_hidden_layers, head_type, mask_token_id, ...)."""
        if "mask_token_id" not in overrides:
            overrides["mask_token_id"] = default_mask_token_id(target)
        config = DSparkConfig.for_target(target.config, **overrides)
        device, dtype = placement(target)
        drafter = cls(config).to(device=device, dtype=dtype).eval()
        return drafter.bind(target)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, target=None, **kwargs):
        """Load a drafter (safetensors only) and bind it to `target`. Also accepts a DSparkConfig, which
        builds a fresh random drafter. Missing or unexpected weights are an error, never a silent init.
        A DeepSpec DSpark/DFlash checkpoint (folder or Hub id whose config names `Qwen3DSparkModel` or
        `Gemma4DSparkModel`) is recognised and loaded by `hf_dspark.deepspec` (needs `target`; docs/deepspec.md).
        The drafter is placed on the device and dtype of the target's LM head (device_map targets included)."""
        if isinstance(pretrained_model_name_or_path, DSparkConfig):
            drafter = cls(pretrained_model_name_or_path)
        else:
            if deepspec.is_deepspec_checkpoint(pretrained_model_name_or_path, **kwargs):
                return deepspec.load(pretrained_model_name_or_path, target=target, drafter_class=cls, **kwargs)
            if target is not None:
                kwargs.setdefault("dtype", placement(target)[1])
            drafter = load_strict(cls, super().from_pretrained, pretrained_model_name_or_path, *args, **kwargs)
        if target is not None:
            device, dtype = placement(target)
            drafter = drafter.to(device=device, dtype=dtype).eval()
            drafter.bind(target)
        return drafter

    # ---- pieces of a round -----------------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [B, Q] → the target's (frozen) input embeddings [B, Q, d] (Gemma: already × √d), on our device.
        With device_map targets the embedding may sit on another device than the drafter (which follows the LM head)."""
        emb = self.target.get_input_embeddings()
        if emb.weight.device.type != "meta":  # meta = offloaded by accelerate; its hook moves the ids itself
            ids = ids.to(emb.weight.device)
        return emb(ids).to(device=self.device, dtype=self.dtype)

    def base_logits(self, h: torch.Tensor, head: torch.Tensor | nn.Linear | None = None) -> torch.Tensor:
        """Backbone output h [..., d] → base logits U [..., V] in float32, through the target's LM head weight
        (or through `head`, rows of it [V', d] for a pruned draft vocabulary, as a tensor or as the nn.Linear
        draft_weights() returns → [..., V']; the bias of a target's LM head is never used)."""
        if head is None:
            head = self.target.get_output_embeddings().weight
        if isinstance(head, nn.Module):  # draft_weights()'s head: decoding may replace its forward (linears.py)
            logits = head(h.to(head.weight.dtype)).float()
        else:
            logits = F.linear(h.to(head.dtype), head).float()
        cap = getattr(self.target.config.get_text_config(), "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' save, then drop a weights index that names shards no longer there: an earlier sharded save
        into the same folder leaves it behind when this save writes one file (a calibrated checkpoint, say)."""
        super().save_pretrained(save_directory, *args, **kwargs)
        index = Path(save_directory) / INDEX
        if index.exists() and any(not (index.parent / f).exists() for f in index_shards(index)):
            index.unlink()

    def set_draft_vocab(self, token_ids) -> DSparkDraftModel:
        """Draft from these token ids only (e.g. the most frequent ones in the target's own answers; include EOS).
        Lossless for any subset: q is 0 outside it. Pass None to draft from the full vocabulary again."""
        if token_ids is None:  # drop the buffer first: assigning None to a registered buffer keeps it registered
            self._buffers.pop("draft_vocab", None)
            self.config.draft_vocab_size, self.draft_vocab = None, None
            return self
        ids = torch.as_tensor(token_ids, dtype=torch.long).unique()  # sorted, no duplicates
        if ids.numel() == 0 or ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise ValueError(f"draft vocabulary ids must be in [0, {self.config.vocab_size})")
        self._buffers.pop("draft_vocab", None)
        self.__dict__.pop("draft_vocab", None)
        self.register_buffer("draft_vocab", ids.to(self.fc.weight.device))
        self.config.draft_vocab_size = int(ids.numel())
        return self

    def draft_weights(self):
        """(vocab [V'] or None, the draft LM head: a bias-free nn.Linear whose weight is the LM-head rows [V', d],
        W2 rows [V', r] or None) for drafting: gathered once per generate() call, so a pruned vocabulary costs
        V'/V of the full LM-head and Markov matmuls. Without a draft vocabulary the head's weight is the target's
        own tensor (no copy)."""
        head = self.target.get_output_embeddings().weight
        w2 = self.markov_head.W2.weight if self.markov_head is not None else None
        if self.draft_vocab is None:
            return None, _head_over(head), w2
        vocab = self.draft_vocab.to(head.device)
        return vocab, _head_over(head[vocab].contiguous()), (w2[vocab].contiguous() if w2 is not None else None)

    def fuse_context(self, features: torch.Tensor) -> torch.Tensor:
        """Concatenated taps [B, n, m·d] (order of target_layer_ids) → context [B, n, d] (the fused fc + RMSNorm
        kernel on CUDA, else these modules: heads.fuse_context)."""
        return fuse_context(features.to(self.dtype), self.fc, self.hidden_norm)

    def context_kv(self, features: torch.Tensor, position_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer context keys/values for new committed positions: [(k, v) [B, n_kv, n, hd]] × layers."""
        ctx = self.fuse_context(features)
        cos, sin = self.rotary_emb(ctx, position_ids)
        return [layer.self_attn.kv(ctx, cos, sin) for layer in self.layers]

    def backbone(self, block_embeds, position_ids, context_kv, mask=None) -> torch.Tensor:
        """block_embeds [B, Q, d] at position_ids [B, Q], attending to context_kv (and, unless `mask` says
        otherwise, to every block slot: bidirectional) → final-normed hidden h [B, Q, d]."""
        h = block_embeds.to(self.dtype)
        cos, sin = self.rotary_emb(h, position_ids)
        for layer, (k, v) in zip(self.layers, context_kv):
            h = layer(h, cos, sin, k, v, mask)
        return self.norm(h)

    def backbone_slots(self, drafts: int) -> int:
        """Block slots the backbone runs for `drafts` drafts: the anchor, one mask per draft (slot i predicts draft
        i + 1, so the last mask looks one token past the last draft), at most the trained block."""
        return min(self.config.block_size, drafts + 1)

    # ---- a round -----------------------------------------------------------------------------------------
    def draft(self, context_kv, prefix_ids: torch.Tensor, n: int, *, reach: int | None = None, processor=None,
              do_sample: bool = False, weights=None, offset: int = 0, temperature: float | None = None) -> DraftBlock:
        """One drafter round, the only code that runs one: the block [anchor ; masks] through the backbone over
        `context_kv`, then the sequential head and confidence left to right → DraftBlock of `n` drafts (tokens,
        the exact logits q was drawn from (sampled rounds; greedy ones need none), raw and calibrated confidences).

        context_kv: per layer (k, v) [1, n_kv, ctx, hd] of the committed context (`context_kv(...)`);
        prefix_ids [1, cur_len]: the sequence so far, its last token the anchor at position cur_len - 1
        (processors see prefix + drafts as the target's will); reach: the most drafts any round of this generate
        can verify (default n): the backbone runs backbone_slots(reach) slots, so a round short of room trims the
        block rather than changing it; processor: the target's logits processors (None: raw logits);
        weights: draft_weights(), gathered once per generate (default: gathered now); offset: positions the target
        holds before prefix_ids' first token (a prompt given as inputs_embeds), so the anchor sits at
        cur_len - 1 + offset; temperature: the call's sampling temperature (0 = greedy), which picks the
        calibration its confidences are scaled with (config.confidence_scaling_at)."""
        cur_len = prefix_ids.shape[1] + offset
        slots = self.backbone_slots(n if reach is None else reach)
        anchor = prefix_ids[:, -1:].to(self.device)
        masks = torch.full((1, slots - 1), self.config.mask_token_id, dtype=torch.long, device=self.device)
        positions = torch.arange(cur_len - 1, cur_len - 1 + slots, device=self.device)[None]
        h = self.backbone(self.embed(torch.cat([anchor, masks], dim=-1)), positions, context_kv)[0, :n]
        vocab, lm_head, w2_rows = weights if weights is not None else self.draft_weights()
        block = draft_block(self.base_logits(h, lm_head), h, anchor[0, 0], self.markov_head, self.confidence_head, prefix_ids,
                            processor, do_sample, vocab=vocab, w2=w2_rows, vocab_size=self.config.vocab_size,
                            need_logits=do_sample)
        if do_sample and bool((torch.isnan(block.logits) | torch.isposinf(block.logits)).any()):
            # q must be a distribution for rejection sampling; greedy drafts need none (the target judges them)
            raise ValueError(f"the drafter produced NaN/+inf logits at sequence length {prefix_ids.shape[1]} "
                             "(its weights or the target's hidden states are not finite)")
        if self.confidence_head is not None:
            block.confidences = self.confidence_probs(block.conf_logits, temperature).cpu()
        return block

    def confidence_probs(self, conf_logits: torch.Tensor, temperature: float | None = None) -> torch.Tensor:
        """Raw confidence logits [..., γ] → calibrated survival c_k = σ(z_k / T_k + b_k) [..., γ], with the scaling
        calibrated nearest the sampling `temperature` (0 = greedy; None: the top-level temperatures, no bias)."""
        temps, biases = self.config.confidence_scaling_at(temperature)
        n = conf_logits.shape[-1]
        temps = torch.tensor(temps[:n], device=conf_logits.device)
        biases = torch.tensor(biases[:n], device=conf_logits.device)
        return torch.sigmoid(conf_logits.float() / temps + biases)


def _head_over(weight: torch.Tensor) -> nn.Linear:
    """A bias-free nn.Linear [out, in] whose weight is `weight` itself (no copy of the target's LM head); standalone,
    so it is in no model's state dict."""
    head = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    del head.weight
    head.weight = weight
    return head
