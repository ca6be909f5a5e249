#!/usr/bin/env bash
# Stage what the long jobs made: sealed answer shards (and the open one) and each training run's newest complete
# checkpoint with its metrics, slimmed first (checkpoint.slim: weights, progress and schedule, no AdamW moments; 55 MB
# instead of 165 MB for the SmolLM2 drafter, so a checkpoint can be replaced every session within a submission's size;
# the resume on another machine restarts the moments and says so). Stop the jobs first: `kill <pid>` (the trainer
# finishes its step and saves).
set -euo pipefail
cd "$(dirname "$0")/.."
git add data/answers
for run in runs/*/; do
  latest=$(ls -d "$run"checkpoint-* 2>/dev/null | sort -t- -k2 -n | tail -1 || true)
  [ -n "$latest" ] || continue
  "${PY:-.venv/bin/python}" -c "import sys; from hf_dspark.training import checkpoint as c; c.is_slim(sys.argv[1]) or c.slim(sys.argv[1])" "$latest"
  git add -A "$run"  # the new checkpoint, the removal of the one it replaced, metrics and config
done
git status --short | head -20
