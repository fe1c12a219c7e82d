#!/usr/bin/env bash
# Faults a new (or hostile) user finds, each checked through the real binary:
# bad numbers in flags, config and environment (exit 2, the setting named); two
# agents on one disk directory; a metrics port in use; systemd readiness and
# SIGHUP; `dpukv stat`; replay with a disk tier (hit ratio at the same-run LRU
# simulation of memory + disk, two clients with no failure), a plot name that a
# shell would run, malformed traces, and an agent that outlives a killed replay.
set -euo pipefail
bin=$(realpath "$1")
trace=$(realpath "$2")
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do [ "$p" -gt 0 ] && kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
py=/usr/bin/python3
[ -x "$py" ] || py=python3
fail() { echo "FAIL: $*"; exit 1; }
expect_exit() {  # expect_exit CODE PATTERN -- command...
  local want=$1 pat=$2; shift 3
  set +e; timeout 120 "$@" >"$tmp/out" 2>&1; local rc=$?; set -e
  [ "$rc" -eq "$want" ] || { cat "$tmp/out"; fail "exit $rc, not $want: $*"; }
  grep -q -- "$pat" "$tmp/out" || { cat "$tmp/out"; fail "no '$pat' from: $*"; }
}
# A busy machine makes an agent slow to start, not absent: two minutes.
wait_socket() { for _ in $(seq 2400); do [ -S "$1" ] && return 0; sleep 0.05; done; fail "no socket $1"; }

# Numbers: one parser, exit 2, the setting named.
a="$bin --log-level error agent --socket $tmp/n.sock"
expect_exit 2 "max-local-disk-size" -- $a --local-disk "$tmp/d0" --max-local-disk-size -1
expect_exit 2 "not a size" -- $a --max-local-cpu-size 1e30
expect_exit 2 "not a size" -- $a --max-local-cpu-size nan
expect_exit 2 "not a port" -- $a --metrics-port 70000
expect_exit 2 "not a port" -- $a --metrics-port -5
expect_exit 2 "no disk tier to size" -- $a --max-local-disk-size 1
expect_exit 2 "smaller than max_chunk_size" -- $a --memory-bytes 1M --max-chunk-size 4M
expect_exit 2 "DPUKV_METRICS_PORT" -- env DPUKV_METRICS_PORT=xyz $a
printf 'max_local_cpu_size: 0.25abc\n' > "$tmp/bad.yaml"
expect_exit 2 "bad.yaml:1" -- $a --config "$tmp/bad.yaml"
printf 'no_such_setting: 1\n' > "$tmp/unknown.yaml"
expect_exit 2 "unknown setting" -- $a --config "$tmp/unknown.yaml"
expect_exit 2 "not a regular file" -- $a --config "$tmp"
expect_exit 2 "" -- "$bin" agent --no-such-flag

expect_exit 2 "from 1 to 64" -- $a --dma-threads 0
expect_exit 2 "from 1 to 64" -- $a --dma-threads 99  # the same words as for 0 (issue 34.12)
expect_exit 2 "0 or more" -- "$bin" events --count -1 --socket "$tmp/none.sock"
# A socket that accepts and never answers: `dpukv rpc` gives up at -t (issue 34.10).
$py -c 'import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8); time.sleep(600)' \
  "$tmp/silent.sock" &
pids+=($!)
wait_socket "$tmp/silent.sock"
expect_exit 1 "no answer within 1 s" -- "$bin" rpc -s "$tmp/silent.sock" -t 1 nvmf_get_subsystems
for v in -1 nan inf; do expect_exit 2 "speedup" -- "$bin" replay "$trace" --speedup "$v"; done
expect_exit 2 "timeout" -- "$bin" rpc -t -1 nvmf_get_subsystems
expect_exit 2 "not a size of whole blocks" -- "$bin" nvme target --socket "$tmp/nv.sock" --size abc
expect_exit 2 "worst case" -- $a --compress --memory-bytes 64M

