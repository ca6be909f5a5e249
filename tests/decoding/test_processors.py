"""Logits processors under speculation (decoding/processors.py): every processor transformers ships is audited,
stateful ones (classifier-free guidance, SynthID, a user's own) give plain `generate`'s tokens and law, and a
processor whose state cannot be kept is refused by name."""

import contextlib
import inspect
import threading

import numpy as np
import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation import SynthIDTextWatermarkingConfig, WatermarkingConfig
from transformers.generation import logits_process as lp

from hf_dspark import DSparkDrafter, mark_stateless
from hf_dspark.decoding import processors
from hf_dspark.decoding.options import DecodingOptions
from tests.conftest import tiny_target
from tests.helpers import drafter_for, oracle_drafts
from tests.sampling_check import ALPHA, exact_distribution, fit_pvalue

# Processors no DSpark target can meet: their models are encoder-decoders, audio codecs or batch-2 guidance,
# all refused before any processor runs (batch > 1, UnsupportedArchitectureError). A user passing one anyway
# gets the unknown-processor treatment (snapshotted).
OTHER_MODELS = {lp.WhisperTimeStampLogitsProcessor, lp.WhisperNoSpeechDetection, lp.AlternatingCodebooksLogitsProcessor,
                lp.BarkEosPrioritizerLogitsProcessor, lp.ClassifierFreeGuidanceLogitsProcessor,
                lp.DiaClassifierFreeGuidanceLogitsProcessor, lp.DiaEOSChannelFilterLogitsProcessor,
                lp.DiaEOSDelayPatternLogitsProcessor}


def test_every_transformers_processor_has_a_verdict():
    """A processor added to transformers fails here until it is audited into PURE, STATE or OTHER_MODELS."""
    shipped = {c for _, c in inspect.getmembers(lp, inspect.isclass)
               if issubclass(c, lp.LogitsProcessor) and c is not lp.LogitsProcessor and c.__module__ == lp.__name__}
    judged = processors.PURE | set(processors.STATE) | OTHER_MODELS
    assert shipped - judged == set(), "processors without a verdict in decoding/processors.py and docs/lossless.md"
    assert not processors.PURE & set(processors.STATE)
    doc = open("docs/lossless.md").read()
    for cls in shipped:
        assert cls.__name__ in doc, f"docs/lossless.md gives no verdict for {cls.__name__}"


class CallCounter(LogitsProcessor):
    """A user's stateful processor: the call count picks a token to boost."""

    def __init__(self, vocab: int, bias: float = 50.0):
        self.calls, self.vocab, self.bias = 0, vocab, bias

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, (self.calls * 7) % self.vocab] += self.bias
        self.calls += 1
        return scores


class RunningSum(LogitsProcessor):
    """A path-dependent stateful processor: the sum of every call's last token picks the token to boost."""

    def __init__(self, vocab: int, bias: float):
        self.total, self.vocab, self.bias = 0, vocab, bias

    def __call__(self, input_ids, scores):
        self.total += int(input_ids[0, -1])
        scores = scores.clone()
        scores[:, self.total % self.vocab] += self.bias
        return scores


class RunningSumOracle(LogitsProcessor):
    """RunningSum without state, for batched prefixes of a prompt of `prompt_len` tokens (the exact law)."""

    def __init__(self, vocab: int, bias: float, prompt_len: int):
        self.vocab, self.bias, self.prompt_len = vocab, bias, prompt_len

    def __call__(self, input_ids, scores):
        total = input_ids[:, self.prompt_len - 1:].sum(-1) % self.vocab
        return scores + self.bias * torch.nn.functional.one_hot(total, self.vocab)


PROMPT = torch.tensor([[5, 9, 11, 3, 7, 20, 33, 8]])
OPTIONS = {"all": DecodingOptions("all", ngram_drafts=False), "defaults": DecodingOptions()}
STATEFUL = {
    "guidance_scale": lambda: dict(guidance_scale=1.5),
    "synthid": lambda: dict(watermarking_config=SynthIDTextWatermarkingConfig(keys=[1, 2, 3, 4], ngram_len=3)),
    "watermark": lambda: dict(watermarking_config=WatermarkingConfig(context_width=2)),
    "counter": lambda: dict(logits_processor=LogitsProcessorList([CallCounter(64)])),
    "running-sum": lambda: dict(logits_processor=LogitsProcessorList([RunningSum(64, 8.0)])),
}


