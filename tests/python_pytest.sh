#!/usr/bin/env bash
# Runs a pytest file of python/tests: python_pytest.sh BIN PKGDIR TESTFILE
# (PKGDIR: the folder that holds the dpukv package with its compiled client; the
# fixtures start their agents with BIN). Under ASan the extension needs the
# sanitizer runtimes loaded first, as tests/python_test.sh does.
set -euo pipefail
bin=$1
pkgdir=$2
file=$3
preload=""
if ldd "$pkgdir"/dpukv/_dpukv*.so | grep libasan >/dev/null; then
  preload=$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)
fi
# No cache or bytecode written into the source tree.
export DPUKV_BIN=$bin DPUKV_PY_PACKAGE_DIR=$pkgdir PYTHONDONTWRITEBYTECODE=1
if [ -n "$preload" ]; then
  export LD_PRELOAD=$preload ASAN_OPTIONS=detect_leaks=0
fi
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider "$file"