# Errors name their cause, and settings are checked before the memory tier is
# made: a 4 GiB tier would take seconds to pre-fault on a busy machine.
expect_exit 2 "too long for a UNIX socket" -- "$bin" agent --socket "/tmp/$(printf 'x%.0s' $(seq 120))" --metrics-port 0 --memory-bytes 4G
expect_exit 2 "does not exist" -- "$bin" agent --socket "$tmp/no/such/dir/a.sock" --metrics-port 0 --memory-bytes 4G
# The example config documents every setting, and the agent takes it as it is.
src=$(dirname "$(realpath "$0")")/..
"$bin" --log-level error agent --config "$src/examples/agent.yaml" --socket "$tmp/ex.sock" \
  --metrics-port 0 --max-local-cpu-size 64M &
ex=$!
pids+=("$ex")
wait_socket "$tmp/ex.sock"
"$bin" stat --socket "$tmp/ex.sock" | grep -q "memory tier    0.0 MiB of 64.0 MiB"
kill -TERM "$ex"
wait "$ex"
for name in $("$py" - "$src/src/tools/agent/agent_cmd.cc" <<'PY'
import re, sys
print(" ".join(re.findall(r'\{"([a-z_]+)", (?:"DPUKV_[A-Z_]+"|nullptr), Kind::', open(sys.argv[1]).read())))
PY
); do
  grep -qE "^#? ?$name:" "$src/examples/agent.yaml" || fail "examples/agent.yaml does not document $name"
done

# Agent A with a disk tier and metrics; readiness through NOTIFY_SOCKET.
port=$((20000 + $$ % 12000))  # below the ephemeral ports (32768-)
"$py" - "$tmp/notify" > "$tmp/notified" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1]); s.settimeout(20)
print(s.recv(256).decode())
PY
listener=$!
for _ in $(seq 100); do [ -S "$tmp/notify" ] && break; sleep 0.05; done
NOTIFY_SOCKET="$tmp/notify" "$bin" --log-level info agent --socket "$tmp/a.sock" --memory-bytes 64M \
  --max-chunk-size 1M --local-disk "$tmp/disk" --max-local-disk-size 64M --metrics-port "$port" \
  2> "$tmp/a.log" &
agent=$!
pids+=("$agent")
wait_socket "$tmp/a.sock"
wait "$listener"
grep -q "READY=1" "$tmp/notified" || fail "no READY=1 on NOTIFY_SOCKET"
grep -q "dpukv agent .* starting (pid $agent)" "$tmp/a.log" || fail "no version line at start"
grep -qE '^\[[0-9]{4}-[0-9]{2}-[0-9]{2} ' "$tmp/a.log" || fail "log lines carry no date"

# A second agent on the same directory is refused, naming the first one's pid;
# one on the same metrics port says the port is in use.
expect_exit 1 "in use by another agent (pid $agent)" -- "$bin" agent --socket "$tmp/b.sock" \
  --memory-bytes 64M --max-chunk-size 1M --local-disk "$tmp/disk" --max-local-disk-size 64M \
  --metrics-port 0
expect_exit 1 "cannot start: metrics: cannot listen on 127.0.0.1:$port: Address already in use" -- \
  "$bin" agent --socket "$tmp/c.sock" --memory-bytes 64M --max-chunk-size 1M --metrics-port "$port"
# stat says why it reached no agent: nothing there, or no permission.
expect_exit 1 "no agent at $tmp/none.sock (No such file" -- "$bin" stat --socket "$tmp/none.sock"
if [ "$(id -u)" -eq 0 ] && id nobody >/dev/null 2>&1 && command -v setpriv >/dev/null; then
  chmod 755 "$tmp"
  expect_exit 1 "permission denied on $tmp/a.sock" -- \
    setpriv --reuid=nobody --regid=nogroup --clear-groups "$bin" stat --socket "$tmp/a.sock"
fi

