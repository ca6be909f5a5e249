"""Device profiles: measuring on a tiny random Llama, JSON round trip, keys that refuse another setup."""

import dataclasses

import pytest
import torch

from hf_dspark import DSparkDrafter
from hf_dspark.decoding import machine
from hf_dspark.decoding import profile as prof
from hf_dspark.decoding.profile import (
    DeviceProfile,
    ProfileMismatchError,
    break_even_survival,
    format_profile,
    get_profile,
    load_profile,
    measure_profile,
    profile_key,
)
from hf_dspark.decoding.scheduler import max_verified
from tests import arch_matrix
from tests.conftest import tiny_target
from tests.decoding.test_machine import ZEN3, ZEN4


@pytest.fixture
def pair():
    model = tiny_target()
    torch.manual_seed(1)
    return model, DSparkDrafter.from_target(model, block_size=3, target_layer_ids=[0, 2], markov_rank=8)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))


def test_measure_on_tiny_llama(pair):
    model, drafter = pair
    p = measure_profile(model, drafter, cache_len=32, warmup=1, repeats=3)
    assert len(p.verify_time) == drafter.config.block_size + 1 == p.block_size + 1
    assert all(t > 0 for t in p.verify_time) and p.draft_time > 0 and p.rollback_time >= 0
    assert p.key == profile_key(model, drafter)
    assert 0 <= p.verify_length(torch.tensor([0.9, 0.9, 0.9])) <= 3
    # the draft was timed at the size decoding drafts: at least what the scheduler can verify on this profile
    assert 1 <= p.draft_tokens <= p.block_size
    assert max_verified(p.verify_time, p.round_overhead) <= p.draft_tokens
    text = format_profile(p)
    assert "break-even" in text and len(text.splitlines()) == 4 + 4 + 1
    assert p.linear in ("stock", "weight_major") and set(p.linear_ab) == {"stock", "weight_major"}


def test_measuring_leaves_the_global_rng_alone(pair):
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    measure_profile(*pair, cache_len=8, warmup=0, repeats=1)
    assert torch.equal(torch.rand(3), expected)


def test_time_forwards_times_what_it_was_asked_on_a_restored_cache():
    """The one timing loop of the device profile and of decode_dtype: each length timed `repeats` times, the
    prefill timed once, and the global RNG untouched (ids come from its own generator)."""
    model = tiny_target()  # built before seeding: building draws from the global RNG
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    timed = prof.time_forwards(model, [1, 3], cache_len=12, warmup=1, repeats=4, taps=[1])
    assert torch.equal(torch.rand(3), expected)
    assert sorted(timed.forward) == [1, 3] and all(len(ts) == 4 for ts in timed.forward.values())
    assert timed.prefill > 0 and len(timed.rollback) == 8 and min(min(timed.forward.values())) > 0


def test_time_forwards_on_the_static_loop_pads_and_restores_the_cache():
    """DSpark's own loop is timed as it runs: its StaticVerifier, forwards padded to loop.LENGTHS, the cache's
    position moved back after each."""
    model = tiny_target()
    timed = prof.time_forwards(model, [1, 3], cache_len=12, warmup=1, repeats=2, taps=[1], loop="static")
    assert sorted(timed.forward) == [1, 3] and all(len(ts) == 2 for ts in timed.forward.values())
    assert model._dspark_static_cache[0].get_seq_length() == 12  # the loop's own cache, rolled back


def test_each_loop_has_its_profile_and_decoding_uses_the_one_that_runs(pair):
    from hf_dspark import DecodingOptions

    model, drafter = pair
    static = get_profile(model, drafter, loop="static", cache_len=8, warmup=0, repeats=1)
    assisted = get_profile(model, drafter, cache_len=8, warmup=0, repeats=1)
    assert (static.key.loop, assisted.key.loop) == ("static", "assisted")
    assert prof.profile_path(static.key) != prof.profile_path(assisted.key)
    assert "static loop" in format_profile(static)
    ids = torch.tensor([[1, 5, 9, 2]])
    kw = dict(assistant_model=drafter, max_new_tokens=6, do_sample=False)
    model.generate(ids, **kw, dspark_options=DecodingOptions(loop="static", device_profile=static))
    with pytest.raises(ProfileMismatchError, match="loop"):  # a profile of the other loop is refused by name
        model.generate(ids, **kw, dspark_options=DecodingOptions(loop="static", device_profile=assisted))
    # a request the static loop does not take runs on the assisted loop, under the assisted loop's profile
    model.generate(ids, **kw, return_dict_in_generate=True, output_hidden_states=True,
                   dspark_options=DecodingOptions(loop="static", device_profile=assisted))
    assert drafter.last_stats.loop == "assisted" and drafter.last_stats.fallback


