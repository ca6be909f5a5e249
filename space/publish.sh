#!/usr/bin/env bash
# Publish the demo as a Hugging Face Space:  bash space/publish.sh USER/SPACE_NAME [--dry-run]
# Stages app.py, the hf_dspark package and this folder's README.md (Space metadata) + requirements.txt,
# then uploads them with the `hf` CLI (needs `hf auth login` first). --dry-run only lists the staged files.
set -euo pipefail
cd "$(dirname "$0")/.."
SPACE=${1:?usage: bash space/publish.sh USER/SPACE_NAME [--dry-run]}
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
cp app.py space/README.md space/requirements.txt "$STAGE"/
# the package's committed files only (code and the shipped drafter; no caches, no work in progress)
git ls-files -- hf_dspark | xargs -I{} cp --parents {} "$STAGE"/
if [ "${2:-}" = "--dry-run" ]; then (cd "$STAGE" && find . -type f | sort); exit 0; fi
hf upload "$SPACE" "$STAGE" . --repo-type space --commit-message "DSpark demo"