@pytest.mark.parametrize("options", list(OPTIONS))
@pytest.mark.parametrize("name", list(STATEFUL))
def test_greedy_identity_with_stateful_processors(name, options):
    model = tiny_target(vocab=64, hidden=64, layers=4)
    drafter = DSparkDrafter.from_target(model, mask_token_id=63, block_size=5)
    drafter.options = OPTIONS[options]
    plain_kw, spec_kw = STATEFUL[name](), STATEFUL[name]()
    plain = model.generate(PROMPT, max_new_tokens=24, do_sample=False, **plain_kw)
    with oracle_drafts(plain, p_right=0.7):  # every acceptance length occurs
        spec = model.generate(PROMPT, max_new_tokens=24, do_sample=False, assistant_model=drafter, **spec_kw)
    assert spec.tolist() == plain.tolist()
    assert any(r.verified > r.accepted for r in drafter.last_stats.rounds), "no round rejected a draft"
    if "logits_processor" in plain_kw:  # the user's own object ends in the state plain generate leaves it in
        assert vars(spec_kw["logits_processor"][0]) == vars(plain_kw["logits_processor"][0])


def test_stateful_processors_are_kept_from_the_drafter():
    counter = CallCounter(64)
    draft, rollbacks = processors.guard(LogitsProcessorList([lp.TemperatureLogitsWarper(0.5), counter]))
    assert [type(p) for p in draft] == [lp.TemperatureLogitsWarper]
    assert [r.processor for r in rollbacks] == [counter]
    marked = mark_stateless(CallCounter(64))
    draft, rollbacks = processors.guard(LogitsProcessorList([marked]))
    assert list(draft) == [marked] and rollbacks == []


class Locked(LogitsProcessor):
    def __init__(self):
        self.lock = threading.Lock()  # cannot be copied

    def __call__(self, input_ids, scores):
        return scores


def test_a_processor_that_cannot_be_snapshotted_is_refused_by_name():
    model = tiny_target()
    drafter = DSparkDrafter.from_target(model, mask_token_id=63, block_size=3)
    with pytest.raises(ValueError, match=r"snapshot the state of the logits processor Locked.*mark_stateless"):
        model.generate(PROMPT, max_new_tokens=5, assistant_model=drafter, logits_processor=LogitsProcessorList([Locked()]))
    plain = model.generate(PROMPT, max_new_tokens=5, logits_processor=LogitsProcessorList([Locked()]))
    marked = model.generate(PROMPT, max_new_tokens=5, assistant_model=drafter,
                            logits_processor=LogitsProcessorList([mark_stateless(Locked())]))
    assert marked.tolist() == plain.tolist()


V, STEPS, N = 8, 5, 600
SMALL_PROMPT = torch.tensor([[1, 5, 2]])


def _sampling_setup():
    from tests.sampling_check import setup

    return setup(head="markov")


@contextlib.contextmanager
def no_rollback():
    """A deliberately wrong verifier: stateful processors keep the state left by rejected drafts."""
    real = processors.Rollback.restore
    processors.Rollback.restore = lambda self, committed: self.snapshots.clear()
    try:
        yield
    finally:
        processors.Rollback.restore = real


def _running_sum_pvalue() -> float:
    model, drafter = _sampling_setup()
    exact = exact_distribution(model, SMALL_PROMPT, STEPS,
                               LogitsProcessorList([RunningSumOracle(V, 3.0, SMALL_PROMPT.shape[1])]))
    torch.manual_seed(123)
    seqs = [model.generate(SMALL_PROMPT, do_sample=True, max_new_tokens=STEPS, min_new_tokens=STEPS,
                           assistant_model=drafter,
                           logits_processor=LogitsProcessorList([RunningSum(V, 3.0)]))[0, 3:].tolist()
            for _ in range(N)]
    assert any(r.verified > r.accepted for r in drafter.last_stats.rounds)
    return fit_pvalue(np.array(seqs), exact)


def test_sampling_with_a_stateful_processor_follows_the_target_law():
    p = _running_sum_pvalue()
    assert p >= ALPHA, f"samples under a stateful processor deviate from the target's law (p={p:.2e})"


def test_negative_control_without_rollback_is_rejected():
    with no_rollback():
        p = _running_sum_pvalue()
    assert p < ALPHA, f"the G-test failed to reject a verifier that keeps rejected drafts' state (p={p:.2e})"


