#!/usr/bin/env bash
# scripts/gpu_check.sh as a GPU machine would use it, with the driver test double
# standing in for NVIDIA's driver: the bundle carries what the tests load, and the
# run prints one JSON object in which every test passed or skipped.
set -euo pipefail
src=$1
build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
BUILD=$build "$src/scripts/gpu_check.sh" --bundle "$tmp/bundle" >/dev/null
# The Python parts through the double too, with Debian's Python and a small agent.
# Under ASan the interpreter loads instrumented libraries (the client, the double)
# and needs the sanitizer runtimes first, as tests/python_test.sh does.
py=/usr/bin/python3
if ldd "$build/libdpukv_client.so.0" | grep libasan >/dev/null; then
  py=$tmp/python
  printf '#!/bin/sh\nLD_PRELOAD=%s:%s ASAN_OPTIONS=detect_leaks=0 exec /usr/bin/python3 "$@"\n' \
    "$(gcc -print-file-name=libasan.so)" "$(gcc -print-file-name=libubsan.so)" >"$py"
  chmod +x "$py"
fi
DPUKV_CUDA_DRIVER=$build/cuda_double/libcuda.so.1 GPU_CHECK_DEVICE=cuda-double \
  PYTHON=$py GPU_CHECK_AGENT_MEMORY=256M \
  "$tmp/bundle/gpu_check.sh" "$tmp/bundle" >"$tmp/out.json"
/usr/bin/python3 - "$tmp/out.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
tests = d["tests"]
assert len(tests) >= 8, tests
assert all(t.get("result") in ("passed", "skipped") for t in tests.values()), tests
assert tests["CudaEngineTest.CopiesIntoAndOutOfAClientsGpuMemoryByteForByte"]["result"] == "passed"
assert tests["GpuAgentTest.GpuAndHostStagingMoveTheSameBytesAtOddOffsetsAndSizes"]["result"] == "passed"
assert tests["python.connector_cuda"]["result"] == "passed", tests["python.connector_cuda"]
rows = d["bench_connector"]["results"]
assert {r["op"] for r in rows} >= {"ttft", "save_overhead", "load"}, rows
assert all("not GPU figures" in r["path"] for r in rows if "path" in r), rows
# Each first-token row says where the agent checksummed: the double runs the kernel's twin.
assert all(r["checksums"] == "on the GPU" for r in rows if r["op"] == "ttft"), rows
PY
echo "gpu_check: ok"
