#!/usr/bin/env bash
# The defaults table of docs/benchmarks.md on whatever CPU this machine has:
# the CPU's identity, the profile re-measured quietly, then plain vs prompt lookup vs the default options per set.
# Usage: bash scripts/bench_defaults.sh DTYPE [MODE] [LIMIT]   DTYPE float32|bfloat16, MODE greedy|t1, LIMIT prompts per set
# (SETS="mbpp" benches one set only; default both.)
# Nothing else may run meanwhile (pause background jobs: kill -STOP <pid>, then kill -CONT <pid>).
set -euo pipefail
cd "$(dirname "$0")/.."
DTYPE=${1:?"dtype: float32 or bfloat16"}
MODE=${2:-greedy}
LIMIT=${3:-30}
POLICIES=${POLICIES:-auto+ngram}
HF=${HF:-.venv/bin/hf-dspark}
SHARED=${SHARED:-data/prompts}
OUT=out/defaults_${DTYPE}_${MODE}
mkdir -p "$OUT"
lscpu | grep -E "Model name|CPU family|^Model:" > "$OUT/cpu.txt"
grep -o -w -E "avx2|avx512f|avx512_bf16|amx_bf16" /proc/cpuinfo | sort -u >> "$OUT/cpu.txt" || true
uptime >> "$OUT/cpu.txt"
SAMPLE=()
[ "$MODE" = t1 ] && SAMPLE=(--do-sample --temperature 1)
"$HF" profile --dtype "$DTYPE" --threads 2 --force
for ds in ${SETS:-gsm8k mbpp}; do
  "$HF" bench "$SHARED/eval/$ds.jsonl" --limit "$LIMIT" --max-new-tokens 128 --policies "$POLICIES" \
    --dtype "$DTYPE" --threads 2 "${SAMPLE[@]}" --output "$OUT/$ds"
done
echo "tables: $OUT/*/results.md"
