#!/usr/bin/env bash
# `dpukv bench cluster --json`: one-sided reads from a peer process over UCX TCP and
# shared memory, each row with its same-run baseline (raw TCP stream, memcpy) and
# ratio; the bench itself checks the bytes it read.
set -euo pipefail
bin=$1
out=$("$bin" bench cluster --size 1M --reps 3 --json 2>/dev/null)
py=/usr/bin/python3
[ -x "$py" ] || py=python3
echo "$out" | "$py" -c '
import json, sys
d = json.load(sys.stdin)
assert d["bench"] == "cluster"
rows = {r["transport"]: r for r in d["results"]}
assert set(rows) == {"tcp", "shm"}, rows
assert rows["tcp"]["baseline"] == "raw TCP stream" and rows["shm"]["baseline"] == "memcpy"
assert rows["tcp"]["peer_failure_detection"] and not rows["shm"]["peer_failure_detection"]
for r in rows.values():
    assert r["size_bytes"] == 1 << 20 and r["gbps"] > 0 and r["baseline_gbps"] > 0, r
    assert abs(r["ratio"] - r["gbps"] / r["baseline_gbps"]) < 1e-9, r
'
echo "cli bench cluster: ok"