def test_sampling_with_a_counter_follows_the_target_law():
    """A call-count processor's state is the same on every path: the exact law applies it at the step's count."""
    model, drafter = _sampling_setup()

    class AtStep(LogitsProcessor):  # CallCounter's effect at call t = prefix length - prompt length
        def __call__(self, input_ids, scores):
            scores = scores.clone()
            scores[:, ((input_ids.shape[1] - SMALL_PROMPT.shape[1]) * 7) % V] += 3.0
            return scores

    exact = exact_distribution(model, SMALL_PROMPT, STEPS, LogitsProcessorList([AtStep()]))
    torch.manual_seed(123)
    seqs = [model.generate(SMALL_PROMPT, do_sample=True, max_new_tokens=STEPS, min_new_tokens=STEPS,
                           assistant_model=drafter,
                           logits_processor=LogitsProcessorList([CallCounter(V, 3.0)]))[0, 3:].tolist()
            for _ in range(N)]
    p = fit_pvalue(np.array(seqs), exact)
    assert p >= ALPHA, f"samples under a call counter deviate from the target's law (p={p:.2e})"


class GuidanceOracle(LogitsProcessor):
    """UnbatchedClassifierFreeGuidanceLogitsProcessor without state, for batched prefixes: its unconditional pass
    sees the prompt's last token and every token generated since."""

    def __init__(self, model, scale: float, prompt_len: int):
        self.model, self.scale, self.prompt_len = model, scale, prompt_len

    @torch.no_grad()
    def __call__(self, input_ids, scores):
        cond = torch.log_softmax(scores, dim=-1)
        uncond = torch.log_softmax(self.model(input_ids[:, self.prompt_len - 1:]).logits[:, -1].float(), dim=-1)
        return self.scale * (cond - uncond) + uncond


def test_sampling_with_guidance_scale_follows_the_target_law():
    model, drafter = _sampling_setup()
    exact = exact_distribution(model, SMALL_PROMPT, STEPS,
                               LogitsProcessorList([GuidanceOracle(model, 4.0, SMALL_PROMPT.shape[1])]))
    torch.manual_seed(123)
    seqs = [model.generate(SMALL_PROMPT, do_sample=True, max_new_tokens=STEPS, min_new_tokens=STEPS,
                           assistant_model=drafter, guidance_scale=4.0)[0, 3:].tolist() for _ in range(N)]
    assert any(r.verified > r.accepted for r in drafter.last_stats.rounds)
    p = fit_pvalue(np.array(seqs), exact)
    assert p >= ALPHA, f"samples under guidance_scale deviate from the target's law (p={p:.2e})"
    with no_rollback():  # the same test rejects a verifier that keeps the unconditional pass's rejected tokens
        torch.manual_seed(123)
        wrong = [model.generate(SMALL_PROMPT, do_sample=True, max_new_tokens=STEPS, min_new_tokens=STEPS,
                                assistant_model=drafter, guidance_scale=4.0)[0, 3:].tolist() for _ in range(N)]
    assert fit_pvalue(np.array(wrong), exact) < ALPHA


def test_logits_processor_leaves_scores_bit_identical():
    from hf_dspark import DSparkLogitsProcessor

    obs = DSparkLogitsProcessor()
    obs.begin_round(torch.tensor([[1, 2, 3, 4]]), 2)
    scores = torch.randn(1, 64)
    before = scores.clone()
    out = obs(torch.tensor([[1, 2]]), scores)
    assert out is scores and torch.equal(out, before)
    assert set(obs.target_probs) == {1} and 0 < obs.target_probs[1] < 1


def test_nan_target_logits_are_a_named_error(llama):
    drafter = drafter_for(llama)
    hook = llama.lm_head.register_forward_hook(lambda mod, inp, out: out * float("nan"))
    try:
        with pytest.raises(ValueError, match="NaN"):
            llama.generate(PROMPT, max_new_tokens=5, assistant_model=drafter)
    finally:
        hook.remove()


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("poison", ["+inf everywhere", "+inf on one token", "NaN on one token"])
def test_non_finite_target_logits_are_named(llama, poison, do_sample):
    drafter = drafter_for(llama)
    value = float("nan") if poison.startswith("NaN") else float("inf")
    cols = slice(None) if poison.endswith("everywhere") else slice(3, 4)

    def hook(module, args, out):
        out = out.clone()
        out[..., cols] = value
        return out

    handle = llama.lm_head.register_forward_hook(hook)
    try:
        with pytest.raises(ValueError, match=r"NaN/\+inf"):
            llama.generate(PROMPT, max_new_tokens=5, do_sample=do_sample, assistant_model=drafter)
    finally:
        handle.remove()
