"""transformers.pipeline("text-generation") with assistant_model=drafter routes to DSpark and answers exactly what
the plain pipeline answers (greedy, float32), chat messages included."""

import pytest
import torch
from transformers import pipeline

from hf_dspark import DSparkDrafter, enable
from hf_dspark.decoding.options import DecodingOptions
from tests.conftest import tiny_target


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))  # the default options measure a profile there


@pytest.mark.parametrize("options", ["default", "all"])
def test_pipeline_greedy_equals_plain_pipeline(char_tokenizer, options):
    tok = char_tokenizer
    tok.chat_template = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}assistant "
    model = enable(tiny_target())
    torch.manual_seed(1)
    drafter = DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 2], markov_rank=8)
    if options == "all":
        drafter.options = DecodingOptions("all", ngram_drafts=False)
    calls = []
    real = type(drafter).draft
    drafter.draft = lambda *a, **kw: calls.append(1) or real(drafter, *a, **kw)  # proof DSpark ran
    pipe = pipeline("text-generation", model=model, tokenizer=tok)
    msgs = [{"role": "user", "content": "hello there hello there"}]
    gen = dict(do_sample=False, max_new_tokens=30)
    plain = pipe(msgs, **gen)
    spec = pipe(msgs, assistant_model=drafter, **gen)
    assert spec == plain
    assert drafter.last_stats is not None and drafter.last_stats.new_tokens == 30
    assert len(drafter.last_stats.rounds) > 0
    if options == "all":
        assert calls  # under verify-all every round without an n-gram match runs the drafter
