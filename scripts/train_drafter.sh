#!/usr/bin/env bash
# Resume (or start) the long SmolLM2 drafter run in the background: 1 thread, log in $RUN.log, state in
# $RUN/checkpoint-<step>/ (safetensors + JSON only, written atomically, weight files split at 45 MB so each can be
# committed to a git host; staged by scripts/commit_progress.sh).
# Usage: bash scripts/train_drafter.sh MINUTES
# The schedule is planned once for the whole run (--max-steps over several sessions); rerunning resumes it.
# The DFlash ablation on the same batches: HEAD_TYPE=none RUN=runs/smollm2-dflash SAME_DATA_AS=runs/smollm2-markov.
# A next stage from a finished drafter, on all answers under its own plan (lr 3e-4 undid an earlier run's cosine
# tail within 100 steps, docs/training.md):
#   RUN=runs/<next> INIT_FROM=<run>/checkpoint-<step>/drafter STEPS=... LR=1e-4 bash scripts/train_drafter.sh M
# (stage 7, RUN=runs/stage7 INIT_FROM=hf_dspark/assets/smollm2-135m-dspark STEPS=1000 LR=1e-4
#  MIX="oasst_prompts=3 awesome_chatgpt_prompts=3", is finished and shipped: a next stage starts from the shipped file)
# NUM_LAYERS=3 with INIT_FROM a 2-layer drafter grows it (the new top layer starts as an identity).
# DRAFT_VOCAB=16384 with INIT_FROM a drafter of 8,192 grows its draft vocabulary with the data's most frequent other tokens.
# MIX="oasst_prompts=3 awesome_chatgpt_prompts=3" reweights sources (--mix; another mix on a resume opens a new epoch).
# `kill <pid>` stops it cleanly (the step in flight finishes and is saved). The target's tapped features are cached
# per answer outside the repo ($FEATURES, bf16, ~4.6 KB a token): from the second epoch on a step skips the target.
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${1:?"minutes this session may train (it saves and stops before)"}
RUN=${RUN:-runs/smollm2-markov}
HEAD_TYPE=${HEAD_TYPE:-markov}
STEPS=${STEPS:-2000}
LR=${LR:-6e-4}
PY=${PY:-.venv/bin/python}
FEATURES=${FEATURES:-${HF_DSPARK_CACHE:-$HOME/.cache/hf_dspark}/features/smollm2-taps-1-14-27}
mkdir -p "$(dirname "$RUN")"
OMP_NUM_THREADS=1 nohup "$PY" -m hf_dspark.cli train data/answers -o "$RUN" --head "$HEAD_TYPE" \
  --num-layers "${NUM_LAYERS:-2}" --taps 1 14 27 --markov-rank 64 --block-size 7 --mask-token-id 16 \
  --batch-size 8 --num-anchors 64 --max-steps "$STEPS" --lr "$LR" --draft-vocab "${DRAFT_VOCAB:-8192}" --dtype auto \
  --val-size 32 --eval-every 100 --save-every 100 --seed 0 --threads 1 --cache-dir "$FEATURES" --max-shard-size 45MB \
  ${SAME_DATA_AS:+--same-data-as "$SAME_DATA_AS"} ${INIT_FROM:+--init-from "$INIT_FROM"} ${MIX:+--mix $MIX} --time-limit "$MINUTES" >> "$RUN.log" 2>&1 &
echo "training running as pid $! (tail -f $RUN.log)"
