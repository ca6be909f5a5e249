#!/usr/bin/env bash
# Is a trained drafter better than the shipped one? Calibrate it (T = 0 and T = 1, held-out prompts of every
# training source, never answered by the answer job), replay both on the evaluation sets' target answers (greedy
# and T = 1, 100 prompts x 256 tokens each; generated once into out/eval_targets/), and print τ and the worst ECE
# cell of each side by side. Copying the candidate into hf_dspark/assets/ is left to you: see docs/training.md.
#   bash scripts/ship_drafter.sh runs/<run>/checkpoint-<step>/drafter out/ship   # 1 thread, ~1 h on a Zen 3
#   JOBS=2 bash scripts/ship_drafter.sh ...   # the two calibrations, answer sets and replays side by side, one
#                                             # thread each (the same results: every run is seeded on its own)
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${1:?"drafter folder to evaluate"}
OUT=${2:?"output folder"}
PY=${PY:-.venv/bin/python}
JOBS=${JOBS:-1}
P=data/prompts
export OMP_NUM_THREADS=1
PIDS=()
run() { if [ "$JOBS" -gt 1 ]; then "$@" & PIDS+=($!); else "$@"; fi; }
join() { for p in "${PIDS[@]}"; do wait "$p"; done; PIDS=(); }  # wait PID returns the job's status: set -e stops
mkdir -p "$OUT"
rm -rf "$OUT/drafter" "$OUT/drafter_T1" && cp -r "$SRC" "$OUT/drafter"
T1_DIR="$OUT/drafter"
if [ "$JOBS" -gt 1 ]; then T1_DIR="$OUT/drafter_T1" && cp -r "$SRC" "$T1_DIR"; fi
for T in 0 1; do
  DIR="$OUT/drafter"; [ "$T" = 1 ] && DIR="$T1_DIR"
  run "$PY" -m hf_dspark.cli calibrate "$DIR" "$P"/train/{gsm8k_train,alpaca_5000,mbpp_train,math_train,math_prm800k_extra,python_functions,oasst_prompts,awesome_chatgpt_prompts}.jsonl \
    --holdout --per-file 16 --exclude-data data/answers --exclude "$P/eval/gsm8k.jsonl" "$P/eval/mbpp.jsonl" \
    --max-new-tokens 128 --threads 1 --save-dtype bfloat16 -o "$DIR" --temperature $T
done
join
if [ "$T1_DIR" != "$OUT/drafter" ]; then  # the T = 1 entry joins the T = 0 one, as a second calibrate in place adds it
  "$PY" - "$OUT/drafter" "$T1_DIR" <<'PYEOF'
import sys
from hf_dspark.model.config import DSparkConfig
main, side = DSparkConfig.from_pretrained(sys.argv[1]), DSparkConfig.from_pretrained(sys.argv[2])
t1 = side.calibration_at(1.0)
main.calibration = [c for c in main.calibration if c["temperature"] != t1["temperature"]] + [t1]
main.confidence_temperatures = side.confidence_temperatures  # the last calibration's, as in place
main.save_pretrained(sys.argv[1])
PYEOF
  mv "$T1_DIR/calibration_T1.json" "$T1_DIR/reliability_T1.png" "$OUT/drafter/" && rm -rf "$T1_DIR"
fi
for ds in gsm8k mbpp; do  # the target's answers to the evaluation prompts: answer 0 greedy, answer 1 at T = 1
  [ -n "$(ls out/eval_targets/$ds 2>/dev/null)" ] || run "$PY" -m hf_dspark.cli data "$P/eval/$ds.jsonl:2" \
    -o "out/eval_targets/$ds" --limit 200 --seed 0 --temperature 1 --top-p 1 --max-new-tokens 256 --dtype float32 \
    --slots 64 --threads 1
done
join
for mode in greedy t1; do
  run "$PY" -m hf_dspark.cli replay out/eval_targets/gsm8k out/eval_targets/mbpp --mode $mode --drafter "$OUT/drafter" \
    --drafter hf_dspark/assets/smollm2-135m-dspark --threads 1 -o "$OUT/replay_$mode.json"
done
join
"$PY" - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
print("| mode | set | drafter | τ | worst ECE cell (calibrated) |\n| --- | --- | --- | --- | --- |")
for mode in ("greedy", "t1"):
    for ds, by in json.load(open(f"{out}/replay_{mode}.json"))["results"].items():
        for d, e in by.items():
            print(f"| {mode} | {ds} | {d} | {e['tau']:.3f} | {max(e.get('ece_calibrated') or [float('nan')]):.3f} |")
EOF
