#!/usr/bin/env bash
# Resume (or start) the SmolLM2 training-answer generation in the background: $THREADS torch threads (default 1;
# THREADS=2 when nothing else needs the CPU), progress in data/answers.log, shards in data/answers/ (see
# data/README.md). Safe to rerun: answered ids are skipped.
#   bash scripts/generate_answers.sh broad   # MATH, Python functions, chat: answer 0 greedy, the rest at T = 1, top-p 1
#   bash scripts/generate_answers.sh base    # GSM8K, Alpaca, MBPP: answer 0 greedy, the rest at T = 0.7, top-p 0.9
# --dtype auto: bf16 on a CPU with native bf16, float32 elsewhere (bf16 is ~5x slower without it: Zen 3).
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${SHARED:-data/prompts}
PY=${PY:-.venv/bin/python}
THREADS=${THREADS:-1}
T="$SHARED/train"
case "${1:-broad}" in
  broad) SOURCES=("$T/math_train.jsonl:2" "$T/math_prm800k_extra.jsonl:1" "$T/python_functions.jsonl:3"
                  "$T/oasst_prompts.jsonl:10" "$T/awesome_chatgpt_prompts.jsonl:5")
         LAW=(--temperature 1.0 --top-p 1.0 --seed 1) ;;
  base)  SOURCES=("$T/gsm8k_train.jsonl:2" "$T/alpaca_5000.jsonl:2" "$T/mbpp_train.jsonl:10")
         LAW=(--temperature 0.7 --top-p 0.9 --seed 0) ;;
  *) echo "usage: $0 [broad|base]" >&2; exit 2 ;;
esac
nohup "$PY" -m hf_dspark.cli data "${SOURCES[@]}" -o data/answers \
  --exclude "$SHARED/eval/gsm8k.jsonl" "$SHARED/eval/mbpp.jsonl" \
  "${LAW[@]}" --slots 128 --threads "$THREADS" --dtype auto >> data/answers.log 2>&1 &
echo "answer generation running as pid $! (tail -f data/answers.log)"
