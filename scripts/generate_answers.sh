#!/usr/bin/env bash
# Resume (or start) the SmolLM2 training-answer generation in the background: $THREADS torch threads (default 1;
# THREADS=2 when nothing else needs the CPU), progress in data/answers.log, shards in data/answers/ (see
# data/README.md). Safe to rerun: answered ids are skipped.
# --dtype auto: bf16 on a CPU with native bf16, float32 elsewhere (bf16 is ~5x slower without it: Zen 3).
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${SHARED:-../shared/data}
PY=${PY:-.venv/bin/python}
THREADS=${THREADS:-1}
nohup "$PY" -m hf_dspark.cli data \
  "$SHARED/train/gsm8k_train.jsonl:2" "$SHARED/train/alpaca_5000.jsonl:2" "$SHARED/train/mbpp_train.jsonl:10" \
  -o data/answers --exclude "$SHARED/eval/gsm8k.jsonl" "$SHARED/eval/mbpp.jsonl" \
  --seed 0 --slots 64 --threads "$THREADS" --dtype auto >> data/answers.log 2>&1 &
echo "answer generation running as pid $! (tail -f data/answers.log)"
