#!/usr/bin/env bash
# Is a trained drafter better than the shipped one? Calibrate it (T = 0 and T = 1, held-out prompts of every
# training source, never answered by the answer job), replay both on the evaluation sets' target answers (greedy
# and T = 1, 100 prompts x 256 tokens each; generated once into out/eval_targets/), and print τ and the worst ECE
# cell of each side by side. Copying the candidate into hf_dspark/assets/ is left to you: see docs/training.md.
#   bash scripts/ship_drafter.sh runs/<run>/checkpoint-<step>/drafter out/ship   # 1 thread, ~1 h on a Zen 3
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${1:?"drafter folder to evaluate"}
OUT=${2:?"output folder"}
PY=${PY:-.venv/bin/python}
P=data/prompts
export OMP_NUM_THREADS=1
mkdir -p "$OUT"
rm -rf "$OUT/drafter" && cp -r "$SRC" "$OUT/drafter"
CAL=(--holdout --per-file 8 --exclude-data data/answers --exclude "$P/eval/gsm8k.jsonl" "$P/eval/mbpp.jsonl"
     --max-new-tokens 128 --threads 1 --save-dtype bfloat16 -o "$OUT/drafter")
for T in 0 1; do
  "$PY" -m hf_dspark.cli calibrate "$OUT/drafter" "$P"/train/{gsm8k_train,alpaca_5000,mbpp_train,math_train,math_prm800k_extra,python_functions,oasst_prompts,awesome_chatgpt_prompts}.jsonl \
    "${CAL[@]}" --temperature $T
done
for ds in gsm8k mbpp; do  # the target's answers to the evaluation prompts: answer 0 greedy, answer 1 at T = 1
  [ -n "$(ls out/eval_targets/$ds 2>/dev/null)" ] || "$PY" -m hf_dspark.cli data "$P/eval/$ds.jsonl:2" \
    -o "out/eval_targets/$ds" --limit 200 --seed 0 --temperature 1 --top-p 1 --max-new-tokens 256 --dtype float32 \
    --slots 64 --threads 1
done
for mode in greedy t1; do
  "$PY" -m hf_dspark.cli replay out/eval_targets/gsm8k out/eval_targets/mbpp --mode $mode --drafter "$OUT/drafter" \
    --drafter hf_dspark/assets/smollm2-135m-dspark --threads 1 -o "$OUT/replay_$mode.json"
done
"$PY" - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
print("| mode | set | drafter | τ | worst ECE cell (calibrated) |\n| --- | --- | --- | --- | --- |")
for mode in ("greedy", "t1"):
    for ds, by in json.load(open(f"{out}/replay_{mode}.json"))["results"].items():
        for d, e in by.items():
            print(f"| {mode} | {ds} | {d} | {e['tau']:.3f} | {max(e.get('ece_calibrated') or [float('nan')]):.3f} |")
EOF
