#!/usr/bin/env bash
# `dpukv bench cache --json`: rows for store, retrieve, lookup, index, spill and
# reload, each with its same-run baseline and ratio.
set -euo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$("$bin" bench cache --sizes 256K,1M --pool-size 64M --queue-depth 8 --disk-dir "$tmp/disk" --disk-size 64M --disk-sizes 256K,1M --disk-rounds 1 --json)
py=/usr/bin/python3
[ -x "$py" ] || py=python3
echo "$out" | "$py" -c '
import json, sys
d = json.load(sys.stdin)
assert d["bench"] == "cache"
ops = {}
for r in d["results"]:
    ops.setdefault(r["op"], []).append(r)
assert set(ops) == {"store", "retrieve", "lookup", "index", "spill", "reload"}, set(ops)
for op in ("store", "retrieve", "spill", "reload"):
    for r in ops[op]:
        assert r["gbps"] > 0 and r["baseline_gbps"] > 0, r
        assert abs(r["ratio"] - r["gbps"] / r["baseline_gbps"]) < 1e-9, r
assert ops["lookup"][0]["keys_per_s"] > 0 and ops["lookup"][0]["baseline_keys_per_s"] > 0
# The index is measured under every policy, against LRU, and one is the default.
policies = {r["policy"]: r for r in ops["index"]}
assert {"lru", "s3fifo", "arc"} <= set(policies), policies
for r in ops["index"]:
    assert r["bytes_per_chunk"] > 0 and r["baseline_bytes_per_chunk"] == policies["lru"]["bytes_per_chunk"], r
    assert abs(r["ratio"] - r["bytes_per_chunk"] / r["baseline_bytes_per_chunk"]) < 1e-9, r
assert sum(1 for r in ops["index"] if r["default"]) == 1
# The disk tier is measured at every size asked for.
for op in ("spill", "reload"):
    assert sorted(r["size_bytes"] for r in ops[op]) == [256 << 10, 1 << 20], ops[op]
'
# A disk size the tier cannot spill at is refused, not measured.
set +e
"$bin" bench cache --sizes 256K --pool-size 64M --disk-dir "$tmp/disk" --disk-size 64M --disk-sizes 4M > "$tmp/err" 2>&1; rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "at most 1/64 of --disk-size" "$tmp/err"
echo "cli bench cache: ok"
