"""How `model.generate(..., assistant_model=drafter)` reaches DSparkCandidateGenerator.

This is the only module that knows transformers' assisted-decoding internals. transformers 5.23/5.24
has no public hook for a custom CandidateGenerator, so `enable(model)` swaps the target's class (once,
per instance, keeping its name so save_pretrained is unaffected) for one that mixes in
`DSparkGenerationMixin`. The mixin overrides three private GenerationMixin methods, and only when the
assistant is a DSpark drafter (a `DraftModel`, draft_model.py: DSparkDrafter); every other assistant, and plain
decoding, go to transformers untouched. `enable` checks those methods' signatures and refuses a transformers whose
internals differ. Stop strings and custom stopping criteria are made exact here too (StopScanner).
"""

from __future__ import annotations

import dataclasses

import inspect
from contextvars import ContextVar

import torch
import transformers
from transformers.generation import GenerationConfig, GenerationMixin
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxTimeCriteria,
    StoppingCriteria,
)
from transformers.utils import logging

from ..model.binding import check_placement
from . import loop
from .candidate import DSparkCandidateGenerator
from .draft_model import DraftModel
from .options import LOOPS, DecodingOptions

# The private methods we override, with the leading parameters we rely on (checked by `enable`).
_EXPECTED = {
    "_get_candidate_generator": (
        "self", "generation_config", "input_ids", "inputs_tensor", "logits_processor", "model_kwargs",
        "assistant_model", "target_tokenizer", "assistant_tokenizer",
    ),
    "_assisted_decoding": ("self", "input_ids", "logits_processor", "stopping_criteria", "generation_config"),
    "_validate_generation_mode": ("self", "generation_mode", "generation_config", "generation_mode_kwargs"),
}

# cache_implementation values DSpark runs (None: transformers' default, a DynamicCache). A static cache is rolled back by
# moving its position (StaticLayer.crop), and a sliding-window layer only while the cache fits its window:
# transformers' assisted loop refuses a cache it cannot crop, by name, at the first verification.
logger = logging.get_logger(__name__)

_CACHES = (None, "dynamic", "static")

# Assistant options of transformers' own generators that mean nothing to DSpark: refusing them beats ignoring them.
_FOREIGN_OPTIONS = (
    "prompt_lookup_num_tokens", "assistant_early_exit", "use_mtp", "speculation_type", "assistant_ensemble_weight",
    "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
    "assistant_lookbehind", "target_lookbehind",
)


def check_transformers() -> None:
    for name, params in _EXPECTED.items():
        method = getattr(GenerationMixin, name, None)
        got = tuple(inspect.signature(method).parameters)[: len(params)] if method else None
        if got != params:
            raise RuntimeError(
                f"hf_dspark supports transformers 5.23-5.24; transformers {transformers.__version__} changed "
                f"GenerationMixin.{name} (expected parameters {params}, found {got}). Please report this."
            )


# The options of the generate() call in progress (this thread / task), when the caller passed dspark_options=.
_CALL_OPTIONS: ContextVar[DecodingOptions | None] = ContextVar("dspark_options", default=None)
# the candidate generators transformers built inside one _assisted_decoding call (closed when it ends)
_CALL_GENERATORS: ContextVar[list | None] = ContextVar("dspark_generators", default=None)


