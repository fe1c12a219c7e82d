#!/usr/bin/env bash
# What a GPU machine runs. That machine has CUDA, NVIDIA's driver and a Python with
# torch, but no Debian packages and no network, so the binaries are built here and
# carried in a bundle:
#
#   scripts/gpu_check.sh --bundle DIR    # here: copy the GPU tests, the agent, the
#                                        # client library, the .so files they load
#                                        # (ldd) and the Python package into DIR
#   scripts/gpu_check.sh DIR             # there: run them against libcuda.so.1
#
# Runs, against the real driver (DPUKV_CUDA_DRIVER=libcuda.so.1; the fault tests,
# which need the test double, skip):
#   - the CUDA driver boundary's, the CUDA copy engine's and the agent's GPU path
#     tests (gtest);
#   - the connector test on CUDA tensors, through the gpu path (the agent's CUDA
#     engine copying into exported GPU staging), with that machine's Python: the
#     client over the C ABI (python/dpukv/_ctypes_client.py), since the compiled
#     module is built for Debian's Python;
#   - python/benchmarks/bench_connector.py at the Llama-3.1-8B shape (2k, 8k, 32k prefixes),
#     every sample and each first token's phases kept; its agent copy rows say where
#     the agent checksummed (the GPU's kernel, by default); then the agent's copies
#     alone again with --gpu-checksum host (bench_connector_host_checksums), the
#     other design on the same machine (GPU_CHECK_HOST_CHECKSUMS=0 leaves it out).
# Prints one JSON object: each test's result, the connector test's line, the
# benchmark's rows, and the driver and GPU it ran on. Exit status: 0 when every
# test that ran passed. PYTHON names the interpreter (default python3);
# GPU_CHECK_BENCH=0 leaves the benchmark out; GPU_CHECK_DEVICE=cuda-double runs the
# Python parts through the CUDA driver test double instead (CI's check of this
# script, tests/gpu_check_test.sh: not GPU figures). GPU_CHECK_LOGS=DIR keeps every
# log (tests, agents, connector, bench) in DIR. The agent runs with
# --dma-threads $GPU_CHECK_DMA_THREADS (default 4: the engine threads that also
# checksum GPU copies); GPU_CHECK_BENCH_ARGS replaces the benchmark's arguments;
# GPU_CHECK_TESTS=0 runs the benchmark alone.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tests=(cuda_driver_test cuda_engine_test gpu_agent_test)
if [ "${1:-}" = "--bundle" ]; then
  out=${2:?usage: gpu_check.sh --bundle DIR}
  build=${BUILD:-$here/build/release}
  mkdir -p "$out/bin" "$out/lib" "$out/python/dpukv" "$out/python/tests" "$out/python/benchmarks"
  for t in "${tests[@]}" dpukv libdpukv_client.so.0; do
    if [ "$t" = libdpukv_client.so.0 ]; then cp -L "$build/$t" "$out/lib/"; else cp "$build/$t" "$out/bin/"; fi
    ldd "$build/$t" | awk '/=> \//{print $3}' | while read -r lib; do
      case "$(basename "$lib")" in
        libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|ld-linux*) ;;  # the machine's own
        *) cp -L "$lib" "$out/lib/" ;;
      esac
    done
  done
  # Without debug information the bundle fits what a device run may carry (64 MiB).
  strip --strip-debug "$out"/bin/* "$out/lib/libdpukv_client.so.0"
  mkdir -p "$out/python/dpukv/connector"
  cp "$here"/python/dpukv/*.py "$out/python/dpukv/"
  cp "$here"/python/dpukv/connector/*.py "$out/python/dpukv/connector/"
  cp "$here/python/tests/test_connector.py" "$here/python/tests/reference_model.py" \
    "$out/python/tests/"
  cp "$here/python/benchmarks/bench_connector.py" "$out/python/benchmarks/"
  cp "$0" "$out/"
  echo "bundle in $out: run $out/gpu_check.sh $out on the GPU machine"
  exit 0
fi
dir=$(cd "${1:?usage: gpu_check.sh DIR (a bundle made with --bundle)}" && pwd)
export LD_LIBRARY_PATH=$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export DPUKV_CUDA_DRIVER=${DPUKV_CUDA_DRIVER:-libcuda.so.1}
export DPUKV_BIN=$dir/bin/dpukv  # the agent gpu_agent_test starts
export DPUKV_CLIENT_LIB=$dir/lib/libdpukv_client.so.0
export DPUKV_PY_CLIENT=ctypes
py=${PYTHON:-python3}
device=${GPU_CHECK_DEVICE:-cuda}
tmp=$(mktemp -d)
agent=""
keep_logs() { [ -z "${GPU_CHECK_LOGS:-}" ] || { mkdir -p "$GPU_CHECK_LOGS" && cp -r "$tmp"/. "$GPU_CHECK_LOGS"/; }; }
trap '[ -n "$agent" ] && kill $agent 2>/dev/null; keep_logs; rm -rf "$tmp"' EXIT
rc=0
[ "${GPU_CHECK_TESTS:-1}" != 0 ] || tests=()  # the benchmark alone
for t in "${tests[@]}"; do
  # A limit, so that a wait that never ends on a real driver is a failed test with
  # its log, not a lost run.
  timeout "${GPU_CHECK_TEST_TIMEOUT:-300}" "$dir/bin/$t" --gtest_output="json:$tmp/$t.json" \
    >"$tmp/$t.log" 2>&1 || rc=1
done
# An agent of the bundle for the Python parts (a 1 s pin timeout: the connector
# test lets a lease expire).
start_agent() {  # memory tier size
  "$dir/bin/dpukv" --log-level warning agent --socket "$tmp/agent.sock" --memory-bytes "$1" \
    --max-chunk-size 64M --metrics-port 0 --pin-timeout-ms "$2" \
    --dma-threads "${GPU_CHECK_DMA_THREADS:-4}" ${GPU_CHECK_AGENT_ARGS:-} >>"$tmp/agent.log" 2>&1 &
  agent=$!
  until [ -S "$tmp/agent.sock" ]; do
    kill -0 $agent 2>/dev/null || { echo "the agent exited: $(cat "$tmp/agent.log")" >&2; return 1; }
    sleep 0.05
  done
}
stop_agent() { kill $agent 2>/dev/null; wait $agent 2>/dev/null || true; agent=""; rm -f "$tmp/agent.sock"; }
if [ "${GPU_CHECK_TESTS:-1}" = 0 ]; then
  echo "connector: not run (GPU_CHECK_TESTS=0)" >"$tmp/connector.log"
elif start_agent "${GPU_CHECK_AGENT_MEMORY:-1G}" 1000; then
  DPUKV_TEST_DEVICE=$device DPUKV_TEST_PATH=gpu timeout "${GPU_CHECK_TEST_TIMEOUT:-300}" \
    "$py" "$dir/python/tests/test_connector.py" "$dir/python" \
    "$tmp/agent.sock" >"$tmp/connector.log" 2>&1 || rc=1
  stop_agent
else
  echo "agent did not start" >"$tmp/connector.log"
  rc=1
fi
bench_args=(--shape llama-8b)
[ "$device" = cuda ] || bench_args=(--device "$device" --shape small --prefixes 256 --reps 1)
# shellcheck disable=SC2206  # words on purpose
[ -z "${GPU_CHECK_BENCH_ARGS:-}" ] || bench_args=($GPU_CHECK_BENCH_ARGS)
if [ "${GPU_CHECK_BENCH:-1}" != 0 ] && start_agent "${GPU_CHECK_AGENT_MEMORY:-24G}" 30000; then
  timeout "${GPU_CHECK_BENCH_TIMEOUT:-1200}" \
    "$py" "$dir/python/benchmarks/bench_connector.py" "$dir/python" "$tmp/agent.sock" "${bench_args[@]}" \
    >"$tmp/bench.json" 2>"$tmp/bench.log" || rc=1
  stop_agent
  # The agent's copies again with checksums on host threads (--gpu-checksum host):
  # the other design, same machine, same run. GPU only (the double has no timing).
  if [ "$device" = cuda ] && [ "${GPU_CHECK_HOST_CHECKSUMS:-1}" != 0 ] &&
    GPU_CHECK_AGENT_ARGS="--gpu-checksum host" start_agent "${GPU_CHECK_AGENT_MEMORY:-24G}" 30000; then
    timeout "${GPU_CHECK_BENCH_TIMEOUT:-1200}" \
      "$py" "$dir/python/benchmarks/bench_connector.py" "$dir/python" "$tmp/agent.sock" \
      --shape llama-8b --only copies >"$tmp/bench_host.json" 2>"$tmp/bench_host.log" || rc=1
    stop_agent
  fi
fi
gpu=$(nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader 2>/dev/null | head -1 || true)
"$py" - "$tmp" "$DPUKV_CUDA_DRIVER" "$gpu" "${tests[@]}" <<'PY'
import json, os, sys
tmp, driver, gpu, tests = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
out = {"gpu_check": "dpukv", "driver": driver, "gpu": gpu, "tests": {}}
def tail(name):
    p = os.path.join(tmp, name)
    return open(p).read()[-2000:] if os.path.exists(p) else ""
for t in tests:
    path = os.path.join(tmp, t + ".json")
    if not os.path.exists(path):
        out["tests"][t] = {"error": tail(t + ".log")}
        continue
    for suite in json.load(open(path))["testsuites"]:
        for case in suite["testsuite"]:
            name = suite["name"] + "." + case["name"]
            res = "skipped" if case.get("result") == "SKIPPED" else (
                "failed" if case.get("failures") else "passed")
            out["tests"][name] = {"result": res, "seconds": case.get("time")}
log = tail("connector.log")
out["tests"]["python.connector_cuda"] = {
    "result": "passed" if "connector: ok" in log else
              "skipped" if "not run" in log else "failed", "output": log.strip()[-600:]}
for key, name in (("bench_connector", "bench"), ("bench_connector_host_checksums", "bench_host")):
    bench = os.path.join(tmp, name + ".json")
    if os.path.exists(bench) and os.path.getsize(bench):
        try:
            out[key] = json.load(open(bench))
        except ValueError:
            out[key] = {"error": tail(name + ".json") + tail(name + ".log")}
print(json.dumps(out, indent=2))
PY
exit $rc
