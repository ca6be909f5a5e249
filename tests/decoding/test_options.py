"""The drafter's default options are what the docs say they are: the best lossless configuration the package
knows ("auto": scheduler + draft gate, with n-gram drafts), not "all"."""

import re
from pathlib import Path

from hf_dspark import DecodingOptions, DSparkDrafter
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
