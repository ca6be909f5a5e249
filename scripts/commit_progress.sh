#!/usr/bin/env bash
# Stage what the long jobs made: sealed answer shards (and the open one) and each training run's newest complete
# checkpoint (safetensors + JSON, ~170 MB for the SmolLM2 drafter: stage it only when it is worth a fresh machine's
# time) with its metrics. Stop the jobs first: `kill <pid>` (the trainer finishes its step and saves).
set -euo pipefail
cd "$(dirname "$0")/.."
git add data/answers
for run in runs/*/; do
  latest=$(ls -d "$run"checkpoint-* 2>/dev/null | sort -t- -k2 -n | tail -1 || true)
  [ -n "$latest" ] || continue
  git add -A "$run"  # the new checkpoint, the removal of the one it replaced, metrics and config
done
git status --short | head -20