def test_save_load_round_trip(pair, tmp_path):
    p = measure_profile(*pair, cache_len=8, warmup=0, repeats=1)
    path = p.save(tmp_path / "p.json")
    q = load_profile(path, expect=p.key)
    assert q == p
    assert p.save().parent.name == "profiles"  # the default place is the cache


def test_another_setup_is_not_silently_reused(pair, tmp_path):
    model, drafter = pair
    p = measure_profile(model, drafter, cache_len=8, warmup=0, repeats=1)
    path = p.save(tmp_path / "p.json")
    for field, value in [("device", "NVIDIA H100"), ("dtype", "bfloat16"), ("torch", "9.9"), ("config_hash", "0")]:
        other = dataclasses.replace(p.key, **{field: value})
        with pytest.raises(ProfileMismatchError, match=field):
            load_profile(path, expect=other)
    # a different model, drafter shape, dtype or thread count gives a different key (so a different file)
    model2 = tiny_target(layers=5)
    torch.manual_seed(1)
    drafter2 = DSparkDrafter.from_target(model2, block_size=3, target_layer_ids=[0, 2], markov_rank=8)
    assert profile_key(model2, drafter2).config_hash != p.key.config_hash
    torch.manual_seed(1)
    bigger = DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 2], markov_rank=8)
    assert profile_key(model, bigger) != p.key
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert profile_key(model, drafter).device != p.key.device
    finally:
        torch.set_num_threads(threads)
    # calibration does not change timings, so it does not change the key
    drafter.config.confidence_temperatures = [2.0, 2.0, 2.0]
    assert profile_key(model, drafter) == p.key


def test_get_profile_measures_once_then_loads(pair, monkeypatch):
    model, drafter = pair
    calls = []
    real = prof.measure_profile

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **{**k, "cache_len": 8, "warmup": 0, "repeats": 1})

    monkeypatch.setattr(prof, "measure_profile", counting)
    first = get_profile(model, drafter)
    second = get_profile(model, drafter)
    assert len(calls) == 1 and first == second
    with pytest.raises(FileNotFoundError):
        get_profile(tiny_target(layers=3), drafter, measure=False)


def test_break_even_on_a_hand_table():
    key = prof.ProfileKey("m", "h", "float32", "cpu", "t")
    p = DeviceProfile(key, verify_time=[1.0, 1.5, 1.2, 2.0], draft_time=0.5, rollback_time=0.0,
                      cache_len=0, warmup=0, repeats=0)
    # envelope T* = 1.0, 1.2, 1.2, 2.0; ℓ · ΔT* / (overhead + T*(ℓ)): 1·.2/1.5, 2·0/1.7, 3·.8/1.7
    assert break_even_survival(p) == pytest.approx([0.2 / 1.5, 0.0, 2.4 / 1.7])


@pytest.mark.parametrize("loop", [None, "assisted"])
def test_cli_profile(loop, tmp_path, capsys, char_tokenizer, monkeypatch):
    """`hf-dspark profile` measures the compiled loop unless told another (compiling: a stand-in here), which is
    what sets the default loop "auto" up on this machine."""
    from hf_dspark import cli
    from hf_dspark.decoding import loop as loops

    monkeypatch.setattr(loops, "_compiled_forward", lambda m, most: m.forward)
    tiny_target().save_pretrained(tmp_path / "tiny")
    char_tokenizer.save_pretrained(tmp_path / "tiny")
    argv = ["profile", "--target", str(tmp_path / "tiny"), "--device", "cpu", "--cache-len", "8",
            "--warmup", "0", "--repeats", "1", "--output", str(tmp_path / "out.json")] + (["--loop", loop] if loop else [])
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "saved" in out and "break-even" in out
    assert cli.main(argv) == 0 and "cached profile" in capsys.readouterr().out
    saved = load_profile(tmp_path / "out.json")
    assert saved.block_size == 7 and saved.key.loop == (loop or "compiled")


class FailingCompile:
    """torch.compile on a machine without a C++ compiler: the trace fails when the graph is built."""

    def __init__(self, fn, **kwargs):
        pass

    def aot_compile(self, example_inputs):
        raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")


def test_a_compiled_profile_is_refused_where_the_loop_cannot_compile(pair, monkeypatch):
    """Its forwards would run eagerly: a profile saved under the compiled loop would time another loop, and loop
    "auto" would then choose the compiled loop here."""
    model, drafter = pair

    monkeypatch.setattr(torch, "compile", FailingCompile)
    with pytest.raises(ValueError, match="cannot compile this target here.*InvalidCxxCompiler"):
        get_profile(model, drafter, loop="compiled", cache_len=8, warmup=0, repeats=1)
    assert not list(prof.storage_dir().glob("profiles/*.json"))


