#!/usr/bin/env bash
# Commit what the long jobs made this session: sealed answer shards (and the open one) and the training run's
# state (safetensors + JSON). Stop both jobs first (pkill -f "hf_dspark.cli data"; the trainer saves at its
# --time-limit). A run's state is ~170 MB: commit it once per session, at the end (a submission's diffs are capped).
set -euo pipefail
cd "$(dirname "$0")/.."
git add data/answers
for run in runs/*/; do
  [ -f "$run/progress.json" ] && git add "$run"drafter "$run"optimizer "$run"progress.json "$run"train_config.json \
    "$run"metrics.jsonl
done
git status --short | head -20
