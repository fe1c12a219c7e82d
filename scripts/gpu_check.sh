#!/usr/bin/env bash
# What a GPU machine runs. That machine has CUDA and NVIDIA's driver but no Debian
# packages and no network, so the binaries are built here and carried in a bundle:
#
#   scripts/gpu_check.sh --bundle DIR    # here: copy the GPU tests and the .so files
#                                        # they load (ldd) into DIR
#   scripts/gpu_check.sh DIR             # there: run them against libcuda.so.1
#
# Runs the CUDA driver boundary's, the CUDA copy engine's and the agent's GPU path
# tests against the real driver (DPUKV_CUDA_DRIVER=libcuda.so.1; the fault tests, which need the
# test double, skip) and prints one JSON object with each test's result and the
# driver and GPU it ran on. Exit status: 0 when every test that ran passed.
# Not in it yet (not built): the connector on CUDA tensors and the GPU benchmark.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tests=(cuda_driver_test cuda_engine_test gpu_agent_test)
if [ "${1:-}" = "--bundle" ]; then
  out=${2:?usage: gpu_check.sh --bundle DIR}
  build=${BUILD:-$here/build/release}
  mkdir -p "$out/bin" "$out/lib"
  for t in "${tests[@]}" dpukv; do
    cp "$build/$t" "$out/bin/"
    ldd "$build/$t" | awk '/=> \//{print $3}' | while read -r lib; do
      case "$(basename "$lib")" in
        libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|ld-linux*) ;;  # the machine's own
        *) cp -L "$lib" "$out/lib/" ;;
      esac
    done
  done
  cp "$0" "$out/"
  echo "bundle in $out: run $out/gpu_check.sh $out on the GPU machine"
  exit 0
fi
dir=${1:?usage: gpu_check.sh DIR (a bundle made with --bundle)}
export LD_LIBRARY_PATH=$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export DPUKV_CUDA_DRIVER=${DPUKV_CUDA_DRIVER:-libcuda.so.1}
export DPUKV_BIN=$dir/bin/dpukv  # the agent gpu_agent_test starts
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rc=0
for t in "${tests[@]}"; do
  "$dir/bin/$t" --gtest_output="json:$tmp/$t.json" >"$tmp/$t.log" 2>&1 || rc=1
done
gpu=$(nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader 2>/dev/null | head -1 || true)
python3 - "$tmp" "$DPUKV_CUDA_DRIVER" "$gpu" "${tests[@]}" <<'PY'
import json, os, sys
tmp, driver, gpu, tests = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
out = {"gpu_check": "dpukv", "driver": driver, "gpu": gpu, "tests": {}}
for t in tests:
    path = os.path.join(tmp, t + ".json")
    if not os.path.exists(path):
        out["tests"][t] = {"error": open(os.path.join(tmp, t + ".log")).read()[-2000:]}
        continue
    for suite in json.load(open(path))["testsuites"]:
        for case in suite["testsuite"]:
            name = suite["name"] + "." + case["name"]
            res = "skipped" if case.get("result") == "SKIPPED" else (
                "failed" if case.get("failures") else "passed")
            out["tests"][name] = {"result": res, "seconds": case.get("time")}
print(json.dumps(out, indent=2))
PY
exit $rc
