#!/usr/bin/env bash
# `dpukv bench compress --json`: every row carries its same-run baseline; lossy rows
# carry their error.
set -euo pipefail
bin=$1
out=$("$bin" bench compress --layers 1 --reps 1 --json)
py=/usr/bin/python3
[ -x "$py" ] || py=python3
echo "$out" | "$py" -c '
import json, sys
d = json.load(sys.stdin)
assert d["bench"] == "compress"
# What the figures were measured on, read from the machine itself.
m = d["machine"]
assert m["cpus"] == __import__("os").sysconf("SC_NPROCESSORS_ONLN") and m["isa"] in ("avx512", "avx2", "sse4.2", "neon", "scalar"), m
assert m["cpu"] != "unknown" and m["kernel"] == __import__("os").uname().release, m
rows = d["results"]
assert {r["dataset"] for r in rows} == {"kv_bf16", "kv_fp16", "iid_bf16"}
for r in rows:
    for k in ("dataset", "codec", "ratio", "compress_gbps", "decompress_gbps", "baseline_codec",
              "baseline_ratio", "baseline_compress_gbps"):
        assert k in r, (k, r)
    assert r["ratio"] > 0 and r["compress_gbps"] > 0 and r["baseline_compress_gbps"] > 0, r
    assert r["kv_simd"] in ("avx512", "avx2", "scalar"), r
    assert r["huffman"] in ("x86-64-v3", "portable"), r
    if r["codec"] in ("kv-int8", "kv-int4"):
        assert 0 < r["rel_rmse"] < 0.1, r
codecs = {r["codec"] for r in rows}
assert {"kv-lossless-delta", "kv-int8", "kv-int4", "lz4", "zstd-1", "zstd-1+shuffle"} <= codecs, codecs
'
# The portable kernels on request, named in every row.
"$bin" bench compress --layers 1 --reps 1 --datasets kv_bf16 --codecs kv-int8,kv-lossless --simd scalar --json |
  "$py" -c 'import json, sys; rows = json.load(sys.stdin)["results"]
assert rows and all(r["kv_simd"] == "scalar" and r["huffman"] == "portable" for r in rows), rows'
# The human table ends with the machine line.
"$bin" bench compress --layers 1 --reps 1 --codecs lz4 | tail -1 | grep -q "^machine: .*, [0-9]* CPUs, "
set +e
"$bin" bench compress --codecs nosuch > /dev/null 2>&1; rc=$?
set -e
[ "$rc" -eq 2 ]
set +e
"$bin" bench compress --simd sse9 > /dev/null 2>&1; rc=$?
set -e
[ "$rc" -ne 0 ]
echo "cli bench compress: ok"
