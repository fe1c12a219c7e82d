#!/usr/bin/env bash
# The main job on embedded defaults: install what is missing, build, and replay the
# real conversation trace (traces/) through a real client against a real agent
# that the command starts itself. Extra arguments go to `dpukv replay`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target dpukv
exec build/release/dpukv replay traces/mooncake_conversation_trace.jsonl "$@"
