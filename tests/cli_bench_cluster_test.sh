#!/usr/bin/env bash
# `dpukv bench cluster --json`: one-sided reads from a peer process over UCX TCP,
# shared memory and (as root) TCP between two network namespaces, each row with its
# same-run baseline (raw TCP stream, memcpy) and ratio (the bench itself checks the bytes it read), a directory lookup of 64 keys
# from a replica and from Redis against one Redis round trip (the bench starts a
# redis-server), the time for a new entry to reach another node's replica, and a
# prefill-to-decode transfer between two agent processes against a store and
# retrieve on one agent.
set -euo pipefail
bin=$1
out=$("$bin" bench cluster --size 1M --reps 3 --pd-chunks 16 --json 2>/dev/null)
py=/usr/bin/python3
[ -x "$py" ] || py=python3
echo "$out" | ROOT=$([ "$(id -u)" = 0 ] && echo 1 || echo 0) "$py" -c '
import json, os, sys
d = json.load(sys.stdin)
assert d["bench"] == "cluster"
rows = {r["transport"]: r for r in d["results"] if r["op"] == "remote_read"}
look = {r["replica"]: r for r in d["results"] if r["op"] == "directory_lookup"}
assert set(look) == {True, False}, look
for r in look.values():
    assert r["keys"] == 64 and r["seconds"] > 0 and r["baseline_seconds"] > 0, r
    assert abs(r["ratio"] - r["seconds"] / r["baseline_seconds"]) < 1e-9, r
prop = [r for r in d["results"] if r["op"] == "directory_propagation"]
assert len(prop) == 1 and prop[0]["seconds"] > 0 and prop[0]["baseline_seconds"] > 0, prop
floor = [r for r in d["results"] if r["op"] == "directory_mget_floor"]
assert len(floor) == 1 and floor[0]["seconds"] > 0 and floor[0]["baseline_seconds"] > 0, floor
want = {"tcp", "shm", "netns"} if os.environ["ROOT"] == "1" else {"tcp", "shm"}
assert set(rows) == want, (rows, want)
pd = [r for r in d["results"] if r["op"] == "pd_transfer"]
assert len(pd) == 1 and pd[0]["chunks"] == 16 and pd[0]["size_bytes"] == 16 << 18, pd
assert 0 < pd[0]["push_seconds"] < pd[0]["seconds"] and pd[0]["baseline_seconds"] > 0, pd
# The floor: the work of one agent plus the same bytes through a raw loopback TCP stream.
assert pd[0]["tcp_stream_seconds"] > 0, pd
assert abs(pd[0]["floor_seconds"] - pd[0]["baseline_seconds"] - pd[0]["tcp_stream_seconds"]) < 1e-9, pd
assert abs(pd[0]["floor_ratio"] * pd[0]["baseline_seconds"] - pd[0]["floor_seconds"]) < 1e-9, pd
# The breakdown: each part of the transfer and of the baseline, none longer than its whole.
for k in ("store_seconds", "decode_seconds"):
    assert 0 < pd[0][k] < pd[0]["seconds"], (k, pd)
for k in ("baseline_store_seconds", "baseline_retrieve_seconds"):
    assert 0 < pd[0][k] < pd[0]["baseline_seconds"], (k, pd)
assert abs(pd[0]["ratio"] - pd[0]["seconds"] / pd[0]["baseline_seconds"]) < 1e-9, pd
assert rows["tcp"]["baseline"] == "raw TCP stream" and rows["shm"]["baseline"] == "memcpy"
assert rows["tcp"]["peer_failure_detection"] and not rows["shm"]["peer_failure_detection"]
if "netns" in rows:
    assert rows["netns"]["baseline"] == "raw TCP stream" and rows["netns"]["peer_failure_detection"]
for r in rows.values():
    assert r["size_bytes"] == 1 << 20 and r["gbps"] > 0 and r["baseline_gbps"] > 0, r
    # The UCX settings each row ran with; TCP segments as dpukv sets them unless
    # the environment says otherwise.
    assert r["ucx"].startswith("UCX 1.") and "UCX_TLS=" in r["ucx"], r
    if "UCX_TCP_TX_SEG_SIZE" not in os.environ:
        assert "UCX_TCP_TX_SEG_SIZE=256k" in r["ucx"], r
    assert abs(r["ratio"] - r["gbps"] / r["baseline_gbps"]) < 1e-9, r
'
echo "cli bench cluster: ok"
