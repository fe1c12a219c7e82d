#!/usr/bin/env bash
# Runs `dpukv bench dma` as a user would and checks its outputs are well formed
# and that every row carries its same-run baseline and ratio.
set -euo pipefail
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin" bench dma --help | grep -- "--queue-depth" > /dev/null

out=$("$bin" bench dma --sizes 64,256K --queue-depth 16 --duration 0.05 --warmup 0.01 \
      --pool-size 64M --mode both --json --csv-output-file "$tmp/dma.csv" \
      --latency-bucket-range 0,5)
py=/usr/bin/python3
[ -x "$py" ] || py=python3
echo "$out" | "$py" -c '
import json, sys
d = json.load(sys.stdin)
assert d["bench"] == "dma", d
rows = d["results"]
assert len(rows) == 6, len(rows)   # 2 sizes x (local, to-peer, from-peer)
for r in rows:
    for k in ("mode", "size_bytes", "engine_gbps", "baseline_gbps", "ratio", "tasks_per_s", "p50_us", "p99_us"):
        assert k in r, (k, r)
    assert r["errors"] == 0, r
    assert r["engine_gbps"] > 0 and r["baseline_gbps"] > 0, r
    assert abs(r["ratio"] - r["engine_gbps"] / r["baseline_gbps"]) < 1e-9, r
    assert sum(r["histogram"]["counts"]) > 0, r
assert {r["mode"] for r in rows} == {"local", "cross-process"}
'
# CSV: a header and one line per row; append mode adds rows without a header.
[ "$(wc -l < "$tmp/dma.csv")" -eq 7 ]
"$bin" bench dma --sizes 4K --duration 0.02 --warmup 0 --pool-size 16M \
  --csv-output-file "$tmp/dma.csv" --csv-append-mode > /dev/null
[ "$(wc -l < "$tmp/dma.csv")" -eq 8 ]
[ "$(grep -c '^bench,' "$tmp/dma.csv")" -eq 1 ]

# Bad input is a clear error and exit code 2.
set +e
"$bin" bench dma --sizes 12Q > /dev/null 2> "$tmp/err"; rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "bad --sizes" "$tmp/err"
echo "cli bench dma: ok"
