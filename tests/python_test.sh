#!/usr/bin/env bash
# Runs the Python bindings' test against a real agent.
set -euo pipefail
bin=$1
moddir=$2
script=$3
shift 3  # the rest: more agent options
tmp=$(mktemp -d)
sock=$tmp/agent.sock
"$bin" --log-level warning agent --socket "$sock" --memory-bytes 64M --max-chunk-size 1M --metrics-port 0 "$@" &
agent=$!
trap 'kill $agent 2>/dev/null || true; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
# Under ASan the module needs the sanitizer runtime loaded first. (Not grep -q: it
# stops reading at the first match, ldd dies of SIGPIPE, and pipefail makes the
# whole test read as "no ASan" now and then.)
if ldd "$moddir"/_dpukv*.so | grep libasan >/dev/null; then
  export LD_PRELOAD=$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)
  export ASAN_OPTIONS=detect_leaks=0
fi
/usr/bin/python3 "$script" "$moddir" "$sock"
