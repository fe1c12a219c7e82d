#!/usr/bin/env bash
# The agent and tools as a user runs them: agent on embedded defaults plus a socket,
# `dpukv stat` (human and --json), the C ABI from a C program, a short replay of
# the real trace whose hit ratio must equal the same-run LRU simulation, and a
# clean SIGTERM shutdown.
set -euo pipefail
bin=$1
c_client=$2
trace=$3
tmp=$(mktemp -d)
sock=$tmp/agent.sock
"$bin" --log-level warning agent --socket "$sock" --max-local-cpu-size 0.25 --max-chunk-size 1M --metrics-port 0 &
agent=$!
trap 'kill $agent 2>/dev/null || true; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
"$c_client" "$sock"
"$bin" stat --socket "$sock" | grep -q "chunks         2"
"$bin" stat --socket "$sock" --json | grep -q '"stores":2'
"$bin" cache clear --socket "$sock" | grep -q "cleared 2 chunks"
"$bin" stat --socket "$sock" | grep -q "chunks         0"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
"$bin" replay "$trace" --agent "$sock" --max-requests 400 --capacity-blocks 100000 --scale 16384 --json > "$tmp/r.json"
"$bin" replay "$trace" --max-requests 800 --capacity-blocks 1000 --eviction lru --json > "$tmp/own.json"
# Blocks stored as int4 KV (--kv-codec): every retrieve checked against a fresh
# encode and decoded; the same memory holds more of them.
"$bin" replay "$trace" --max-requests 300 --capacity-blocks 200 --kv-codec int4 --json > "$tmp/int4.json"
"$py" - "$tmp/r.json" "$tmp/own.json" "$tmp/int4.json" <<'PY'
import json, sys
int4 = json.load(open(sys.argv[3]))
assert int4["kv_codec"] == "int4" and int4["stored_block_bytes"] * 3.5 <= int4["block_bytes"], int4
assert int4["capacity_blocks_encoded"] >= 3.5 * 200, int4
assert int4["tiers"][0]["capacity_blocks"] == int4["capacity_blocks_encoded"], int4
for path in sys.argv[1:]:
    d = json.load(open(path))
    for k in ("requests", "block_hit_ratio", "token_hit_ratio", "lru_sim_block_hit_ratio", "capacity_blocks",
              "store_gbps", "retrieve_gbps", "verified_bytes", "agent_peak_rss_bytes"):
        assert k in d, (k, path)
    assert d["errors"] == 0 and d["verify_failures"] == 0, d
    assert d["block_hit_ratio"] > 0 and d["verified_bytes"] > 0, d
own = json.load(open(sys.argv[2]))
assert abs(own["block_hit_ratio"] - own["lru_sim_block_hit_ratio"]) <= 0.001, own
# The optimum of the same trace and capacity bounds both, and the ratios are to it.
opt = own["optimum_block_hit_ratio"]
assert opt >= own["lru_sim_block_hit_ratio"] and opt >= own["block_hit_ratio"] and opt < 1, own
assert abs(own["ratio_to_optimum"] - own["block_hit_ratio"] / opt) < 1e-9, own
(mem,) = own["tiers"]
assert mem["tier"] == "memory" and mem["capacity_blocks"] == 1000, mem
assert mem["optimum_prefix_hit_ratio"] <= mem["optimum_block_hit_ratio"] == opt, mem
assert own["agent_peak_rss_bytes"] > 0
PY
# A trace that is not one is refused with a clear message and exit 2.
echo '{"nope": 1}' > "$tmp/bad.jsonl"
set +e
"$bin" replay "$tmp/bad.jsonl" 2> "$tmp/err"; rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "not a trace record" "$tmp/err"
kill -TERM $agent
wait $agent
echo "cli agent: ok"
