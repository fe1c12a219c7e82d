#!/usr/bin/env bash
# The thin client as another language or an inference engine gets it: the shared
# library exports the C ABI of include/dpukv/client.h and nothing else, carries
# nothing of the cache, the engine contexts or io_uring, installs with its header and a
# pkg-config file, and a C program builds against the installed copy.
set -euo pipefail
build=$(realpath "$1")
src=$(realpath "$2")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
so=$build/libdpukv_client.so
fail() { echo "FAIL: $*"; exit 1; }
exported=$(nm -D --defined-only "$so" | awk '{print $3}' | sort)
declared=$(grep -oE '\bdpukv_[a-z_]+\(' "$src/include/dpukv/client.h" | tr -d '(' | sort -u)
[ "$exported" = "$declared" ] || { echo "exported: $exported"; echo "declared: $declared"; fail "exports differ from the header"; }
# (grep >/dev/null, not grep -q: under pipefail a grep that stops at its first match
# kills ldd or nm with SIGPIPE and the pipeline reads as "no match".)
if nm -C "$so" | grep -E 'CacheEngine|DmaEngine|CompressEngine|DiskTier|io_uring' >/dev/null; then
  fail "the client library carries the cache or the engines"
fi
# Of the engines it carries only the KV codecs (dpukv_kv_codec: ISA-L's CRC-32C for
# their headers), for a connector that encodes its own chunks.
if ldd "$so" | grep -E 'liburing|liblz4|libzstd' >/dev/null; then fail "the client library links engine libraries"; fi
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
export PKG_CONFIG_PATH=$tmp/prefix/lib/pkgconfig:$tmp/prefix/lib/x86_64-linux-gnu/pkgconfig
pkg-config --exists dpukv-client || fail "no dpukv-client.pc installed"
[ -f "$tmp/prefix/include/dpukv/client.h" ] || fail "no header installed"
san=()  # a sanitizer build's library needs the program built with the same runtime
if ldd "$so" | grep libasan >/dev/null; then san=(-fsanitize=address,undefined); fi
# shellcheck disable=SC2046
cc -std=c11 "${san[@]}" -o "$tmp/c_client" "$src/tests/c_api_test.c" $(pkg-config --cflags --libs dpukv-client)
LD_LIBRARY_PATH=$(pkg-config --variable=libdir dpukv-client) ldd "$tmp/c_client" | grep "$tmp/prefix" >/dev/null ||
  fail "the program does not load the installed library"
echo "client lib: ok"
