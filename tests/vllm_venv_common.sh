# Sourced by the tests that run in the venv scripts/deps.sh --test makes with vLLM:
# vllm_python PKGDIR sets $vllm_py to that venv's python, or exits 77 (skipped) where
# the venv is not made, or where PKGDIR's client is built with ASan (vLLM's libraries
# are not built for it); scripts/test.sh always makes the venv.
vllm_python() {
  local src rc=0
  src=$(dirname "$(realpath "${BASH_SOURCE[0]}")")/..
  vllm_py=$("$src/scripts/vllm_venv.sh" --find) || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "SKIP: no vLLM venv here (scripts/deps.sh --test makes it)"
    exit 77
  fi
  # Not grep -q: it stops reading at the first match, ldd dies of SIGPIPE, and
  # pipefail reads that as "no ASan" now and then (vllm.serve then ran under ASan).
  if ldd "$1"/dpukv/_dpukv*.so | grep libasan >/dev/null; then
    echo "SKIP: vLLM is not run under ASan (its own libraries are not built for it)"
    exit 77
  fi
}
