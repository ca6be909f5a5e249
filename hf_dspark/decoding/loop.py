"""DSpark's own verification loop: a static KV cache, verification forwards at a few fixed lengths, rollback by
moving the cache's position, and the multi-token forward compiled (one graph whose token count, attended window and
cache size are symbolic, for every verification length and call, compiled once per setup and kept on disk:
graphs.py).

Drafting, the verify policy, the stats and the rollback of stateful processors stay the candidate generator's
(candidate.py), exactly as on transformers' assisted loop; this loop replaces only the loop around them, for the
requests it can take. `unsupported(...)` names what still goes to transformers' assisted loop.

One round, with n = 1 + ℓ tokens to verify (the anchor and ℓ drafts) on a cache holding cur_len - 1 positions:
  feed [anchor, x_1..x_ℓ] padded to L = padded(n) tokens (the pad repeats the last token; its rows are never read)
  → logits rows 0..ℓ, processed and judged as transformers judges them (greedy prefix match; rejection sampling on
    the same law, drawn with one uniform per token: rejection_sample)
  → keep cur_len + m positions (anchor + m accepted drafts): the L - 1 - m positions after them are rolled back by
    moving the position; the next forward overwrites them.
A padded row sees only earlier positions (causal), so rows 0..ℓ are the logits an unpadded forward computes.
"""

from __future__ import annotations

import weakref

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.utils import logging

from ..model.heads import draw, draw_from
from .graphs import VerificationGraphs, linear_forms
from .scheduler import pad_length

logger = logging.get_logger(__name__)

LENGTHS = (1, 2, 4, 8, 16, 32, 64)  # verification forwards are padded up to one of these; γ + 1 ≤ 64
_ALLOWED_KWARGS = {"assistant_model", "synced_gpus", "attention_mask", "position_ids", "logits_to_keep", "cache",
                   "use_cache", "streamer", "inputs_tensor", "tokenizer", "assistant_tokenizer", "target_tokenizer"}


def padded(n: int) -> int:
    """The verification length a forward of n tokens runs as: the smallest of LENGTHS ≥ n."""
    return next(length for length in LENGTHS if length >= n)


def room(generation_config, block_size: int) -> int:
    """Cache positions a call needs: up to max_length, plus the longest padded verification past the last position
    a draft may take."""
    return generation_config.max_length + padded(block_size + 1)


def unsupported(model, input_ids: torch.Tensor, generation_config, model_kwargs: dict, block_size: int) -> str | None:
    """None if this loop can run the request, else why it stays on transformers' assisted loop. The last check
    allocates the model's static cache if it has none long enough (the call then uses it)."""
    if generation_config.return_dict_in_generate and (generation_config.output_attentions or
                                                      generation_config.output_hidden_states):
        return "output_attentions or output_hidden_states in a dict output"
    extra = sorted(k for k, v in model_kwargs.items() if k not in _ALLOWED_KWARGS and v is not None)
    if extra:
        return f"generate arguments {extra}"
    if model_kwargs.get("synced_gpus"):
        return "synced_gpus=True"
    cache = model_kwargs.get("cache")
    if cache is not None and getattr(cache, "_is_user_defined", False):
        return "a cache object passed in"
    positions = model_kwargs.get("position_ids")
    if positions is not None and not torch.equal(positions.view(-1).cpu(), torch.arange(input_ids.shape[1])):
        return "custom position_ids"
    if not getattr(model, "_can_compile_fullgraph", False):
        return f"{type(model).__name__} has no static-cache support in transformers"
    if not _static_cache(model, room(generation_config, block_size), reset=False).is_croppable:
        return (f"a static cache of {model._dspark_static_cache[2]} positions for {type(model).__name__}, which "
                "cannot be rolled back (a sliding window shorter than it, or recurrent layers)")
    return None