# SIGHUP does not end it; stat shows the version, tiers in MiB, and not itself.
kill -HUP "$agent"
sleep 0.3
kill -0 "$agent" || fail "SIGHUP ended the agent"
"$bin" stat --socket "$tmp/a.sock" > "$tmp/stat"
grep -q "agent          dpukv" "$tmp/stat" || fail "stat: no version"
grep -q "clients        0 connected" "$tmp/stat" || fail "stat counts its own connection"
grep -q "disk tier      0.0 MiB of 64.0 MiB" "$tmp/stat" || { cat "$tmp/stat"; fail "stat: disk tier"; }
grep -q "SIGHUP" "$tmp/a.log" || fail "SIGHUP not logged"
kill -TERM "$agent"
wait "$agent"

# Replay with a disk tier: at the LRU simulation of memory + disk (-0.1 pt), and
# with two clients, no failure and exit 0.
"$bin" replay "$trace" --max-requests 3000 --capacity-blocks 500 --disk-blocks 1500 --eviction lru --json \
  > "$tmp/disk.json"
"$bin" replay "$trace" --max-requests 3000 --capacity-blocks 500 --disk-blocks 500 --clients 2 \
  --json > "$tmp/two.json"
"$py" - "$tmp/disk.json" "$tmp/two.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["block_hit_ratio"] >= d["hierarchy_lru_sim_block_hit_ratio"] - 0.001, d
assert d["hierarchy_lru_sim_block_hit_ratio"] > d["lru_sim_block_hit_ratio"], d
assert d["agent"]["disk_evictions"] > 0, d["agent"]
# Each tier has its bound; the hierarchy's is the one the agent is measured against.
mem, both = d["tiers"]
assert (mem["tier"], both["tier"]) == ("memory", "memory+disk"), d["tiers"]
assert both["capacity_blocks"] == 2000 and both["optimum_block_hit_ratio"] > mem["optimum_block_hit_ratio"]
assert d["optimum_block_hit_ratio"] == both["optimum_block_hit_ratio"] >= d["block_hit_ratio"], d
for path in sys.argv[1:]:
    r = json.load(open(path))
    assert r["failures"] == {} and r["errors"] == 0 and r["verify_failures"] == 0, r
PY

# A plot file name is a name, never a command.
(cd "$tmp" && "$bin" replay "$trace" --max-requests 200 --plot 'x$(touch pwned).png' >/dev/null)
[ ! -e "$tmp/pwned" ] || fail "the plot name ran a command"
[ -s "$tmp/x\$(touch pwned).png" ] || fail "no plot under its literal name"
expect_exit 1 "no plot" -- "$bin" replay "$trace" --max-requests 50 --plot "$tmp/no/such/dir.png"

# Malformed traces: a clear message with the line, exit 2.
printf '{"timestamp": 5, "input_length": 600, "hash_ids": [1, 2]}\n{"timestamp": 3, "input_length": 600, "hash_ids": [1, 2]}\n' > "$tmp/back.jsonl"
expect_exit 2 "back.jsonl:2: timestamp" -- "$bin" replay "$tmp/back.jsonl"
"$py" -c 'import json; print(json.dumps({"timestamp": 1, "input_length": 10, "hash_ids": list(range(3000000))}))' > "$tmp/huge.jsonl"
expect_exit 2 "huge.jsonl:1: 3000000 hash_ids" -- "$bin" replay "$tmp/huge.jsonl"
printf '{"timestamp": 1, "input_length": 0, "hash_ids": []}\n' > "$tmp/none.jsonl"
expect_exit 2 "name no blocks" -- "$bin" replay "$tmp/none.jsonl"

# The agent a replay starts dies with it.
"$bin" replay "$trace" --speedup 1 > /dev/null 2>&1 &
rp=$!
pids+=("$rp")
child=""
for _ in $(seq 200); do
  child=$(cat /proc/"$rp"/task/*/children 2>/dev/null | awk '{print $1}' || true)
  [ -n "$child" ] && [ -S "/tmp/dpukv-replay-$rp.sock" ] && break
  sleep 0.05
done
[ -n "$child" ] || fail "replay started no agent"
pids+=("$child")
kill -9 "$rp"
for _ in $(seq 100); do kill -0 "$child" 2>/dev/null || break; sleep 0.05; done
kill -0 "$child" 2>/dev/null && fail "the replay's agent outlived it"
rm -f "/tmp/dpukv-replay-$rp.sock"
echo "cli hardening: ok"
