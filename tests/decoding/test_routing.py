"""How generate(assistant_model=drafter) reaches DSpark (decoding/routing.py): `enable`, options per call
(`dspark_options=`), the requests assisted decoding cannot honour refused by name (`_validate_request` and the
checks of `_assisted_decoding`), other assistants left to transformers, and stop strings / stopping criteria made
exact inside an accepted block (StopScanner, the streamer it wraps)."""

import pytest
import torch
from transformers import DynamicCache, StaticCache, StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer
from transformers.generation.stopping_criteria import MaxLengthCriteria

from hf_dspark import DecodingOptions, DSparkDrafter, enable
from hf_dspark.decoding.routing import StopScanner
from tests.conftest import tiny_target
from tests.helpers import PROMPT, assert_identical, drafter_for, oracle_drafts


def _pair():
    import torch

    model = tiny_target()
    torch.manual_seed(0)
    return model, DSparkDrafter.from_target(model, block_size=3, target_layer_ids=[0, 2])


def test_options_per_call_leave_the_drafters_own_untouched():
    """generate(..., dspark_options=...) runs that call with those options (here: verify every draft, no n-gram
    drafts) and leaves `drafter.options` as it was; the next call without them uses the drafter's again; greedy
    output equals plain generate either way."""
    import torch

    model, drafter = _pair()
    drafter.options.verify_policy = 1  # the drafter's own default: one draft verified per round
    prompt = torch.tensor([[5, 17, 3, 42, 8, 11, 5, 17, 3]])
    plain = model.generate(prompt, do_sample=False, max_new_tokens=20)
    out = model.generate(prompt, do_sample=False, max_new_tokens=20, assistant_model=drafter,
                         dspark_options=DecodingOptions("all", ngram_drafts=False))
    assert out.tolist() == plain.tolist()
    rounds = [r for r in drafter.last_stats.rounds if r.drafted]
    assert rounds and all(r.verified == r.drafted for r in rounds) and max(r.verified for r in rounds) > 1
    assert all(r.source == "dspark" for r in drafter.last_stats.rounds)
    assert drafter.options == DecodingOptions(1)  # untouched
    out = model.generate(prompt, do_sample=False, max_new_tokens=20, assistant_model=drafter)
    assert out.tolist() == plain.tolist()
    assert max(r.verified for r in drafter.last_stats.rounds) == 1


def test_bad_per_call_options_are_named():
    import pytest
    import torch

    model, drafter = _pair()
    prompt = torch.tensor([[5, 17, 3]])
    with pytest.raises(TypeError, match="DecodingOptions"):
        model.generate(prompt, max_new_tokens=2, assistant_model=drafter, dspark_options="all")
    with pytest.raises(ValueError, match="assistant_model"):
        model.generate(prompt, max_new_tokens=2, dspark_options=DecodingOptions())


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(num_beams=2), NotImplementedError, "beam"),
    (dict(prompt_lookup_num_tokens=3), ValueError, "prompt_lookup_num_tokens"),
    (dict(num_assistant_tokens=5), ValueError, "num_assistant_tokens"),
    (dict(assistant_confidence_threshold=0.2), ValueError, "assistant_confidence_threshold"),
    (dict(cache_implementation="offloaded"), NotImplementedError, "offloaded"),
    (dict(max_new_tokens=300), ValueError, "context"),
])
def test_unsupported_requests_are_named(llama, kwargs, error, message):
    drafter = drafter_for(llama)
    kwargs.setdefault("max_new_tokens", 5)
    with pytest.raises(error, match=message):
        llama.generate(PROMPT, assistant_model=drafter, **kwargs)


def test_batch_and_padding_are_refused(llama):
    drafter = drafter_for(llama)
    with pytest.raises(NotImplementedError, match="batch of 2"):
        llama.generate(PROMPT.repeat(2, 1), max_new_tokens=5, assistant_model=drafter)
    mask = torch.ones_like(PROMPT)
    mask[0, 0] = 0
    with pytest.raises(NotImplementedError, match="padded"):
        llama.generate(PROMPT, attention_mask=mask, max_new_tokens=5, assistant_model=drafter)


