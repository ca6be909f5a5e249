"""The drafter's default options are what the docs say they are: the best lossless configuration the package
knows ("auto": scheduler + draft gate, with n-gram drafts), not "all"."""

import re
from pathlib import Path

import pytest

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


def test_auto_loop_runs_the_compiled_loop_only_where_this_machine_set_it_up(tmp_path, monkeypatch):
    """loop "auto" (the default) is "assisted" until the compiled loop's device profile is saved for this setup
    (measuring it compiles and saves the graph), then "compiled"; a device_profile passed names its own loop; a
    named loop is kept. Another setup (dtype) is not set up by this one's profile."""
    import torch

    from hf_dspark.decoding.profile import DeviceProfile, profile_key, profile_path

    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))
    model = tiny_target()
    drafter = DSparkDrafter.from_target(model, block_size=3, target_layer_ids=[0, 2])
    auto = DecodingOptions()
    assert auto.loop == "auto" and auto.concrete(model, drafter).loop == "assisted"
    assert DecodingOptions(loop="static").concrete(model, drafter).loop == "static"
    key = profile_key(model, drafter, "compiled")
    profile = DeviceProfile(key, verify_time=[1.0] * 4, draft_time=0.1, rollback_time=0.0, cache_len=8, warmup=0,
                            repeats=1)
    assert DecodingOptions(device_profile=profile).concrete(model, drafter).loop == "compiled"
    profile.save(profile_path(key))
    resolved = auto.concrete(model, drafter)
    assert resolved == DecodingOptions(loop="compiled") and auto.loop == "auto"  # a copy: the drafter's stay "auto"
    assert DecodingOptions(loop="assisted").concrete(model, drafter).loop == "assisted"
    assert auto.concrete(model.to(torch.bfloat16), drafter.to(torch.bfloat16)).loop == "assisted"


@pytest.mark.parametrize("change", ["hf_dspark", "transformers", "cpu"])
def test_auto_loop_does_not_choose_graphs_this_install_cannot_load(change, tmp_path, monkeypatch):
    """A compiled profile saved by another version (or on another CPU sharing the storage folder) is not a set-up
    machine: its graphs are keyed by what changed, so choosing the compiled loop would compile in the next call.
    The assisted loop's profile is not affected."""
    import transformers

    import hf_dspark
    from hf_dspark.decoding import machine
    from hf_dspark.decoding.profile import DeviceProfile, profile_key, profile_path
    from tests.decoding.test_machine import ZEN4

    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))
    monkeypatch.setattr(machine, "read_cpuinfo", lambda: ZEN4)
    model = tiny_target()
    drafter = DSparkDrafter.from_target(model, block_size=3, target_layer_ids=[0, 2])
    for loop in ("compiled", "assisted"):
        key = profile_key(model, drafter, loop)
        DeviceProfile(key, verify_time=[1.0] * 4, draft_time=0.1, rollback_time=0.0, cache_len=8, warmup=0,
                      repeats=1).save(profile_path(key))
    assisted = profile_path(profile_key(model, drafter))
    assert DecodingOptions().concrete(model, drafter).loop == "compiled"
    if change == "cpu":  # the same name and the flags the profile's device keys by, one more ISA flag
        monkeypatch.setattr(machine, "read_cpuinfo", lambda: ZEN4.replace("avx512_bf16", "avx512_bf16 avx512_fp16"))
        assert machine.cpu_info() == machine.cpu_info(ZEN4)
    else:
        module = {"hf_dspark": hf_dspark, "transformers": transformers}[change]
        monkeypatch.setattr(module, "__version__", module.__version__ + ".post1")
    assert DecodingOptions().concrete(model, drafter).loop == "assisted"
    assert profile_path(profile_key(model, drafter)) == assisted
