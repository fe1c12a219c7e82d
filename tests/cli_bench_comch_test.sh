#!/usr/bin/env bash
# Runs `dpukv bench comch --json` and checks that every row carries its same-run
# baseline and ratio, for each path the issue names.
set -euo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" bench comch --help | grep -- "--placement" > /dev/null
"$bin" bench comch --sizes 64,4K --iterations 200 --oneway-messages 2000 --bulk-seconds 0.2 \
  --json --csv-output-file "$tmp/c.csv" > "$tmp/out.json"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
"$py" - "$tmp/out.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["bench"] == "comch", d
rows = d["results"]
paths = {r["path"] for r in rows}
assert paths == {"control", "control-oneway", "fast-spin", "fast-sleep", "fast-bulk"}, paths
for r in rows:
    assert r["ratio"] > 0, r
    assert "placement" in r, r
    if r["path"] == "fast-bulk":
        assert r["gbps"] > 0 and r["baseline_gbps"] > 0
        assert abs(r["ratio"] - r["gbps"] / r["baseline_gbps"]) < 1e-9
    elif r["path"] == "control-oneway":
        assert r["msgs_per_s"] > 0 and r["baseline_msgs_per_s"] > 0
    else:
        assert r["rtt_p50_us"] > 0 and r["baseline_rtt_p50_us"] > 0
        assert abs(r["ratio"] - r["rtt_p50_us"] / r["baseline_rtt_p50_us"]) < 1e-9
PY
[ "$(wc -l < "$tmp/c.csv")" -eq 10 ]   # header + 9 rows
echo "cli bench comch: ok"