def test_a_pad_token_inside_the_prompt_is_named_and_ones_make_it_a_token(llama):
    """generate() derives a mask from pad_token_id: a prompt holding that id is not 'padded' by the user; the
    refusal says why, and an explicit all-ones mask gives plain's output."""
    drafter = drafter_for(llama)
    pad = int(PROMPT[0, 2])
    with pytest.raises(NotImplementedError, match=f"holds the pad token id {pad} at positions \\[2\\]"):
        llama.generate(PROMPT, max_new_tokens=5, pad_token_id=pad, assistant_model=drafter)
    ones = torch.ones_like(PROMPT)
    plain = llama.generate(PROMPT, attention_mask=ones, max_new_tokens=8, pad_token_id=pad, do_sample=False)
    spec = llama.generate(PROMPT, attention_mask=ones, max_new_tokens=8, pad_token_id=pad, do_sample=False,
                          assistant_model=drafter)
    assert spec.tolist() == plain.tolist()


def test_drafter_bound_to_another_model(llama):
    drafter = drafter_for(tiny_target(seed=5))
    with pytest.raises(RuntimeError, match="not enabled"):  # a target nobody enabled: transformers' stock path
        llama.generate(PROMPT, max_new_tokens=5, assistant_model=drafter)
    enable(llama)
    with pytest.raises(ValueError, match="bound to another model"):
        llama.generate(PROMPT, max_new_tokens=5, assistant_model=drafter)


def test_other_assistants_still_use_transformers(llama):
    """Prompt lookup and ordinary assistant models are untouched by the routing."""
    ids = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4, 1, 2]])
    drafter_for(llama)  # enables the class swap
    plain = llama.generate(ids, do_sample=False, max_new_tokens=12)
    assert llama.generate(ids, do_sample=False, max_new_tokens=12, prompt_lookup_num_tokens=3).tolist() == plain.tolist()
    small = tiny_target(layers=1, seed=3)
    assert llama.generate(ids, do_sample=False, max_new_tokens=12, assistant_model=small).tolist() == plain.tolist()


def test_output_attentions_in_a_dict_is_refused_by_name(llama):
    drafter = drafter_for(llama)
    with pytest.raises(NotImplementedError, match="output_attentions=True with return_dict_in_generate=True"):
        llama.generate(PROMPT, max_new_tokens=5, assistant_model=drafter, output_attentions=True,
                       return_dict_in_generate=True)


def test_use_cache_false_is_refused_by_name(llama):
    drafter = drafter_for(llama)
    with pytest.raises(ValueError, match="use_cache=False"):
        llama.generate(PROMPT, max_new_tokens=5, assistant_model=drafter, use_cache=False)


def test_unbound_drafter_is_not_said_to_be_bound_to_another_model(llama, tmp_path):
    drafter_for(llama).save_pretrained(tmp_path)
    loose = DSparkDrafter.from_pretrained(tmp_path)  # no target=
    with pytest.raises(ValueError, match="not bound to a target"):
        llama.generate(PROMPT, max_new_tokens=5, assistant_model=loose)


def test_target_cast_after_binding_is_refused_at_generate():
    model = tiny_target()
    drafter = drafter_for(model)
    model.to(torch.bfloat16)
    with pytest.raises(ValueError, match="drafter dtype torch.float32 != target dtype torch.bfloat16"):
        model.generate(PROMPT, max_new_tokens=5, assistant_model=drafter)
    drafter.to(torch.bfloat16)  # what the message asks for: then it runs
    assert model.generate(PROMPT, max_new_tokens=5, assistant_model=drafter).shape[1] == PROMPT.shape[1] + 5