class StaticVerifier:
    """The target's forwards on one static cache of `max_len` positions (+ the largest padding), eager or compiled
    (`compiled`: the multi-token verification forwards only; a one-token step runs eagerly, where compiling did not
    pay on the CPUs measured, docs/benchmarks.md). Every forward attends only the positions in use (WindowedLayer)."""

    def __init__(self, model, max_len: int, hidden_states, compiled: bool = False, longest: int = 1,
                 run_as: dict[int, int] | None = None, forms=None):
        """longest: the most tokens a verification may take (γ + 1); compiled, the one graph for every length up to
        it is loaded or compiled here, before the first round, so that no round pays for it (graphs.py: compiled once
        per setup, then loaded from disk). run_as: n tokens → the (larger) number of tokens to feed instead, where
        the device profile measured that longer forward as cheaper (a compiled 2-token forward can cost less than
        the eager 1-token step); it depends only on n, so it stays lossless. forms: the call's round products
        (linears.round_linears, None for F.linear), installed while the lengths compile, so that the graphs are
        the ones its verifications run (on some CPUs a graph traced with weight-major products costs half as
        much)."""
        self.model, self.hidden_states, self.longest, self.forms = model, hidden_states, longest, forms
        self.run_as = run_as or {}
        self.fed = self.real = 0  # tokens the last verification fed (padding included) and of them real ones
        self.cache = _static_cache(model, max_len)
        self.size = model.__dict__["_dspark_static_cache"][2]  # > max_len: every window leaves the last position out
        compiled = compiled and "_dspark_compile_error" not in model.__dict__  # failed once: eager from then on
        self.forward = _compiled_forward(model, padded(longest)) if compiled else model.forward
        self.compiled = compiled

    def _compile_lengths(self, longest: int) -> None:
        """Run each length once on the filled cache and roll it back: the first loads or compiles the graph
        (graphs.py), the others check that it serves them."""
        done = self.model.__dict__.setdefault("_dspark_compiled_lengths", set())
        form = self.forms is not None
        installed = form and self.forms.installed
        if form:
            self.forms.install()
        try:
            # the products installed now, by the call's forms or by a caller (the profile's A/B): each is a graph
            products = tuple(linear_forms(self.model))
            todo = [L for L in LENGTHS if 1 < L <= padded(longest) and (L, id(self.cache), products) not in done]
            if todo:
                self._compile(todo, done, products)
        finally:
            if form and not installed:
                self.forms.remove()

    def _compile(self, todo: list[int], done: set, products: tuple) -> None:
        """Run the lengths `todo` once each (loading or compiling the graph) and mark them done for this cache and
        these products."""
        filled = self.cache.get_seq_length()
        for L in todo:
            tokens = torch.zeros((1, L), dtype=torch.long, device=self.model.device)
            try:
                self._run(self.forward, tokens)
            except Exception as e:  # noqa: BLE001 -- no compiler, an unsupported op: the same loop, eager
                if self.cache.get_seq_length() > filled:
                    self.cache.crop(filled - self.cache.get_seq_length())
                self.model.__dict__["_dspark_compile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                self.forward, self.compiled = self.model.forward, False
                logger.warning(f"DSpark: compiling failed ({self.model._dspark_compile_error}); the loop verifies "
                               "eagerly instead (same output, the eager loop's speed)")
                return
            self.cache.crop(-L)
            done.add((L, id(self.cache), products))

    def prefill(self, input_ids: torch.Tensor):
        out = self._run(self.model.forward, input_ids)
        if not self.cache.is_croppable:  # unsupported() sends such requests to the assisted loop; never reached
            raise RuntimeError("this target's static cache cannot be rolled back")
        if self.compiled:
            self._compile_lengths(self.longest)
        return out

    def verify(self, tokens: torch.Tensor):
        """tokens [1, n] → the forward of them padded to padded(n), all rows (the caller reads rows 0..n-1)."""
        n = tokens.shape[1]
        # a fresh [1, L] tensor: a compiled graph guards on shape and strides
        fed = tokens.new_empty((1, padded(max(n, self.run_as.get(n, n)))))
        fed[:, :n], fed[:, n:] = tokens, tokens[:, -1:]
        tokens, L = fed, fed.shape[1]
        self.fed, self.real = L, n
        return self._run(self.forward if L > 1 else self.model.forward, tokens)

    def _run(self, forward, tokens: torch.Tensor):
        """forward(tokens) on the cache, attending only its positions in use, rounded up to WINDOW_STEP (the window is
        a tensor's length: the compiled graph takes it symbolic, one graph for every window)."""
        used = int(self.cache.get_seq_length()) + tokens.shape[1]
        window = torch.empty(min(-(-used // WINDOW_STEP) * WINDOW_STEP, self.size - 1), dtype=torch.uint8)
        _set_window(self.cache, window)
        try:
            return forward(tokens, cache=self.cache, use_cache=True, output_hidden_states=self.hidden_states)
        finally:
            _set_window(self.cache, None)

    def keep(self, kept: int) -> None:
        """After a verification: keep the first `kept` tokens it fed in the cache (the rest, padding included, is
        rolled back by moving the position)."""
        self.cache.crop(-(self.fed - kept))


CACHE_STEP = 512  # a static cache's length is rounded up to this: calls of similar lengths share one cache
WINDOW_STEP = 64  # a forward attends the cache's first positions in multiples of this, not all of it


class WindowedLayer(StaticLayer):
    """A static cache layer whose forwards attend only its first `len(window)` positions (window None: all of them).

    Positions past the window are unwritten or rolled back, so masked: dropping them changes no logit, and on a
    CPU it saves what a step pays to build a mask over, and attend, the whole reserved cache (with nothing drafted
    the static loop ran 0.84-0.88x plain generate on a 512-position cache holding ~100 positions; the compiled loop
    ran a chat prompt at 0.96x on a 1,536-position one: research/record/benchmarks.md).
    The window is a tensor's length, not an int, so that a compiled graph can take it as a symbolic size."""

    window: torch.Tensor | None = None

    def update(self, key_states, value_states, *args, **kwargs):
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        if self.window is None:
            return keys, values
        return keys[:, :, : self.window.shape[0]], values[:, :, : self.window.shape[0]]

    def get_mask_sizes(self, *args, **kwargs) -> tuple[int, int]:
        length, offset = super().get_mask_sizes(*args, **kwargs)
        return (length if self.window is None else self.window.shape[0]), offset


def _set_window(cache: StaticCache, window: torch.Tensor | None) -> None:
    for layer in cache.layers:
        if isinstance(layer, WindowedLayer):
            layer.window = window


def reserve(model, positions: int) -> None:
    """Size the static cache DSpark's own loops keep on `model` for calls of up to `positions` positions (prompt +
    max_new_tokens), as a warm-up call that long would. A call that needs more than the cache holds allocates a new
    one in the middle of the run (the compiled loop's graph serves every cache size of full-attention layers, but
    not a sliding window's longer layer: graphs.py): reserve the longest call expected before the first. Forwards
    attend only the positions in use (WindowedLayer), so a longer cache costs memory, not attention."""
    if positions < 1:
        raise ValueError(f"positions must be >= 1, got {positions}")
    _static_cache(model, positions + LENGTHS[-1], reset=False)  # the longest padded verification past the last


def _static_cache(model, length: int, reset: bool = True) -> StaticCache:
    """The model's static cache (reset unless `reset=False`), if it holds more than `length` positions; else a new
    one of `length` + 1 rounded up to CACHE_STEP (kept for later calls: a generate call is not thread-safe on one
    model anyway)."""
    kept = model.__dict__.get("_dspark_static_cache")
    placed = (model.dtype, model.device)  # a cast or moved model needs a new cache
    if kept is not None and kept[1] == placed and kept[2] > length:
        if reset:
            kept[0].reset()
        return kept[0]
    size = -(-(length + 1) // CACHE_STEP) * CACHE_STEP  # one spare position: a window ends before the cache's end
    cache = StaticCache(config=model.config, max_cache_len=size)
    for layer in cache.layers:  # full-attention layers only: a sliding window's layer keeps its own mask sizes
        if type(layer) is StaticLayer:
            layer.__class__ = WindowedLayer
    model.__dict__["_dspark_static_cache"] = (cache, placed, size)
    return cache


# model → {most: its VerificationGraphs}. Not in the model's __dict__: tracing another graph pickles the model (an
# input), and a compiled graph in its attributes cannot be pickled.
_GRAPHS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _compiled_forward(model, most: int) -> VerificationGraphs:
    """The model's compiled verification forward for 2..`most` tokens (kept for the model's lifetime with the graphs
    it loaded or compiled; `most` is a graph's limit: weight-major products branch on it, linears.py)."""
    kept = _GRAPHS.setdefault(model, {})
    if most not in kept:
        kept[most] = VerificationGraphs(model, most, WINDOW_STEP)
    return kept[most]


def rejection_sample(drafts: torch.Tensor, q_logits: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Speculative sampling of one round (Leviathan et al. 2023, algorithm 1): drafts [ℓ] drawn from
    softmax(q_logits) [ℓ, V], the target's processed scores [ℓ + 1, V] → the committed tokens [1, m + 1]: the m
    drafts accepted (x_i kept with probability min(1, p_i / q_i) until the first rejection), then one token from the
    residual max(p − q, 0) at the first rejection, or from p after all ℓ. transformers' _speculative_sampling's law
    (the assisted loop's), with one uniform for the last token instead of torch.multinomial's pass over V."""
    ell = drafts.shape[0]
    p = scores.softmax(dim=-1)
    q = q_logits.softmax(dim=-1)
    rows = torch.arange(ell, device=drafts.device)
    ratio = p[rows, drafts] / q[rows, drafts]
    m = int(((torch.rand_like(ratio) > ratio).cumsum(dim=-1) < 1).sum())
    if m < ell:
        residual = (p[m] - q[m]).clamp_(min=0)
        # a rejection means p(x_m) < q(x_m), so the residual has mass; were it all rounded away, p and q agree to
        # rounding and p is the residual's law
        last = draw_from((residual if bool(residual.sum() > 0) else p[m])[None])
    else:
        last = draw_from(p[m:])
    return torch.cat([drafts[:m], last.to(drafts.device)]).view(1, -1)


@torch.no_grad()
def decode(model, input_ids: torch.Tensor, logits_processor, stopping_criteria, generation_config, candidate,
           streamer=None, compiled: bool = False) -> torch.Tensor | GenerateDecoderOnlyOutput:
    """DSpark decoding of one sequence: input_ids [1, prompt] → [1, prompt + new], what generate() returns (with
    return_dict_in_generate: its output object, with `scores` and `logits` per new token [1, V] as transformers'
    assisted loop gives them, and no cache: the loop's static cache is the model's and reused by the next call).
    `candidate` is the call's DSparkCandidateGenerator; the rest are generate()'s own objects."""
    do_sample = bool(generation_config.do_sample)
    as_dict = bool(generation_config.return_dict_in_generate)
    kept_scores = () if as_dict and generation_config.output_scores else None
    kept_logits = () if as_dict and generation_config.output_logits else None
    eos = getattr(generation_config, "_eos_token_tensor", None)
    profile = candidate.policy.profile  # the profile of this loop (policy.py), None under fixed policies
    run_as = {} if profile is None else {n: pad_length(n - 1, profile.verify_time) + 1
                                         for n in range(1, len(profile.verify_time) + 1)}
    verifier = StaticVerifier(model, room(generation_config, candidate.block_size), candidate.model_kwargs_overrides["output_hidden_states"], compiled,
                              longest=candidate.block_size + 1, run_as=run_as, forms=candidate.linears)
    # the prefill: transformers' first assisted round (no candidates; the first token drawn from the last row)
    candidate.get_candidates(input_ids, is_first_iteration=True)
    out = verifier.prefill(input_ids)
    fed, candidates, q_logits = 0, input_ids, None  # fed: tokens the last verification took (0: the prefill)
    logits = out.logits[:, -1:]
    while True:
        cur_len = input_ids.shape[1]
        n_drafts = candidates.shape[1] - cur_len
        raw = logits[:, : n_drafts + 1].to(dtype=torch.float32, device=input_ids.device)
        scores = raw.clone() if kept_logits is not None else raw
        for i in range(n_drafts + 1):
            scores[:, i] = logits_processor(candidates[:, : cur_len + i], scores[:, i])
        if do_sample and q_logits is not None:
            valid = rejection_sample(candidates[0, cur_len:], q_logits[0], scores[0])
        else:
            if do_sample:  # a plain step, or n-gram drafts (q a point mass): sample every row and compare
                chosen = draw(scores[0]).view(1, -1)
            else:
                chosen = scores.argmax(dim=-1)
            drafts = candidates[:, cur_len:]
            matches = int(((drafts != chosen[:, :-1]).cumsum(dim=-1) < 1).sum())
            valid = chosen[:, : matches + 1]
        valid = valid[:, : generation_config.max_length - cur_len]
        if eos is not None:
            ends = torch.isin(valid[0], eos.to(valid.device)).nonzero()
            if ends.numel():
                valid = valid[:, : int(ends[0]) + 1]
        matches = valid.shape[1] - 1
        if kept_scores is not None:
            kept_scores += tuple(scores[:, i] for i in range(matches + 1))
        if kept_logits is not None:
            kept_logits += tuple(raw[:, i] for i in range(matches + 1))
        input_ids = torch.cat([input_ids, valid], dim=-1)
        if streamer is not None:
            streamer.put(valid.cpu())
        if fed:  # the anchor and the accepted drafts stay in the cache; the rest of the forward is rolled back
            verifier.keep(matches + 1)
        candidate.update_candidate_strategy(input_ids, scores, matches)
        if bool(stopping_criteria(input_ids, None).all()):
            break
        candidates, q_logits = candidate.get_candidates(input_ids, model_outputs=out, is_first_iteration=False)
        candidates = candidates.to(input_ids.device)
        q_logits = None if q_logits is None else q_logits.to(input_ids.device)
        fed = candidates.shape[1] - input_ids.shape[1] + 1
        out = verifier.verify(candidates[:, input_ids.shape[1] - 1:])
        logits = out.logits
    if streamer is not None:
        streamer.end()
    if as_dict:
        return GenerateDecoderOnlyOutput(sequences=input_ids, scores=kept_scores, logits=kept_logits)
    return input_ids
