#!/usr/bin/env bash
# Runs a Python test against a real agent: python_test.sh BIN PKGDIR SCRIPT [agent options]
# (PKGDIR: the folder that holds the dpukv package with its compiled client)
# starts one and passes its socket; with --own-agent the script starts (and kills)
# its agents itself and gets the binary's path instead. With --pytest (first of
# the options) SCRIPT is a pytest module: pytest runs it, with the agent's socket
# in DPUKV_TEST_SOCKET and PKGDIR in DPUKV_PY_PACKAGE_DIR.
set -euo pipefail
bin=$1
moddir=$2
script=$3
shift 3  # the rest: more agent options
export DPUKV_BIN=$bin
tmp=$(mktemp -d)
agent=""
trap '[ -n "$agent" ] && kill $agent 2>/dev/null; rm -rf "$tmp"' EXIT
# Under ASan the module needs the sanitizer runtime loaded first. (Not grep -q: it
# stops reading at the first match, ldd dies of SIGPIPE, and pipefail makes the
# whole test read as "no ASan" now and then.)
preload=""
if ldd "$moddir"/dpukv/_dpukv*.so | grep libasan >/dev/null; then
  preload=$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)
fi
# DPUKV_TEST_PYTHON: another interpreter (tests/vllm_venv_test.sh: vLLM's venv).
python=${DPUKV_TEST_PYTHON:-/usr/bin/python3}
run_python() {
  if [ -n "$preload" ]; then
    LD_PRELOAD=$preload ASAN_OPTIONS=detect_leaks=0 "$python" "$@"
  else
    "$python" "$@"
  fi
}
pytest=0
if [ "${1:-}" = "--pytest" ]; then
  pytest=1
  shift
fi
if [ "${1:-}" = "--own-agent" ]; then
  if [ $pytest = 1 ]; then
    DPUKV_PY_PACKAGE_DIR=$moddir PYTHONDONTWRITEBYTECODE=1 \
      run_python -m pytest -q -p no:cacheprovider "$script"
  else
    run_python "$script" "$moddir" "$bin"
  fi
  exit
fi
sock=$tmp/agent.sock
"$bin" --log-level warning agent --socket "$sock" --memory-bytes 64M --max-chunk-size 1M --metrics-port 0 "$@" &
agent=$!
# Wait for the socket (a busy machine: as long as it takes while the agent lives).
until [ -S "$sock" ]; do
  kill -0 $agent 2>/dev/null || { echo "the agent exited before it listened"; exit 1; }
  sleep 0.05
done
if [ $pytest = 1 ]; then
  # No cache or bytecode written into the source tree.
  DPUKV_TEST_SOCKET=$sock DPUKV_PY_PACKAGE_DIR=$moddir PYTHONDONTWRITEBYTECODE=1 \
    run_python -m pytest -q -p no:cacheprovider "$script"
else
  run_python "$script" "$moddir" "$sock"
fi
