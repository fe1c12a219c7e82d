#!/usr/bin/env bash
# vLLM's own engine with dpukv as its KV connector (python/tests/test_vllm_engine.py,
# or SCRIPT: test_vllm_serve.py), in the venv scripts/deps.sh --test makes with vLLM:
# vllm_engine_test.sh BIN PKGDIR [SCRIPT].
# Exit 77 (skipped) where that venv is not made; scripts/test.sh always makes it.
set -euo pipefail
bin=$(realpath "$1")
pkgdir=$(realpath "$2")
script=${3:-test_vllm_engine.py}
src=$(dirname "$(realpath "$0")")/..
rc=0
py=$("$src/scripts/vllm_venv.sh" --find) || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "SKIP: no vLLM venv here (scripts/deps.sh --test makes it)"
  exit 77
fi
# Not grep -q: it stops reading at the first match, ldd dies of SIGPIPE, and pipefail
# reads that as "no ASan" now and then (the test then ran under ASan and failed).
if ldd "$pkgdir"/dpukv/_dpukv*.so | grep libasan >/dev/null; then
  echo "SKIP: vLLM's engine is not run under ASan (its own libraries are not built for it)"
  exit 77
fi
exec "$py" "$src/python/tests/$script" "$py" "$pkgdir" "$bin"
