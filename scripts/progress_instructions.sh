#!/bin/bash
# Instructions the agent's progress thread executes per GPU chunk copy, counted by
# callgrind through the CUDA driver double (tests/gpu_probe/gpu_progress_probe.cc:
# a layer's chunks stored from and retrieved into adjacent 1 MiB ranges of a GPU
# export). Only the probe's thread is counted, and only its submissions and polls:
# the double's copies run on the double's thread, as a GPU's DMA does, and the
# probe waits for the driver (uncounted) before it polls, so the figure does not
# depend on how busy the machine is.
#
# usage: scripts/progress_instructions.sh [--json] [BUILD_DIR] [CHUNKS] [ROUNDS] [auto|host]
#   defaults: build/release 32 4 auto. Prints instructions per chunk copy.
set -euo pipefail
json=0
if [ "${1:-}" = --json ]; then json=1; shift; fi
if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build/release}
chunks=${2:-32}
rounds=${3:-4}
checksum=${4:-auto}
probe=$build/gpu_progress_probe
double=$build/cuda_double/libcuda.so.1
[ -x "$probe" ] || { echo "progress_instructions: no $probe (build the tests first)" >&2; exit 2; }
[ -e "$double" ] || { echo "progress_instructions: no $double" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "progress_instructions: needs valgrind" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
DPUKV_CUDA_DRIVER=$double valgrind --tool=callgrind --separate-threads=yes --collect-atstart=no \
  --toggle-collect='*measured_submit*' --toggle-collect='*measured_poll*' --callgrind-out-file="$tmp/cg.%p" \
  "$probe" "$chunks" "$rounds" "$checksum" >"$tmp/probe.json" 2>"$tmp/valgrind.log" || {
  echo "progress_instructions: the probe failed:" >&2
  tail -20 "$tmp/valgrind.log" >&2
  exit 1
}
# The main thread's file is the one whose name ends in -01.
main=$(ls "$tmp"/cg.*-01)
ir=$(awk '/^(summary|totals):/ {print $2; exit}' "$main")
copies=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['driver_copies'])" "$tmp/probe.json")
design=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['checksum'])" "$tmp/probe.json")
idle=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['idle_polls'])" "$tmp/probe.json")
per=$((ir / copies))
if [ "$json" = 1 ]; then
  printf '{"bench": "progress_instructions", "results": [{"chunk_bytes": 1048576, "chunks": %s, "rounds": %s, "checksum": "%s", "chunk_copies": %s, "instructions": %s, "instructions_per_chunk": %s, "idle_polls": %s}]}\n' \
    "$chunks" "$rounds" "$design" "$copies" "$ir" "$per" "$idle"
else
  echo "progress thread: $per instructions per 1 MiB chunk copy ($ir over $copies store and retrieve copies, checksums $design, through the driver double; $idle idle polls)"
fi
