#!/usr/bin/env bash
# vLLM's own engine with dpukv as its KV connector (python/tests/test_vllm_engine.py,
# or SCRIPT: test_vllm_serve.py), in the venv scripts/deps.sh --test makes with vLLM:
# vllm_engine_test.sh BIN PKGDIR [SCRIPT]. Skipped (77) where there is no such venv,
# or under ASan.
set -euo pipefail
bin=$(realpath "$1")
pkgdir=$(realpath "$2")
script=${3:-test_vllm_engine.py}
src=$(dirname "$(realpath "$0")")/..
source "$src/tests/vllm_venv_common.sh"
vllm_python "$pkgdir"
exec "$vllm_py" "$src/python/tests/$script" "$vllm_py" "$pkgdir" "$bin"
