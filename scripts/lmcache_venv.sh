#!/usr/bin/env bash
# A venv with LMCache (python/lmcache-requirements.txt, every version pinned, installed
# without resolution) layered on the vLLM venv (scripts/vllm_venv.sh): a .pth file puts
# the vLLM venv's packages on its path, so LMCache runs beside the very vLLM and torch
# the tests use, and the vLLM venv is not touched. For bench_vllm_ttft.py's lmcache
# rows; made once per machine, reused while the requirements are unchanged. Prints its
# python. DPUKV_LMCACHE_VENV names the folder (default: under ~/.cache/dpukv).
set -euo pipefail
cd "$(dirname "$0")/.."
req=python/lmcache-requirements.txt
vllm_py=$(scripts/vllm_venv.sh)
stamp=$(cat "$req" python/vllm-requirements.txt | sha256sum | cut -c1-16)
venv=${DPUKV_LMCACHE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dpukv/lmcache-venv}
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.dpukv-requirements" 2>/dev/null)" = "$stamp" ]; then
  echo "$venv/bin/python"
  exit 0
fi
echo "dpukv: making the LMCache venv in $venv (on the vLLM venv)" >&2
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv" >&2
site=$("$vllm_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site" >"$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/dpukv-vllm-venv.pth"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$req" >&2
"$venv/bin/python" -c 'import lmcache, vllm' >&2
echo "$stamp" >"$venv/.dpukv-requirements"
echo "$venv/bin/python"