def test_assistant_tokenizer_is_refused(llama, char_tokenizer):
    """A DSpark drafter reads the target's token ids (its embedding and LM head are the target's), so a second
    tokenizer can only mean a mismatch; a different vocabulary size is refused at bind (tests/model/test_binding.py)."""
    drafter = drafter_for(llama)
    with pytest.raises(ValueError, match="share the target's tokenizer"):
        llama.generate(PROMPT, max_new_tokens=5, assistant_model=drafter, tokenizer=char_tokenizer,
                       assistant_tokenizer=char_tokenizer)


@pytest.mark.parametrize("gamma", [0, 100])
def test_block_size_edited_after_building_is_named_at_generate(llama, gamma):
    drafter = drafter_for(llama)
    drafter.config.block_size = gamma
    with pytest.raises(ValueError, match="block_size"):
        llama.generate(PROMPT, max_new_tokens=20, assistant_model=drafter)


def test_prefilled_cache_is_refused(llama):
    """transformers 5.24's assisted loop re-feeds the prompt on top of a pre-filled cache (its own prompt lookup
    and assistant models then return wrong tokens): DSpark names it instead of losing identity."""
    drafter = drafter_for(llama)
    cache = DynamicCache(config=llama.config)
    with torch.no_grad():
        llama(PROMPT[:, :-1], past_key_values=cache)
    with pytest.raises(NotImplementedError, match="pre-filled cache"):
        llama.generate(PROMPT, do_sample=False, max_new_tokens=10, past_key_values=cache, assistant_model=drafter)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_empty_cache_objects_stay_exact(llama, kind):
    """An empty cache object passed in is fine: a DynamicCache, and a StaticCache (rolled back by moving its position;
    `cache_implementation="static"` too: tests/decoding/test_static_cache.py)."""
    drafter = drafter_for(llama)
    plain = llama.generate(PROMPT, do_sample=False, max_new_tokens=30)
    cache = DynamicCache(config=llama.config) if kind == "dynamic" else StaticCache(config=llama.config, max_cache_len=64)
    with oracle_drafts(plain):
        spec = llama.generate(PROMPT, do_sample=False, max_new_tokens=30, past_key_values=cache, assistant_model=drafter)
    assert spec.tolist() == plain.tolist()
    assert len(drafter.last_stats.acceptance_histogram) > 2  # several acceptance lengths, so crops happened


def test_generation_up_to_exactly_the_context_limit(llama):
    context = llama.config.max_position_embeddings  # 256
    drafter = drafter_for(llama)
    new = context - PROMPT.shape[1]
    plain = llama.generate(PROMPT, do_sample=False, max_new_tokens=new, min_new_tokens=new)
    with oracle_drafts(plain):
        spec = llama.generate(PROMPT, do_sample=False, max_new_tokens=new, min_new_tokens=new, assistant_model=drafter)
    assert spec.shape[1] == context and spec.tolist() == plain.tolist()


@pytest.mark.parametrize("prompt_len", [256, 300])
def test_prompt_at_or_past_the_context_is_named(llama, prompt_len):
    drafter = drafter_for(llama)
    prompt = torch.arange(prompt_len).remainder(60)[None]
    with pytest.raises(ValueError, match="context is 256"):
        llama.generate(prompt, max_new_tokens=1, assistant_model=drafter)


class StopAfterToken(StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


class StopAtLength(StoppingCriteria):
    def __init__(self, length):
        self.length = length

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool)


@pytest.mark.parametrize("ngram", [False, True], ids=["drafter", "with-ngrams"])
def test_custom_stopping_criteria_stop_exactly(llama, ngram):
    free = llama.generate(PROMPT, do_sample=False, max_new_tokens=40)
    token = int(free[0, PROMPT.shape[1] + 12])
    drafter = drafter_for(llama)
    drafter.options.ngram_drafts = ngram
    for crit in (StopAfterToken(token), StopAtLength(PROMPT.shape[1] + 10)):
        out = assert_identical(llama, drafter, max_new_tokens=40, stopping_criteria=StoppingCriteriaList([crit]))
        assert out.shape[1] < free.shape[1]


