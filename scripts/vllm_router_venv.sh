#!/usr/bin/env bash
# A venv with vLLM's router (python/vllm-router-requirements.txt, every version pinned,
# installed without resolution), for the tests that put it in front of vLLM engines
# (issue 49). Made once per machine, reused while the requirements are unchanged. Prints
# the router's command; --find only prints it if the venv is made (else exits 1).
# DPUKV_VLLM_ROUTER_VENV names the folder (default: under ~/.cache/dpukv).
set -euo pipefail
cd "$(dirname "$0")/.."
req=python/vllm-router-requirements.txt
stamp=$(cat "$req" | sha256sum | cut -c1-16)
venv=${DPUKV_VLLM_ROUTER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dpukv/vllm-router-venv}
if [ -x "$venv/bin/vllm-router" ] && [ "$(cat "$venv/.dpukv-requirements" 2>/dev/null)" = "$stamp" ]; then
  echo "$venv/bin/vllm-router"
  exit 0
fi
[ "${1:-}" = "--find" ] && exit 1
echo "dpukv: making the vllm-router venv in $venv" >&2
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$req" >&2
"$venv/bin/vllm-router" --help >/dev/null
echo "$stamp" >"$venv/.dpukv-requirements"
echo "$venv/bin/vllm-router"
