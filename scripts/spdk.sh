#!/usr/bin/env bash
# Finds or builds SPDK v24.01 (the third-party NVMe stack the interop test runs
# against) with the shared build script, and prints the directory that holds its
# build/ (what DPUKV_SPDK_DIR names). About 5 minutes on 2 cores the first time;
# kept in $SPDK_OUT (default /tmp/spdk) for the next run.
#   scripts/spdk.sh     exit 3 if the sources are not beside the project; any
#                       other failure is the build's
set -euo pipefail
cd "$(dirname "$0")/.."
out=${SPDK_OUT:-/tmp/spdk}
build=../shared/thirdparty/spdk/build.sh
if [ -x "$out/src/build/bin/spdk_nvme_perf" ] && [ -x "$out/src/test/nvme/compliance/nvme_compliance" ]; then
  echo "$out/src"; exit 0
fi
if [ ! -x "$build" ]; then
  echo "spdk.sh: no $build (SPDK's sources and build script); the interop test will be skipped" >&2
  exit 3
fi
echo "spdk.sh: building SPDK into $out (about 5 minutes)" >&2
"$build" "$out" | tail -1
