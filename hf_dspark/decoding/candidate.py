"""DSparkCandidateGenerator and how `model.generate(..., assistant_model=drafter)` selects it.

This is the only module that knows transformers' assisted-decoding internals. transformers 5.23/5.24
has no public hook for a custom CandidateGenerator, so `enable(model)` swaps the target's class (once,
per instance, keeping its name so save_pretrained is unaffected) for one that mixes in
`DSparkGenerationMixin`. The mixin overrides three private GenerationMixin methods, and only when the
assistant is a DSparkDrafter; every other assistant, and plain decoding, go to transformers untouched.
`enable` checks those methods' signatures and refuses a transformers whose internals differ.
"""

from __future__ import annotations

import inspect
import time

import torch
from transformers import LogitsProcessorList
from transformers.generation import GenerationConfig, GenerationMixin
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxTimeCriteria,
    StoppingCriteria,
)

from ..model.drafter import DSparkDrafter
from .ngram import NgramIndex
try:  # kernels/dspark_kernels: the fused Triton draft on CUDA; it runs heads.sequential_draft otherwise
    from dspark_kernels.dispatch import sequential_draft
except ModuleNotFoundError as e:  # an install without kernels/ (see docs/kernels.md)
    if e.name != "dspark_kernels":
        raise
    from ..model.heads import sequential_draft
from .processors import DSparkLogitsProcessor
from .stats import DSparkStats, Round
from .verify_policy import VerifyPolicy

# The private methods we override, with the leading parameters we rely on (checked by `enable`).
_EXPECTED = {
    "_get_candidate_generator": (
        "self", "generation_config", "input_ids", "inputs_tensor", "logits_processor", "model_kwargs",
        "assistant_model", "target_tokenizer", "assistant_tokenizer",
    ),
    "_assisted_decoding": ("self", "input_ids", "logits_processor", "stopping_criteria", "generation_config"),
    "_validate_generation_mode": ("self", "generation_mode", "generation_config", "generation_mode_kwargs"),
}

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
            import transformers

            raise RuntimeError(
                f"hf_dspark supports transformers 5.23-5.24; transformers {transformers.__version__} changed "
                f"GenerationMixin.{name} (expected parameters {params}, found {got}). Please report this."
            )


