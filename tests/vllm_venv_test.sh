#!/usr/bin/env bash
# A Python test run by tests/python_test.sh (same arguments), but in the venv
# scripts/deps.sh --test makes with vLLM, so that it meets vLLM's own modules.
# Exit 77 (skipped) where that venv is not made, or under ASan (vLLM's libraries
# are not built for it); scripts/test.sh always makes it.
set -euo pipefail
src=$(dirname "$(realpath "$0")")/..
rc=0
py=$("$src/scripts/vllm_venv.sh" --find) || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "SKIP: no vLLM venv here (scripts/deps.sh --test makes it)"
  exit 77
fi
if ldd "$2"/dpukv/_dpukv*.so | grep libasan >/dev/null; then
  echo "SKIP: vLLM is not run under ASan (its own libraries are not built for it)"
  exit 77
fi
DPUKV_TEST_PYTHON=$py exec "$src/tests/python_test.sh" "$@"
