#!/usr/bin/env bash
# `pip install ./python` gives a working package: python_pip_test.sh BIN CLIENT_LIB PYDIR
# installs a copy of PYDIR (so nothing is built in the source tree) into a fresh
# venv, offline (Debian's setuptools, no build isolation), then imports it from
# outside the sources and stores, looks up and retrieves through the ctypes client
# (libdpukv_client.so: CLIENT_LIB) against a real agent. Exit 77 (skipped) without
# Debian's venv and pip.
set -euo pipefail
bin=$(realpath "$1")
lib=$(realpath "$2")
pydir=$(realpath "$3")
tmp=$(mktemp -d)
agent=""
trap '[ -n "$agent" ] && kill $agent 2>/dev/null; rm -rf "$tmp"' EXIT
/usr/bin/python3 -m venv --help >/dev/null 2>&1 && /usr/bin/python3 -m pip --version >/dev/null 2>&1 ||
  { echo "SKIP: no python3-venv or python3-pip (scripts/deps.sh --test installs them)"; exit 77; }
cp -r "$pydir" "$tmp/src"
rm -rf "$tmp/src/build" "$tmp"/src/*.egg-info
/usr/bin/python3 -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/pip" install --quiet --no-index --no-build-isolation --no-deps "$tmp/src" \
  > "$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log"; echo "pip install failed"; exit 1; }
"$bin" --log-level warning agent --socket "$tmp/a.sock" --memory-bytes 64M --max-chunk-size 1M \
  --metrics-port 0 &
agent=$!
until [ -S "$tmp/a.sock" ]; do
  kill -0 $agent 2>/dev/null || { echo "the agent exited before it listened"; exit 1; }
  sleep 0.05
done
# Under ASan the library needs the sanitizer runtimes loaded first.
preload=""
if ldd "$lib" | grep libasan >/dev/null; then
  preload=$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)
fi
cd "$tmp"  # not the sources: the installed package is the one imported
env ${preload:+LD_PRELOAD=$preload ASAN_OPTIONS=detect_leaks=0} DPUKV_CLIENT_LIB="$lib" \
  PYTHONDONTWRITEBYTECODE=1 "$tmp/venv/bin/python" - "$tmp/a.sock" "$tmp/venv" <<'PY'
import ctypes, os, sys
import dpukv
where = os.path.realpath(dpukv.__file__)
assert where.startswith(os.path.realpath(sys.argv[2])), where  # the venv's copy
assert dpukv.client_kind == "ctypes", dpukv.client_kind
from importlib.metadata import version
assert version("dpukv") == dpukv.__version__, (version("dpukv"), dpukv.__version__)
c = dpukv.Client(sys.argv[1], model=dpukv.model_id("pip-model"))
buf = c.alloc_staging(1 << 20)  # a ctypes array over the shared memory
base = ctypes.addressof(buf)
keys = dpukv.chunk_keys(dpukv.model_id("pip-model"), list(range(512)), 256)
data = [bytes([(i * 13 + j) % 251 for j in range(4096)]) for i in range(2)]
for i in range(2):
    ctypes.memmove(base + i * 4096, data[i], 4096)
assert c.store(buf, keys, [0, 4096], [4096, 4096]) == ["SUCCESS"] * 2
assert c.lookup(keys) == 2
import json
assert json.loads(c.stats())["version"] == dpukv.__version__  # the package is the agent's
ctypes.memset(base, 0, 8192)
assert c.retrieve(buf, keys, [0, 4096], [4096, 4096]) == ["SUCCESS"] * 2
for i in range(2):
    assert ctypes.string_at(base + i * 4096, 4096) == data[i]
print("pip install ./python: ok, dpukv", dpukv.__version__, "from", where)
PY
# Issue 34.12: without the client library, the import says what to install or set
# (it was a raw OSError from ctypes).
set +e
env DPUKV_CLIENT_LIB="$tmp/no-such/libdpukv_client.so.0" PYTHONDONTWRITEBYTECODE=1 \
  "$tmp/venv/bin/python" -c "import dpukv" >"$tmp/noload.log" 2>&1
rc=$?
set -e
[ "$rc" -ne 0 ] || { echo "import dpukv succeeded without its client library"; exit 1; }
grep -q "ImportError: dpukv: the client library .* could not be loaded" "$tmp/noload.log" &&
  grep -q "DPUKV_CLIENT_LIB" "$tmp/noload.log" ||
  { cat "$tmp/noload.log"; echo "the import's error does not say what to install or set"; exit 1; }
