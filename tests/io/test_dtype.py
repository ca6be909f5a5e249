"""dtype "auto": bf16 only where the device multiplies bf16 natively (a CPU with avx512_bf16 or AMX, a CUDA GPU with
bf16 support), float32 elsewhere, with the reason; an explicit dtype always wins."""

import pytest
import torch

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


@pytest.mark.parametrize("native", [True, False])
def test_load_default_target_follows_the_cpu(monkeypatch, native):
    """The real SmolLM2 (converted once, then ~2 s): bf16 with native bf16, float32 without; float32 on request."""
    monkeypatch.setattr(loading, "cpu_has_native_bf16", lambda: native)
    model, _ = loading.load_default_target()
    assert model.dtype == (torch.bfloat16 if native else torch.float32)
    if native:
        assert loading.load_default_target(dtype="float32")[0].dtype == torch.float32
