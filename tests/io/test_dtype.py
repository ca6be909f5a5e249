"""dtype "auto": for decoding a model on a CPU, whichever of float32 and bf16 serves a reference request (256-token
prompt, 256 new tokens) faster here (bf16 only when clearly faster; measured once, cached per model and CPU); for batched jobs (no model given) bf16 only where
the device multiplies bf16 natively (a CPU with avx512_bf16 or AMX, a CUDA GPU with bf16 support). Always with the
reason; an explicit dtype always wins."""

import pytest
import torch

from hf_dspark.decoding import profile
from hf_dspark.io import loading


@pytest.mark.parametrize("native", [True, False])
def test_auto_picks_bf16_only_on_a_cpu_with_native_bf16(monkeypatch, native):
    monkeypatch.setattr(loading, "cpu_has_native_bf16", lambda: native)
    dtype, why = loading.auto_dtype("cpu")
    assert dtype == (torch.bfloat16 if native else torch.float32)
    assert ("has native bf16" in why) == native and ("no native bf16" in why) != native
    assert loading.resolve_dtype("auto", "cpu") == dtype


def test_explicit_dtypes_win(monkeypatch):
    monkeypatch.setattr(loading, "cpu_has_native_bf16", lambda: True)
    assert loading.resolve_dtype("float32", "cpu") == torch.float32
    assert loading.resolve_dtype(torch.float16, "cpu") == torch.float16
    assert loading.resolve_dtype("bf16", "cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="'auto' or one of"):
        loading.resolve_dtype("float8", "cpu")


def test_cuda_without_bf16_is_float32(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Old GPU")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **kw: False)
    assert loading.auto_dtype("cuda") == (torch.float32, "Old GPU has no bf16 support")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **kw: True)
    assert loading.auto_dtype("cuda") == (torch.bfloat16, "Old GPU supports bf16")


def model_folder(path):
    """A folder with a tiny target's config: what decode_dtype reads to key its measurement."""
    from tests.conftest import tiny_target

    tiny_target().config.save_pretrained(path)
    return path


def fake_costs(monkeypatch, costs: dict) -> list:
    """decode_cost answers from `costs` {dtype: (prefill ms, step ms)}; → the (model, dtype) pairs it was asked for."""
    asked = []

    def cost(model, dtype, **kw):
        asked.append((str(model), dtype))
        return dict(zip(("prefill", "step"), costs[dtype]))

    monkeypatch.setattr(loading, "decode_cost", cost)
    return asked


@pytest.mark.parametrize("fp32, bf16, want", [
    ((400.0, 78.0), (1600.0, 57.0), torch.bfloat16),  # the Zen 3: steps win over the dearer prefill (16.2 vs 20.4 s)
    ((400.0, 78.0), (6000.0, 57.0), torch.float32),  # a prefill this dear loses it
    ((400.0, 78.0), (400.0, 72.0), torch.float32),  # 8 % faster: not enough, float32 is the identity dtype
    ((200.0, 40.0), (200.0, 60.0), torch.float32),
])
def test_auto_for_decoding_is_measured_once_per_model_and_cpu(tmp_path, monkeypatch, fp32, bf16, want):
    """bf16 only when a 256-token prompt plus 256 new tokens take at most 90 % of float32's time; measured once per
    model and CPU, then read back; another CPU (device_name) or model measures again."""
    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))
    some, other = model_folder(tmp_path / "some"), model_folder(tmp_path / "other")
    asked = fake_costs(monkeypatch, {torch.float32: fp32, torch.bfloat16: bf16})
    dtype, why = loading.decode_dtype(some, "cpu")
    assert dtype == want and f"{(fp32[0] + 256 * fp32[1]) / 1e3:.3g} s in float32" in why, why
    assert f"step {bf16[1]:.3g} vs {fp32[1]:.3g} ms" in why, why
    assert len(asked) == 2
    assert loading.decode_dtype(some, "cpu") == (dtype, why) and len(asked) == 2  # cached
    assert loading.resolve_dtype("auto", "cpu", model=some) == want and len(asked) == 2
    assert [p.name.startswith("decode-dtype-") for p in (tmp_path / "profiles").iterdir()] == [True]
    monkeypatch.setattr(profile, "device_name", lambda device: "another CPU (2 threads)")
    loading.decode_dtype(some, "cpu")
    loading.decode_dtype(other, "cpu")
    assert len(asked) == 6


def test_auto_without_a_model_keeps_the_isa_rule(tmp_path, monkeypatch):
    """Batched jobs (answer generation, training) are compute-bound: no model, no measurement, the ISA rule."""
    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))
    asked = fake_costs(monkeypatch, {torch.float32: (400.0, 78.0), torch.bfloat16: (1600.0, 57.0)})
    monkeypatch.setattr(loading, "cpu_has_native_bf16", lambda: False)
    assert loading.resolve_dtype("auto", "cpu") == torch.float32 and not asked


def test_decode_cost_is_timed_on_a_real_model(tmp_path):
    from tests.conftest import tiny_target

    tiny_target().save_pretrained(tmp_path / "tiny")
    for dtype in (torch.float32, torch.bfloat16):
        cost = loading.decode_cost(tmp_path / "tiny", dtype, prompt=16, warmup=1, repeats=3)
        assert set(cost) == {"prefill", "step"} and all(0 < v < 10_000 for v in cost.values())


@pytest.mark.parametrize("faster", [torch.bfloat16, torch.float32])
def test_load_default_target_follows_the_measurement(tmp_path, monkeypatch, faster):
    """The real SmolLM2 (converted once, then ~2 s) in the dtype that measured faster; float32 on request."""
    real = loading.default_target_path()  # the converted folder in the real cache; the measurement's goes to tmp
    monkeypatch.setattr(loading, "default_target_path", lambda: real)
    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))
    fake_costs(monkeypatch, {faster: (300.0, 50.0), ({torch.bfloat16, torch.float32} - {faster}).pop(): (300.0, 80.0)})
    model, _ = loading.load_default_target()
    assert model.dtype == faster
    assert loading.load_default_target(dtype="float32")[0].dtype == torch.float32
