#!/usr/bin/env bash
# CUDA checks for DeepSpec checkpoints on GPU targets: device_map="auto" targets, accelerate-offloaded
# layers, an offloaded LM head (named error), bitsandbytes 8-/4-bit targets (skipped if bitsandbytes is absent).
# Tiny random targets built from configs, no downloads. Usage: scripts/gpu_check_deepspec.sh  (exit 0 = all passed)
# On a machine without CUDA the CUDA sections print SKIP (useful to check the script itself).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python
export HF_HUB_OFFLINE=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
"$PY" - <<'EOF'
import tempfile, traceback
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from hf_dspark import DSparkDrafter, enable
from tests.conftest import tiny_target
from tests.deepspec_files import checkpoint

PROMPT = torch.tensor([[5, 17, 3, 42, 8, 11]])
cuda = torch.cuda.is_available()
tmp = Path(tempfile.mkdtemp())
tiny_target("qwen3").save_pretrained(tmp / "target")
results = {}


def load_target(**kw):
    return enable(AutoModelForCausalLM.from_pretrained(tmp / "target", **kw).eval())


def identical(target, drafter, n=24):
    ids = PROMPT.to(target.device)
    plain = target.generate(ids, do_sample=False, max_new_tokens=n)
    spec = target.generate(ids, do_sample=False, max_new_tokens=n, assistant_model=drafter)
    return plain.tolist() == spec.tolist()


def check(name, fn, needs_cuda=True, needs=None):
    if needs_cuda and not cuda:
        results[name] = "SKIP (no CUDA)"
        return
    if needs is not None:
        try:
            __import__(needs)
        except ImportError:
            results[name] = f"SKIP (no {needs})"
            return
    try:
        fn()
        results[name] = "PASS"
    except Exception:
        traceback.print_exc()
        results[name] = "FAIL"


def fp32_cuda():
    t = load_target(dtype=torch.float32).to("cuda")
    d = DSparkDrafter.from_pretrained(checkpoint(tmp / "d1", t), target=t)
    assert d.device.type == "cuda" and identical(t, d)
    torch.manual_seed(0)
    t.generate(PROMPT.cuda(), do_sample=True, max_new_tokens=16, assistant_model=d)  # sampling path on CUDA


def bf16_device_map_auto():
    t = load_target(dtype=torch.bfloat16, device_map="auto")
    d = DSparkDrafter.from_pretrained(checkpoint(tmp / "d2", t), target=t)
    assert d.device == t.lm_head.weight.device and d.dtype == torch.bfloat16
    t.generate(PROMPT.to(t.device), do_sample=False, max_new_tokens=24, assistant_model=d)


def offloaded_layers():
    # layers 1-2 offloaded to CPU by accelerate (weights on meta, run on cuda:0); head and taps resident
    dm = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu", "model.layers.2": "cpu",
          "model.layers.3": 0, "model.norm": 0, "model.rotary_emb": 0, "lm_head": 0}
    t = load_target(dtype=torch.float32, device_map=dm)
    d = DSparkDrafter.from_pretrained(checkpoint(tmp / "d3", t), target=t)
    assert identical(t, d)


def offloaded_head_is_named():
    dm = {"model": 0, "lm_head": "cpu"}
    t = load_target(dtype=torch.float32, device_map=dm)
    try:
        DSparkDrafter.from_target(t, block_size=4, target_layer_ids=[0, 2])
    except ValueError as e:
        assert "offloaded" in str(e), e
        return
    # accelerate kept the head resident: then it must simply work
    d = DSparkDrafter.from_target(t, block_size=4, target_layer_ids=[0, 2])
    assert d.device == t.lm_head.weight.device


def bnb(bits):
    from transformers import BitsAndBytesConfig

    q = BitsAndBytesConfig(load_in_8bit=True) if bits == 8 else BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)
    t = load_target(dtype=torch.bfloat16, quantization_config=q, device_map={"": 0})
    assert t.lm_head.weight.is_floating_point()  # bitsandbytes skips lm_head
    full = tiny_target("qwen3")  # the stored embed/head copies are checked against the quantized target's
    d = DSparkDrafter.from_pretrained(checkpoint(tmp / f"d{bits}", full), target=t)
    assert d.device.type == "cuda"
    t.generate(PROMPT.cuda(), do_sample=False, max_new_tokens=24, assistant_model=d)


check("fp32 CUDA target: greedy identity + sampling", fp32_cuda)
check("bf16 device_map=auto target", bf16_device_map_auto)
check("accelerate-offloaded tapped layers: greedy identity", offloaded_layers)
check("offloaded LM head: named error", offloaded_head_is_named)
check("bitsandbytes 8-bit target", lambda: bnb(8), needs="bitsandbytes")
check("bitsandbytes 4-bit target", lambda: bnb(4), needs="bitsandbytes")
for name, r in results.items():
    print(f"[deepspec] {r:16s} {name}")
raise SystemExit(1 if "FAIL" in results.values() else 0)
EOF