class DSparkGenerationMixin:
    """Routes `generate(assistant_model=<DSparkDrafter>)` to DSparkCandidateGenerator."""

    _is_dspark_enabled = True

    def generate(self, *args, dspark_options: DecodingOptions | None = None, **kwargs):
        """transformers' generate, plus `dspark_options`: the DecodingOptions of this call (default: the drafter's
        own `options`), so callers that share a drafter never change it to run a call differently."""
        if dspark_options is None:
            return super().generate(*args, **kwargs)
        if not isinstance(dspark_options, DecodingOptions):
            raise TypeError(f"dspark_options must be a hf_dspark.DecodingOptions, got {type(dspark_options).__name__}")
        if not isinstance(kwargs.get("assistant_model"), DraftModel):
            raise ValueError("dspark_options= applies to DSpark decoding only: pass assistant_model=<a DSpark drafter>")
        token = _CALL_OPTIONS.set(dspark_options)
        try:
            return super().generate(*args, **kwargs)
        finally:
            _CALL_OPTIONS.reset(token)

    def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs):
        drafter = generation_mode_kwargs.get("assistant_model")
        if isinstance(drafter, DraftModel):
            _validate_request(self, drafter, generation_mode, generation_config, generation_mode_kwargs)
        return super()._validate_generation_mode(generation_mode, generation_config, generation_mode_kwargs)

    def _assisted_decoding(self, input_ids, logits_processor, stopping_criteria, generation_config, *args, **kwargs):
        drafter = kwargs.get("assistant_model")
        if not isinstance(drafter, DraftModel):
            return super()._assisted_decoding(input_ids, logits_processor, stopping_criteria, generation_config, *args, **kwargs)
        if input_ids.shape[0] != 1:
            raise NotImplementedError(f"DSpark decodes one sequence at a time; got a batch of {input_ids.shape[0]}")
        mask = kwargs.get("attention_mask")
        if mask is not None and not bool(mask.all()):
            zeros = (mask[0] == 0).nonzero().flatten().tolist()
            pad = generation_config.pad_token_id
            if pad is not None and all(int(input_ids[0, i]) == int(pad) for i in zeros):
                raise NotImplementedError(
                    f"the prompt holds the pad token id {pad} at positions {zeros[:8]}, which generate() masks out as "
                    "padding, and DSpark does not support padded prompts; if they are real tokens, pass "
                    "attention_mask=torch.ones_like(input_ids)")
            raise NotImplementedError("DSpark does not support padded prompts (attention_mask with zeros)")
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
            # transformers 5.23/5.24's assisted loop re-feeds the whole prompt on top of a pre-filled cache: its own
            # assistants (prompt lookup, assistant models) then return wrong tokens silently; we refuse instead
            raise NotImplementedError(
                f"a pre-filled cache ({cache.get_seq_length()} positions; prompt caching) is not supported with "
                "DSpark: transformers' assisted decoding would recompute the prompt on top of it. Pass no cache."
            )
        # configs without a position limit (ALiBi: Bloom, MPT) have no context to check
        context = getattr(self.config.get_text_config(), "max_position_embeddings", None)
        embeds = kwargs.get("inputs_embeds")
        embedded = embeds.shape[1] if embeds is not None and input_ids.shape[1] == 0 else 0  # prompt as embeddings
        needed = generation_config.max_length + embedded
        if context is not None and needed > context:
            raise ValueError(
                f"prompt ({embedded + input_ids.shape[1]} tokens) + max_new_tokens needs "
                f"{needed} positions; the target's context is {context}. Shorten the prompt or lower max_new_tokens."
            )
        scanner = StopScanner(stopping_criteria, input_ids)
        if scanner.checks:
            stopping_criteria.append(scanner)
            if kwargs.get("streamer") is not None:
                kwargs["streamer"] = _StoppingStreamer(kwargs["streamer"], scanner, input_ids)
        options = _CALL_OPTIONS.get() or drafter.options
        if options.loop not in LOOPS:
            raise ValueError(f"DecodingOptions.loop must be one of {LOOPS}, got {options.loop!r}")
        chosen, options = options.loop, options.concrete(self, drafter)
        why = None if options.loop == "assisted" else loop.unsupported(self, input_ids, generation_config, kwargs,
                                                                      drafter.config.block_size)
        if chosen == "auto" and options.loop == "assisted" and getattr(self, "_can_compile_fullgraph", False):
            logger.warning_once("DSpark: decoding on transformers' assisted loop. DSpark's compiled loop is faster on "
                                "most prompts; hf_dspark.prepare(model, drafter) or `hf-dspark profile` sets it up "
                                "once per machine (minutes), and the default loop runs it from then on")
        if options.loop == "assisted" or why is not None:
            if why is not None:  # asked for by name: said once; chosen by "auto": the assisted loop is its other choice
                (logger.warning_once if chosen != "auto" else logger.info)(
                    f"DSpark's {options.loop} loop does not take {why}: this call runs on transformers' assisted "
                    "loop (same output, its speed)")
            # the candidate generator transformers builds reads the call's options: the loop that runs, for its
            # profile
            token = _CALL_OPTIONS.set(dataclasses.replace(options, loop="assisted"))
            built = _CALL_GENERATORS.set([])  # the generator transformers builds, closed when the call ends
            try:
                out = super()._assisted_decoding(input_ids, logits_processor, stopping_criteria, generation_config,
                                                 *args, **kwargs)
            finally:
                for generator in _CALL_GENERATORS.get():
                    generator.close()
                _CALL_GENERATORS.reset(built)
                _CALL_OPTIONS.reset(token)
            if why is not None and drafter.last_stats is not None:
                drafter.last_stats.fallback = why
        else:
            candidate = DSparkCandidateGenerator(self, drafter, generation_config, logits_processor, options)
            try:
                out = loop.decode(self, input_ids, logits_processor, stopping_criteria, generation_config, candidate,
                                  streamer=kwargs.get("streamer"), compiled=options.loop == "compiled")
            finally:
                candidate.close()
        return scanner.truncate(out)

    def _get_candidate_generator(self, generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs,
                                 assistant_model=None, target_tokenizer=None, assistant_tokenizer=None):
        if isinstance(assistant_model, DraftModel):
            options = _CALL_OPTIONS.get() or assistant_model.options
            generator = DSparkCandidateGenerator(self, assistant_model, generation_config, logits_processor, options)
            built = _CALL_GENERATORS.get()
            if built is None:  # only transformers' assisted loop, which _assisted_decoding wraps, builds one
                raise RuntimeError("a DSpark candidate generator is built inside generate() only")
            built.append(generator)
            return generator
        return super()._get_candidate_generator(generation_config, input_ids, inputs_tensor, logits_processor,
                                                model_kwargs, assistant_model, target_tokenizer, assistant_tokenizer)