def test_cli_profile_says_in_one_line_that_this_machine_cannot_compile(tmp_path, capsys, char_tokenizer,
                                                                      monkeypatch):
    """A machine without a C++ compiler is a condition to report, not a crash: one line, exit code 2, no profile."""
    from hf_dspark import cli

    monkeypatch.setattr(torch, "compile", FailingCompile)
    tiny_target().save_pretrained(tmp_path / "tiny")
    char_tokenizer.save_pretrained(tmp_path / "tiny")
    argv = ["profile", "--target", str(tmp_path / "tiny"), "--device", "cpu", "--cache-len", "8", "--warmup", "0",
            "--repeats", "1"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("hf-dspark profile: error: the compiled loop cannot compile this target here")
    assert "Traceback" not in "\n".join(err) and "InvalidCxxCompiler" in err[-1]
    assert not [p for p in prof.storage_dir().glob("profiles/*.json") if not p.name.startswith("decode-dtype-")]


def test_pruned_draft_vocabulary_is_timed_and_keyed(pair):
    model, drafter = pair
    full = profile_key(model, drafter)
    drafter.set_draft_vocab(range(16))
    assert profile_key(model, drafter) != full
    assert measure_profile(model, drafter, cache_len=8, warmup=0, repeats=1).draft_time > 0


def test_cpus_sharing_a_name_never_share_a_profile(pair, monkeypatch):
    """Two "AMD EPYC"s, one without AVX-512 (Zen 3), one with avx512_bf16 (Zen 4): different device keys
    (what the CPU is: tests/decoding/test_machine.py)."""
    model, drafter = pair
    keys = []
    for text in (ZEN3, ZEN4):
        monkeypatch.setattr(machine, "read_cpuinfo", lambda text=text: text)
        keys.append(profile_key(model, drafter))
    assert keys[0] != keys[1] and keys[0].slug() != keys[1].slug()
    assert prof.profile_path(keys[0]) != prof.profile_path(keys[1])
    # a profile measured on one is refused on the other
    p = DeviceProfile(key=keys[0], verify_time=[1.0] * 4, draft_time=0.1, rollback_time=0.0, cache_len=8,
                      warmup=0, repeats=1)
    path = p.save()
    with pytest.raises(ProfileMismatchError, match="device"):
        load_profile(path, expect=keys[1])


def test_scheduler_profile_on_a_sliding_window_target_past_its_window():
    model = arch_matrix.build("mistral")
    window = model.config.sliding_window
    drafter = DSparkDrafter.from_target(model, block_size=4, num_hidden_layers=1, markov_rank=8)
    profile = measure_profile(model, drafter, cache_len=4 * window, warmup=0, repeats=1)
    assert profile.cache_len == 4 * window and len(profile.verify_time) == 5


def test_time_drafter_times_a_round_with_its_defaults(pair):
    _, drafter = pair
    t = prof.time_drafter(drafter, 3, cache_len=16, warmup=1, repeats=3)
    assert 0 < t < 5


def test_prepare_compiles_a_graph_per_product_form_in_one_process_and_sets_the_default_loop_up(pair, tmp_path):
    """The setup a machine runs once, with real compiles from an empty folder: the compiled loop's A/B traces one
    graph per product form on the same model in one process (a second trace pickles the model: the first graph
    must not be reachable from it), both are saved, no failure is recorded, and the default loop then runs
    DSpark's compiled loop, greedy equal to plain."""
    from hf_dspark import DecodingOptions, prepare
    from tests.helpers import PROMPT

    model, drafter = pair
    profile = prepare(model, drafter)
    assert profile.key.loop == "compiled" and set(profile.linear_ab) == {"stock", "weight_major"}
    assert "_dspark_compile_error" not in model.__dict__
    assert len(list((tmp_path / "graphs").glob("*.pt2"))) == 2 and not list((tmp_path / "graphs").glob("*.failed"))
    assert DecodingOptions().concrete(model, drafter).loop == "compiled"
    plain = model.generate(PROMPT, do_sample=False, max_new_tokens=16)
    out = model.generate(PROMPT, do_sample=False, max_new_tokens=16, assistant_model=drafter)
    assert out.tolist() == plain.tolist() and drafter.last_stats.loop == "compiled"
    assert prepare(model, drafter) == profile  # set up: read back, not measured again


def test_prepare_refuses_by_name_a_target_the_compiled_loop_cannot_run():
    """A static cache with sliding-window layers shorter than it cannot be rolled back: no setup, a one-line reason,
    nothing saved (the defaults keep the assisted loop)."""
    model = arch_matrix.build("mistral")  # sliding window 16
    drafter = DSparkDrafter.from_target(model, block_size=4, num_hidden_layers=1, markov_rank=8)
    with pytest.raises(ValueError, match="compiled loop cannot run this target.*sliding window"):
        prof.prepare(model, drafter)
    assert not list(prof.storage_dir().glob("profiles/*.json"))
