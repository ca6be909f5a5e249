"""The drafter's default options are what the docs say they are: the best lossless configuration the package
knows ("auto": scheduler + draft gate, with n-gram drafts), not "all"."""

import re
from pathlib import Path

from hf_dspark import DSparkDrafter, DecodingOptions
from tests.conftest import tiny_target

ROOT = Path(__file__).resolve().parents[2]


def test_default_options_are_the_documented_ones():
    default = DecodingOptions()
    assert (default.verify_policy, default.ngram_drafts, default.device_profile) == ("auto", True, None)
    assert DSparkDrafter.from_target(tiny_target(), block_size=3, target_layer_ids=[0, 2]).options == default
    # the README's and docs/scheduler.md's statement of the default, word for word
    claim = 'verify_policy = "auto"` and `ngram_drafts = True'
    for doc in ("README.md", "docs/scheduler.md"):
        text = " ".join((ROOT / doc).read_text().split())
        assert "by default" in text.lower() and claim in text, f"{doc} does not state the default options"
    # and what the docs' text forms parse to
    assert DecodingOptions.parse("auto+ngram") == default
    assert DecodingOptions.parse("all") == DecodingOptions("all", ngram_drafts=False)
    assert re.search(r'`"all"`[^.]*slower than plain', " ".join((ROOT / "docs/scheduler.md").read_text().split()))


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
    drafter.verify_policy = 1  # the drafter's own default: one draft verified per round
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