@pytest.mark.parametrize("ngram", [False, True], ids=["drafter", "with-ngrams"])
def test_stop_strings_stop_exactly(llama, char_tokenizer, ngram):
    free = llama.generate(PROMPT, do_sample=False, max_new_tokens=40)
    a, b = (int(t) for t in free[0, PROMPT.shape[1] + 14 : PROMPT.shape[1] + 16])
    stop = char_tokenizer.decode([a, b])
    drafter = drafter_for(llama)
    drafter.options.ngram_drafts = ngram
    out = assert_identical(llama, drafter, max_new_tokens=40, stop_strings=[stop], tokenizer=char_tokenizer)
    assert out.shape[1] < free.shape[1]


def test_dict_output_is_truncated_at_a_stop(llama):
    free = llama.generate(PROMPT, do_sample=False, max_new_tokens=30)
    crit = StoppingCriteriaList([StopAtLength(PROMPT.shape[1] + 9)])
    kw = dict(do_sample=False, max_new_tokens=30, stopping_criteria=crit, return_dict_in_generate=True, output_scores=True)
    plain = llama.generate(PROMPT, **kw)
    drafter = drafter_for(llama)
    with oracle_drafts(free, p_right=1.0):
        spec = llama.generate(PROMPT, assistant_model=drafter, **kw)
    assert spec.sequences.tolist() == plain.sequences.tolist()
    assert len(spec.scores) == len(plain.scores) == 9
    assert spec.past_key_values.get_seq_length() == plain.past_key_values.get_seq_length()


def test_streamer_yields_the_final_text(llama, char_tokenizer):
    free = llama.generate(PROMPT, do_sample=False, max_new_tokens=40)
    drafter = drafter_for(llama)
    for stops in (None, [char_tokenizer.decode(free[0, PROMPT.shape[1] + 7 : PROMPT.shape[1] + 9])]):
        streamer = TextIteratorStreamer(char_tokenizer, skip_prompt=True)
        with oracle_drafts(free):
            out = llama.generate(PROMPT, do_sample=False, max_new_tokens=40, assistant_model=drafter,
                                 streamer=streamer, stop_strings=stops, tokenizer=char_tokenizer)
        streamed = "".join(streamer)
        assert streamed == char_tokenizer.decode(out[0, PROMPT.shape[1]:])
        if stops:
            assert out.shape[1] < free.shape[1]


def test_enable_swaps_the_class_once_and_keeps_its_name():
    model = tiny_target()
    cls = type(model)
    assert enable(model) is model
    swapped = type(model)
    assert swapped is not cls and issubclass(swapped, cls) and swapped.__name__ == cls.__name__
    assert enable(model) is model and type(model) is swapped  # idempotent
    with pytest.raises(ValueError, match="cannot generate"):
        enable(torch.nn.Linear(2, 2))


def test_stop_scanner_stops_at_the_first_prefix_a_criterion_stops():
    """StopScanner on hand-made rounds: EOS and max-length criteria stay transformers' own; a custom criterion is
    checked on every prefix a round added, not only on the round's end, and truncate cuts right after the stop."""
    prompt = torch.tensor([[1, 2]])
    assert StopScanner(StoppingCriteriaList([MaxLengthCriteria(50)]), prompt).checks == []
    scanner = StopScanner(StoppingCriteriaList([MaxLengthCriteria(50), StopAfterToken(7)]), prompt)
    assert len(scanner.checks) == 1
    first = torch.tensor([[1, 2, 3, 4]])
    assert scanner.scan(first) is None and not scanner(first, None).any() and scanner.truncate(first) is first
    second = torch.tensor([[1, 2, 3, 4, 7, 5, 6]])  # the stop token inside the round
    assert scanner(second, None).all() and scanner.stop_len == 5
    assert scanner.truncate(second).tolist() == [[1, 2, 3, 4, 7]]
