#!/usr/bin/env bash
# The main job: install what is needed, build, and train the default GPT on the default corpus
# (Debian's fortunes). Extra arguments go to `tessera train`. It builds the command only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh --target tessera  # the tests build in the test command
mkdir -p runs
exec ./build/apps/tessera/tessera train --save runs/default --metrics runs/default/metrics.jsonl "$@"
