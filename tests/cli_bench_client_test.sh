#!/usr/bin/env bash
# `dpukv bench client --json`: per-size rows with store/retrieve GB/s, the same-run
# memcpy baseline and ratios, and the lookup row against the comch round trip.
set -euo pipefail
bin=$1
out=$("$bin" bench client --sizes 1M,4M --bytes 64M --rtt-iterations 200 --json)
py=/usr/bin/python3
[ -x "$py" ] || py=python3
echo "$out" | "$py" -c '
import json, sys
d = json.load(sys.stdin)
assert d["bench"] == "client"
rows = d["results"]
sizes = [r for r in rows if "size_bytes" in r]
assert [r["size_bytes"] for r in sizes] == [1 << 20, 4 << 20], sizes
for r in sizes:
    for k in ("store_gbps", "retrieve_gbps", "baseline_gbps", "store_ratio", "retrieve_ratio"):
        assert r[k] > 0, (k, r)
lk = [r for r in rows if r.get("op") == "lookup-1-key"][0]
assert lk["lookup_rtt_p50_us"] > 0 and lk["comch_rtt_p50_us"] > 0 and lk["ratio"] > 0, lk
'
echo "cli bench client: ok"
