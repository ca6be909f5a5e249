"""Logits processors under speculation: which ones the drafter may call, how stateful ones are rolled back to
the committed prefix after each verification, and the observer that records the target's probabilities.

Plain `generate` calls every processor once per generated token, on the growing committed prefix. Speculative
verification calls the list once per verified position, also on prefixes that end in drafts the target then
rejects; and the drafter calls the list on its own drafts. A processor whose output depends only on
`(input_ids, scores)` is indifferent to both. One that keeps state between calls (classifier-free guidance's
unconditional cache, SynthID's context history, a user's counter) is not: the target's list wraps it in
`Rollback`, which snapshots its state after every call and, once verification has committed `n` tokens, puts back
the state it had after the call on the last committed prefix, i.e. exactly the state plain `generate` would
leave; the drafter never calls it. docs/lossless.md lists the verdict for every processor transformers ships.
"""

from __future__ import annotations

import copy

import torch
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation import logits_process as lp

# Output a function of (input_ids, scores) alone (a lazily built constant or a tensor moved to the scores'
# device is not state): called by the drafter, and on rejected prefixes, without consequence.
PURE: frozenset[type] = frozenset({
    lp.MinLengthLogitsProcessor, lp.MinNewTokensLengthLogitsProcessor, lp.TemperatureLogitsWarper,
    lp.RepetitionPenaltyLogitsProcessor, lp.EncoderRepetitionPenaltyLogitsProcessor, lp.TopPLogitsWarper,
    lp.TopKLogitsWarper, lp.TopHLogitsWarper, lp.MinPLogitsWarper, lp.TypicalLogitsWarper, lp.EpsilonLogitsWarper,
    lp.EtaLogitsWarper, lp.NoRepeatNGramLogitsProcessor, lp.EncoderNoRepeatNGramLogitsProcessor,
    lp.SequenceBiasLogitsProcessor, lp.NoBadWordsLogitsProcessor, lp.PrefixConstrainedLogitsProcessor,
    lp.ForcedBOSTokenLogitsProcessor, lp.ForcedEOSTokenLogitsProcessor, lp.InfNanRemoveLogitsProcessor,
    lp.ExponentialDecayLengthPenalty, lp.LogitNormalization, lp.SuppressTokensAtBeginLogitsProcessor,
    lp.SuppressTokensLogitsProcessor, lp.WatermarkLogitsProcessor,  # reseeds its generator from the prefix each call
})

# Stateful processors transformers ships, and the attributes that hold their state (the rest is configuration,
# not copied). A processor not named here or in PURE has all its attributes snapshotted (modules shared).
STATE: dict[type, tuple[str, ...]] = {
    lp.SynthIDTextWatermarkLogitsProcessor: ("state",),
    lp.UnbatchedClassifierFreeGuidanceLogitsProcessor: ("unconditional_context",),
}


def mark_stateless(processor: LogitsProcessor) -> LogitsProcessor:
    """Declare that `processor`'s output depends only on `(input_ids, scores)`: DSpark then neither snapshots it
    nor keeps it from the drafter. Returns the processor. Marking a stateful processor breaks identity."""
    processor.dspark_stateless = True
    return processor


def is_pure(processor) -> bool:
    """True for the processors known or declared to keep no state (exact class: a subclass may add state)."""
    return type(processor) in PURE or getattr(processor, "dspark_stateless", False) is True


class Rollback(LogitsProcessor):
    """A stateful processor in the target's list, rolled back to the committed prefix after each verification.

    After each call on a prefix of length L it keeps a copy of the processor's state keyed by L; `restore(n)`
    (n = the committed length after verification) reinstates the copy from the call on the prefix of length
    n - 1, the last one plain `generate` would have made, and forgets the rest.
    """

    def __init__(self, processor: LogitsProcessor):
        self.processor = processor
        self.attrs = STATE.get(type(processor))
        self.snapshots: dict[int, dict] = {}
        try:
            self._state()
        except Exception as e:  # refuse before generating rather than fail mid-way
            name = type(processor).__name__
            raise ValueError(
                f"DSpark cannot snapshot the state of the logits processor {name} ({type(e).__name__}: {e}); "
                f"if its output depends only on (input_ids, scores), pass hf_dspark.mark_stateless({name}(...))"
            ) from e

    def _state(self) -> dict:
        attrs = vars(self.processor)
        keep = {k: attrs[k] for k in (self.attrs or attrs) if k in attrs}
        shared = {id(v): v for v in keep.values() if isinstance(v, torch.nn.Module)}  # a model is not state
        return copy.deepcopy(keep, shared)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = self.processor(input_ids, scores)
        self.snapshots[input_ids.shape[1]] = self._state()
        return scores

    def restore(self, committed: int) -> None:
        state = self.snapshots.pop(committed - 1, None)
        if state is not None:
            vars(self.processor).update(state)
        self.snapshots.clear()


def guard(processors: LogitsProcessorList) -> tuple[LogitsProcessorList | None, list[Rollback]]:
    """Wrap every stateful processor of the target's list in place in a `Rollback`; return the drafter's list
    (the pure processors, in order; None if there are none) and the wrappers to restore after each verification."""
    rollbacks, draft = [], LogitsProcessorList()
    for i, proc in enumerate(processors):
        if is_pure(proc):
            draft.append(proc)
        elif not isinstance(proc, (Rollback, DSparkLogitsProcessor)):
            processors[i] = Rollback(proc)
            rollbacks.append(processors[i])
    return (draft or None), rollbacks


class DSparkLogitsProcessor(LogitsProcessor):
    """Put last in the target's list (after the warpers), so it sees exactly the distribution the target
    samples from. Transformers calls it once per verified position with the draft prefix as `input_ids`;
    it may revisit a prefix length in a later round, so records are keyed by round, overwritten, not counted.
    """

    def __init__(self):
        self.candidate: torch.Tensor | None = None  # [1, cur_len + ℓ]
        self.cur_len = 0
        self.target_probs: dict[int, float] = {}  # position k (1-based) → p_target(x_k)
        self.target_tokens: dict[int, int] = {}  # position k (1-based) → target argmax

    def begin_round(self, candidate_ids: torch.Tensor, cur_len: int) -> None:
        self.candidate, self.cur_len = candidate_ids, cur_len
        self.target_probs, self.target_tokens = {}, {}

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        top, arg = scores[0].max(-1)  # one pass: max propagates NaN, and +inf is the max if present
        if torch.isnan(top) or torch.isposinf(top):
            # -inf is a processor's "forbidden"; NaN/+inf mean the target itself broke (e.g. fp16 overflow).
            raise ValueError(f"the target produced NaN/+inf logits at sequence length {input_ids.shape[1]}")
        if self.candidate is None:  # the prefill step: nothing drafted yet
            return scores
        k = input_ids.shape[1] - self.cur_len + 1  # which draft position these scores judge
        self.target_tokens[k] = int(arg)
        if input_ids.shape[1] < self.candidate.shape[1]:
            token = self.candidate[0, input_ids.shape[1]]
            s = scores[0].float()
            self.target_probs[k] = float(torch.exp(s[token] - torch.logsumexp(s, -1)))
        return scores