def enable(model):
    """Make `model.generate(..., assistant_model=drafter)` use DSpark. Idempotent; returns `model`."""
    if getattr(model, "_is_dspark_enabled", False):
        return model
    if not isinstance(model, GenerationMixin):
        raise ValueError(f"{type(model).__name__} cannot generate; DSpark needs a causal LM target")
    check_transformers()
    cls = type(model)
    model.__class__ = type(cls.__name__, (DSparkGenerationMixin, cls), {"__module__": cls.__module__})
    return model


def _validate_request(target, drafter, mode, gen_config: GenerationConfig, mode_kwargs) -> None:
    if mode != GenerationMode.ASSISTED_GENERATION:
        raise NotImplementedError(
            f"DSpark supports greedy and sampling decoding only, not {mode.value} "
            f"(num_beams={gen_config.num_beams}, num_beam_groups={getattr(gen_config, 'num_beam_groups', 1)})"
        )
    drafter.config.validate()  # block_size (γ) and friends may have been edited since the drafter was built
    if drafter.bound_target is None:
        raise ValueError("this drafter is not bound to a target (loaded without target=); call drafter.bind(model) "
                         "for the model you generate with")
    if drafter.bound_target is not target:
        raise ValueError(
            "this drafter is bound to another model; call drafter.bind(model) for the model you generate with"
        )
    check_placement(drafter, target)  # the target may have been moved or cast since bind
    if not gen_config.use_cache:
        raise ValueError("use_cache=False: DSpark verifies drafts on the target's KV cache and rolls it back; pass "
                         "use_cache=True (some configs, e.g. MPT's, default to False)")
    if gen_config.output_attentions and gen_config.return_dict_in_generate:
        raise NotImplementedError(
            "output_attentions=True with return_dict_in_generate=True is not supported with DSpark: transformers' "
            "assisted decoding cannot split multi-token attentions per step (its prompt lookup fails the same way)"
        )
    defaults = GenerationConfig._get_default_generation_params()
    for name in _FOREIGN_OPTIONS:
        if getattr(gen_config, name, None) not in (None, defaults.get(name)):
            raise ValueError(
                f"generate option `{name}` belongs to transformers' own assistants and is not used by DSpark "
                "(the block size is drafter.config.block_size)"
            )
    if mode_kwargs.get("assistant_tokenizer") is not None:
        raise ValueError("DSpark drafters share the target's tokenizer: do not pass assistant_tokenizer")
    if gen_config.cache_implementation not in _CACHES:
        raise NotImplementedError(
            f"cache_implementation={gen_config.cache_implementation!r} is not supported with DSpark: it supports "
            f"{', '.join(repr(c) for c in _CACHES if c)} (offloaded and quantized caches are untested here)"
        )