class DSparkGenerationMixin:
    """Routes `generate(assistant_model=<DSparkDrafter>)` to DSparkCandidateGenerator."""

    _is_dspark_enabled = True

    def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs):
        drafter = generation_mode_kwargs.get("assistant_model")
        if isinstance(drafter, DSparkDrafter):
            _validate_request(self, drafter, generation_mode, generation_config, generation_mode_kwargs)
        return super()._validate_generation_mode(generation_mode, generation_config, generation_mode_kwargs)

    def _assisted_decoding(self, input_ids, logits_processor, stopping_criteria, generation_config, *args, **kwargs):
        drafter = kwargs.get("assistant_model")
        if not isinstance(drafter, DSparkDrafter):
            return super()._assisted_decoding(input_ids, logits_processor, stopping_criteria, generation_config, *args, **kwargs)
        if input_ids.shape[0] != 1:
            raise NotImplementedError(f"DSpark decodes one sequence at a time; got a batch of {input_ids.shape[0]}")
        mask = kwargs.get("attention_mask")
        if mask is not None and not bool(mask.all()):
            raise NotImplementedError("DSpark does not support padded prompts (attention_mask with zeros)")
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
            # transformers 5.23/5.24's assisted loop re-feeds the whole prompt on top of a pre-filled cache: its own
            # assistants (prompt lookup, assistant models) then return wrong tokens silently; we refuse instead
            raise NotImplementedError(
                f"a pre-filled cache ({cache.get_seq_length()} positions; prompt caching) is not supported with "
                "DSpark: transformers' assisted decoding would recompute the prompt on top of it. Pass no cache."
            )
        context = self.config.get_text_config().max_position_embeddings
        if generation_config.max_length > context:
            raise ValueError(
                f"prompt ({input_ids.shape[1]} tokens) + max_new_tokens needs {generation_config.max_length} "
                f"positions; the target's context is {context}. Shorten the prompt or lower max_new_tokens."
            )
        scanner = StopScanner(stopping_criteria, input_ids)
        if scanner.checks:
            stopping_criteria.append(scanner)
            if kwargs.get("streamer") is not None:
                kwargs["streamer"] = _StoppingStreamer(kwargs["streamer"], scanner, input_ids)
        out = super()._assisted_decoding(input_ids, logits_processor, stopping_criteria, generation_config, *args, **kwargs)
        return scanner.truncate(out)

    def _get_candidate_generator(self, generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs,
                                 assistant_model=None, target_tokenizer=None, assistant_tokenizer=None):
        if isinstance(assistant_model, DSparkDrafter):
            return DSparkCandidateGenerator(self, assistant_model, generation_config, logits_processor)
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
    if drafter._target is not target:
        raise ValueError(
            "this drafter is bound to another model; call drafter.bind(model) for the model you generate with"
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
    if gen_config.cache_implementation is not None:
        raise NotImplementedError(
            f"cache_implementation={gen_config.cache_implementation!r}: assisted decoding needs a croppable "
            "DynamicCache; static/offloaded caches are not supported"
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
        cache = getattr(out, "past_key_values", None)
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


def backbone_slots(drafts: int, block_size: int) -> int:
    """Block slots the backbone runs for `drafts` drafts: the anchor, one mask per draft (slot i predicts draft
    i + 1, so the last mask looks one token past the last draft), at most the trained block."""
    return min(block_size, drafts + 1)


class DSparkCandidateGenerator(CandidateGenerator):
    """One DSpark round per call: ingest the target's tapped hidden states of the tokens it just accepted,
    draft γ tokens (parallel backbone + sequential head + confidence), choose how many to verify, and return
    them with the exact logits they were drawn from. transformers then verifies (greedy prefix match or
    rejection sampling) and reports back through `update_candidate_strategy`.
    """

    requires_model_outputs = True

    def __init__(self, target, drafter: DSparkDrafter, generation_config: GenerationConfig, logits_processor):
        self.target, self.drafter = target, drafter
        cfg = drafter.config
        self.taps = list(cfg.target_layer_ids)
        # Only the tapped layers are materialised; if the user asked for all hidden states, keep them all.
        wanted = True if generation_config.output_hidden_states else [i + 1 for i in self.taps]
        self.model_kwargs_overrides = {"output_hidden_states": wanted}
        self.do_sample = bool(generation_config.do_sample)
        self.max_length = generation_config.max_length
        # Drafts go through the same processors as the target (minus our observer), so q is what they are drawn from.
        self.draft_processor = LogitsProcessorList(list(logits_processor)) if len(logits_processor) else None
        self.observer = DSparkLogitsProcessor()
        logits_processor.append(self.observer)
        self.block_size = cfg.block_size
        self.vocab, self.lm_rows, self.w2_rows = drafter.draft_weights()  # pruned-vocabulary rows, gathered once
        self.mask_ids = torch.full((1, cfg.block_size - 1), cfg.mask_token_id, dtype=torch.long, device=drafter.device)
        self.context_kv: list | None = None  # per drafter layer (k, v) [1, n_kv, ctx_len, hd]
        self.ctx_len = 0
        self.unfused: list[torch.Tensor] = []  # tapped features [1, rows, m·d] of positions not in context_kv yet
        self.pending: dict | None = None
        self.stats = DSparkStats(block_size=cfg.block_size)
        self.verify_policy = VerifyPolicy.for_drafter(drafter, target)  # drafter.verify_policy, resolved once
        self.ngrams = NgramIndex() if getattr(drafter, "ngram_drafts", False) else None
        drafter.last_stats = self.stats

    @torch.no_grad()
    def get_candidates(self, input_ids, model_kwargs=None, model_outputs=None, is_first_iteration=False,
                       n_last_matches=0, **kwargs):
        """input_ids [1, cur_len] (prompt + committed tokens; the last one, the anchor, is not in the target's
        cache yet) → (candidate_ids [1, cur_len + ℓ], candidate_logits [1, ℓ, V] float32 or None)."""
        if is_first_iteration:  # the target must prefill first: we have no hidden states yet
            self.stats.prompt_tokens = input_ids.shape[1]
            self.stats.started = time.perf_counter()
            return input_ids, None
        t0 = time.perf_counter()
        self._collect(input_ids, model_outputs)
        cur_len = input_ids.shape[1]
        room = self.max_length - cur_len - 1  # drafts that could still be committed
        if self.ngrams is not None:  # free n-gram drafts first: they depend on committed tokens only (ngram.py)
            self.ngrams.extend(input_ids[0, len(self.ngrams.seq):].tolist())
            drafts = self.ngrams.draft(min(self.verify_policy.max_ngram_drafts, room))
            if drafts:  # q is a point mass: no logits, transformers verifies by sample-and-compare (or argmax)
                candidate = torch.cat([input_ids, input_ids.new_tensor([drafts])], dim=-1)
                return self._send(input_ids, candidate, None, drafts, [], "ngram", t0)
        n = min(self.block_size, room, self.verify_policy.max_drafts)  # and that the policy could ever verify
        if n <= 0 or not self.verify_policy.should_draft():  # a plain target step this round
            return self._send(input_ids, input_ids, None, [], [], "dspark", t0)
        self._fuse()
        dr = self.drafter
        # The backbone runs only the slots the policy can use (backbone_slots): more changed no acceptance we
        # measured and each costs time on CPU. The length limit only trims the block, so `replay` stays exact.
        slots = backbone_slots(self.verify_policy.max_drafts, self.block_size)
        block_ids = torch.cat([input_ids[:, -1:].to(dr.device), self.mask_ids[:, : slots - 1]], dim=-1)
        positions = torch.arange(cur_len - 1, cur_len - 1 + slots, device=dr.device)[None]
        h = dr.backbone(dr.embed(block_ids), positions, self.context_kv)[0, :n]
        block = sequential_draft(
            dr.base_logits(h, self.lm_rows), h, input_ids[0, -1].to(dr.device), dr.head, dr.confidence,
            input_ids, self.draft_processor, self.do_sample,
            vocab=self.vocab, w2=self.w2_rows, vocab_size=dr.config.vocab_size,
        )
        # calibrated c_k [n], one host sync for the policy and the stats
        conf = dr.confidence_probs(block.conf_logits).cpu() if dr.confidence is not None else None
        length = self.verify_policy.length(conf, n)  # ℓ in 0..n, from c_1..c_n only (verify_policy.py)
        candidate = torch.cat([input_ids, block.tokens[:length].view(1, -1).to(input_ids.device)], dim=-1)
        # transformers verifies on input_ids' device (device_map targets: may differ from the drafter's)
        logits = block.logits[:length].unsqueeze(0).to(input_ids.device) if (self.do_sample and length) else None
        return self._send(input_ids, candidate, logits, block.tokens.tolist(), [] if conf is None else conf.tolist(),
                          "dspark", t0)

    def _send(self, input_ids, candidate, logits, drafts: list[int], conf: list[float], source: str, t0):
        cur_len = input_ids.shape[1]
        self.observer.begin_round(candidate, cur_len)
        self.pending = {
            "cur_len": cur_len,
            "drafted": len(drafts),
            "tokens": drafts,
            "verified": candidate.shape[1] - cur_len,
            "confidence": conf,
            "source": source,
            "draft_time": time.perf_counter() - t0,
            "sent": time.perf_counter(),
        }
        return candidate, logits

    def _collect(self, input_ids, model_outputs) -> None:
        """Keep the tapped hidden states of every position the target has newly verified and accepted: after
        prefill the whole prompt, later the anchor plus the accepted drafts (rows 0..m of the pass). They become
        context K/V (`_fuse`) only when a round drafts, in one batch: rounds without drafts cost nothing here."""
        if self.verify_policy.max_drafts == 0:  # a policy that never drafts needs no context
            return
        new = input_ids.shape[1] - 1 - self.ctx_len - sum(f.shape[1] for f in self.unfused)
        hs = getattr(model_outputs, "hidden_states", None)
        if hs is None:
            raise RuntimeError("the target returned no hidden states; DSpark needs transformers' output_hidden_states")
        rows = hs[self.taps[0] + 1].shape[1]
        if new > rows:
            raise NotImplementedError(
                f"the target verified {rows} positions but {new} are new to the drafter: a pre-filled "
                "past_key_values (prompt caching) is not supported with DSpark"
            )
        dr = self.drafter
        if new > 0:  # taps may span devices; cat copies, so the pass's full hidden states are not kept alive
            self.unfused.append(torch.cat([hs[i + 1][:, :new].to(dr.device) for i in self.taps], dim=-1))

    def _fuse(self) -> None:
        """Append the context K/V of the collected positions: [(k, v) [1, n_kv, ctx_len, hd]] per drafter layer."""
        if not self.unfused:
            return
        dr = self.drafter
        feats = torch.cat(self.unfused, dim=1) if len(self.unfused) > 1 else self.unfused[0]
        self.unfused = []
        new = feats.shape[1]
        positions = torch.arange(self.ctx_len, self.ctx_len + new, device=dr.device)[None]
        kv = dr.context_kv(feats, positions)
        if self.context_kv is None:
            self.context_kv = kv
        else:
            self.context_kv = [(torch.cat([k0, k], 2), torch.cat([v0, v], 2)) for (k0, v0), (k, v) in zip(self.context_kv, kv)]
        self.ctx_len += new

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        """input_ids [1, new_len] after verification; scores [1, ℓ+1, V] processed target logits."""
        p, self.pending = self.pending, None
        if p is None:  # the prefill step
            return
        new_tokens = input_ids[0, p["cur_len"]:].tolist()
        accepted = 0  # drafts kept = common prefix of drafts and committed tokens (a stop may drop the bonus)
        while accepted < min(p["verified"], len(new_tokens)) and new_tokens[accepted] == p["tokens"][accepted]:
            accepted += 1
        if p["source"] == "dspark":  # the draft gate judges the drafter; n-gram rounds neither pay nor age it
            self.verify_policy.record(p["drafted"], p["verified"], accepted)
        probs = self.observer.target_probs
        self.stats.new_tokens = input_ids.shape[1] - self.stats.prompt_tokens
        self.stats.add(Round(
            drafted=p["drafted"], verified=p["verified"], accepted=accepted, committed=len(new_tokens),
            draft_time=p["draft_time"], verify_time=time.perf_counter() - p["sent"],
            confidence=p["confidence"], target_probs=[probs[k] for k in sorted(probs)],
            tokens=p["tokens"], new_tokens=new_tokens, source=p["source"],
        ))
