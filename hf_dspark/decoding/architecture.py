"""Can speculative decoding be exact on this target's architecture? Decided from the model class, the cache
transformers builds for it and a 2 + 2-token probe, never from a list of names; each refusal says why."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicIndexedLayer

from ..model.binding import UnsupportedArchitectureError


def check_architecture(target) -> None:
    """Raise UnsupportedArchitectureError if speculative decoding cannot be exact on `target`'s architecture.
    Decided from the model class and the cache transformers builds for it, never from a list of names."""
    name, tc = type(target).__name__, target.config.get_text_config()
    if getattr(target, "_is_stateful", False):
        raise UnsupportedArchitectureError(
            f"{name} is a stateful (recurrent / state-space) model: its cache cannot be rolled back to drop rejected "
            "drafts, so speculative decoding cannot be exact (transformers refuses assisted decoding for it too)"
        )
    emb = getattr(target.get_input_embeddings(), "weight", None)
    head = target.get_output_embeddings().weight
    if emb is not None and emb.shape[0] != head.shape[0]:
        raise UnsupportedArchitectureError(
            f"{name}'s input embedding has {emb.shape[0]} rows and its LM head {head.shape[0]}: DSpark shares both "
            "with the drafter and needs them to cover one vocabulary"
        )
    if (emb is not None and emb.shape[1] != tc.hidden_size) or head.shape[1] != tc.hidden_size:
        raise UnsupportedArchitectureError(
            f"{name}'s embedding width ({None if emb is None else emb.shape[1]}) or LM-head width ({head.shape[1]}) "
            f"differs from hidden_size ({tc.hidden_size}) (a factorised embedding): DSpark's drafter embeds tokens "
            "with the target's embedding and needs it in the hidden width"
        )
    if getattr(target.config, "is_decoder", True) is False and not target.config.is_encoder_decoder:
        raise UnsupportedArchitectureError(
            f"{name} has is_decoder=False: it attends bidirectionally, so a multi-token verification forward does "
            "not compute what one-token decoding does; load it with is_decoder=True to use it as a causal LM"
        )
    supports = getattr(type(target), "_supports_default_dynamic_cache", None)
    if supports is not None and not supports():
        raise UnsupportedArchitectureError(
            f"{name} keeps a cache of its own kind (not transformers' DynamicCache): assisted decoding cannot roll "
            "it back after rejected drafts"
        )
    try:
        layers = DynamicCache(config=target.config).layers
    except Exception:  # a config transformers cannot map to cache layers: the probe below decides
        layers = []
    if any(isinstance(layer, DynamicIndexedLayer) for layer in layers):
        raise UnsupportedArchitectureError(
            f"{name} uses indexed (top-k sparse) attention: a multi-token verification forward selects other keys "
            "than one-token decoding, so verified drafts would not match plain generate (transformers' own prompt "
            "lookup differs too)"
        )
    _probe(target, name, tc.num_hidden_layers)


@torch.no_grad()
def _probe(target, name: str, n_layers: int) -> None:
    """What only a forward shows, on 2 + 2 tokens as decoding runs them: the model returns a croppable cache (a
    recurrent linear-attention state is known only once filled, a convolution window alone is croppable), one
    hidden state per decoder layer (the taps index them), and accepts several new tokens on a cache."""
    device = target.get_input_embeddings().weight.device
    if device.type == "meta":
        return  # offloaded: transformers' own check at the first verification still names a cache it cannot crop
    ids = torch.zeros(1, 4, dtype=torch.long, device=device)
    cache = DynamicCache(config=target.config)
    cache.activate_past_recording()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # dropout in train mode: RNG kept
        out = target(ids[:, :2], cache=cache, use_cache=True, output_hidden_states=True)
    if getattr(out, "cache", None) is None:
        raise UnsupportedArchitectureError(
            f"{name} returns no KV cache: speculative decoding verifies drafts on the cache and rolls it back"
        )
    cache = out.cache
    if not cache.is_croppable:
        kinds = sorted({type(layer).__name__ for layer in cache.layers})
        raise UnsupportedArchitectureError(
            f"{name}'s cache cannot be rolled back ({', '.join(kinds)}: recurrent linear-attention / state-space "
            "layers): rejected drafts cannot be removed, so speculative decoding cannot be exact"
        )
    hidden = getattr(out, "hidden_states", None)
    if hidden is None or len(hidden) != n_layers + 1:
        raise UnsupportedArchitectureError(
            f"{name} returns {None if hidden is None else len(hidden)} hidden states for num_hidden_layers="
            f"{n_layers} (expected {n_layers + 1}): the drafter's target_layer_ids could not name its layers"
        )
    shapes = {tuple(h.shape) for h in hidden}
    if shapes != {(1, 2, target.config.get_text_config().hidden_size)}:
        raise UnsupportedArchitectureError(
            f"{name}'s hidden states have shapes {sorted(shapes)}, not [batch, tokens, hidden_size]: the drafter "
            "cannot read the tapped layers' residual stream from them"
        )
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            target(ids[:, 2:], cache=cache, use_cache=True)
        cache.crop(-2)
    except Exception as e:  # transformers' own refusal, e.g. "use_cache only for inputs of length 1"
        raise UnsupportedArchitectureError(
            f"{name} cannot verify several new tokens on its cache and roll them back ({type(e).__name__}: {e})"
        ) from e
