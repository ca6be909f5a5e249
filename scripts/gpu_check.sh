#!/usr/bin/env bash
# Device check for the Triton drafter (docs/kernels.md), under 8 minutes on one GPU:
#   1. install what is missing (offline: wheels carried in .whl/, see docs/kernels.md)
#   2. tests/model/test_kernels.py compiled on the GPU (kernels vs reference, greedy identity, sampling exactness)
#   3. micro-benchmark: drafter phases and drafter time per generate() round, kernels vs PyTorch
#   4. a short end-to-end generate on the kernel path
# Prints a summary at the end; logs go to $OUT (or ./gpu_check_logs) when set.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
LOG=${OUT:-gpu_check_logs}
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD:$PWD/kernels:${PYTHONPATH:-}"
unset TRITON_INTERPRET
t_start=$(date +%s)
declare -A status

# 1. packages: the image has torch + triton; transformers must be 5.23-5.24 (carried as wheels, no network)
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
$PY - <<'EOF' 2>&1 | tee "$LOG/env.txt"
import torch, triton, transformers
print(f"torch {torch.__version__} cuda={torch.cuda.is_available()} "
      f"{torch.cuda.get_device_name() if torch.cuda.is_available() else ''}; triton {triton.__version__}; "
      f"transformers {transformers.__version__}")
from hf_dspark.decoding.routing import check_transformers
from hf_dspark.model import heads
check_transformers()
print("hf_dspark kernels:", heads.kernels.__name__ if heads.kernels else "not importable (PyTorch path only)")
EOF
rc=${PIPESTATUS[0]}; status[env]=$([ "$rc" = 0 ] && echo ok || echo FAILED)

# 2. kernel tests, compiled (no interpreter), the slow sampling-exactness test included
timeout 300 $PY -m pytest -q -p no:cacheprovider tests/model/test_kernels.py 2>&1 | tee "$LOG/tests.txt"
rc=${PIPESTATUS[0]}; status[tests]=$([ "$rc" = 0 ] && echo ok || echo FAILED)

# 3 + 4. micro-benchmark and end-to-end generate (random SmolLM2-135M-shaped target, bf16)
timeout 180 $PY scripts/bench_kernels.py --layers 12 --new-tokens 64 2>&1 | tee "$LOG/bench.txt"
rc=${PIPESTATUS[0]}; status[bench]=$([ "$rc" = 0 ] && echo ok || echo FAILED)

echo
echo "==== gpu_check summary ($(( $(date +%s) - t_start )) s) ===="
head -2 "$LOG/env.txt"
echo "environment: ${status[env]}"
echo "kernel tests: ${status[tests]} — $(grep -E '[0-9]+ (passed|failed)' "$LOG/tests.txt" | tail -1)"
echo "benchmark + end-to-end: ${status[bench]}"
grep -E 'µs per call|phase|x$|drafter time|end-to-end' "$LOG/bench.txt"
[ "${status[env]}${status[tests]}${status[bench]}" = "okokok" ]
