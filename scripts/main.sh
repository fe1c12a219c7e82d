#!/usr/bin/env bash
# The main job on embedded defaults: install what is missing, build, run.
# Until the agent and replay land (issue 6), the main job is `dpukv bench dma`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target dpukv
exec build/release/dpukv bench dma --mode both "$@"
