#!/usr/bin/env bash
# A Python test run by tests/python_test.sh (same arguments: BIN PKGDIR SCRIPT ...),
# but in the venv scripts/deps.sh --test makes with vLLM, so that it meets vLLM's own
# modules. Skipped (77) where there is no such venv, or under ASan.
set -euo pipefail
src=$(dirname "$(realpath "$0")")/..
source "$src/tests/vllm_venv_common.sh"
vllm_python "$2"
DPUKV_TEST_PYTHON=$vllm_py exec "$src/tests/python_test.sh" "$@"