class StopScanner(StoppingCriteria):
    """Makes stop strings and custom stopping criteria exact under speculation.

    transformers' assisted loop evaluates stopping criteria once per round, on the whole sequence, so a stop
    that completes inside an accepted block is missed (StopStringCriteria only checks the tail) and the output
    runs on. This criterion re-evaluates the user's criteria on every prefix a round added, stops the loop at
    the end of that round, and `truncate` cuts the output right where plain `generate` would have stopped.
    Decoding up to that point is exact, so the result is identical (greedy) / identically distributed (sampling).
    EOS and max-length are already exact in the loop; time limits are not per-token and stay round-level.
    """

    def __init__(self, criteria, prompt_ids: torch.Tensor):
        self.checks = [c for c in criteria if not isinstance(c, (EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria))]
        self.checked = prompt_ids.shape[1]
        self.stop_len: int | None = None

    def scan(self, seq: torch.Tensor) -> int | None:
        while self.stop_len is None and self.checked < seq.shape[1]:
            self.checked += 1
            prefix = seq[:, : self.checked]
            if any(bool(c(prefix, None).any()) for c in self.checks):
                self.stop_len = self.checked
        return self.stop_len

    def __call__(self, input_ids, scores, **kwargs):
        stop = self.scan(input_ids) is not None
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)

    def truncate(self, out):
        if self.stop_len is None:
            return out
        if isinstance(out, torch.Tensor):
            return out[:, : self.stop_len]
        extra = out.sequences.shape[1] - self.stop_len
        if extra <= 0:
            return out
        out.sequences = out.sequences[:, : self.stop_len]
        for name in ("scores", "logits", "attentions", "hidden_states"):
            value = getattr(out, name, None)
            if value is not None:
                setattr(out, name, value[: len(value) - extra])
        cache = getattr(out, "cache", None)
        cache = getattr(out, "past_key_values", None) if cache is None else cache
        if cache is not None and hasattr(cache, "crop"):
            cache.crop(-extra)
        return out


class _StoppingStreamer:
    """Forwards tokens to the user's streamer only up to the stop found by the scanner."""

    def __init__(self, streamer, scanner: StopScanner, prompt_ids: torch.Tensor):
        # generate() has already put the prompt into the user's streamer before decoding starts
        self.streamer, self.scanner, self.seq = streamer, scanner, prompt_ids.cpu()

    def put(self, value):
        start = self.seq.shape[1]
        self.seq = torch.cat([self.seq, value.reshape(1, -1)], dim=-1)
        stop = self.scanner.scan(self.seq)
        keep = self.seq.shape[1] if stop is None else max(stop, start)
        if keep > start:
            self.streamer.put(self.seq[0, start:keep])

    def end(self):
        return self.streamer.end()
