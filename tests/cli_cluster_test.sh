#!/usr/bin/env bash
# Agents in a cluster, through the command line only: a Redis server and two
# `dpukv agent --cluster` processes the test starts on loopback. A replay through
# agent A stores the trace's blocks; the same replay through agent B finds them on
# A (remote hits), reads them into B and serves them, every byte checked; `dpukv
# stat` on B names its peer. `replay --nodes 2` does the same in one command (as
# root, each agent in a network namespace of its own, removed after). Bad
# cluster settings are refused with a message and exit code 2.
set -euo pipefail
bin=$1
src=$2
trace=$src/traces/mooncake_conversation_trace.jsonl
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "cli cluster: $*" >&2
  exit 1
}
py=/usr/bin/python3
[ -x "$py" ] || py=python3

# Refused settings.
set +e
msg=$("$bin" agent --socket "$tmp/x.sock" --cluster bogus://x 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "is not redis://" <<<"$msg" || fail "bad --cluster: rc $rc: $msg"
msg=$("$bin" agent --socket "$tmp/x.sock" --cluster redis://127.0.0.1:0 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "port of 1-65535" <<<"$msg" || fail "port 0: rc $rc: $msg"
msg=$("$bin" agent --socket "$tmp/x.sock" --cluster "" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "is empty" <<<"$msg" || fail "--cluster '': rc $rc: $msg"
msg=$("$bin" agent --socket "$tmp/x.sock" --cluster redis://u:hunter2@127.0.0.1:0 2>&1); rc=$?
[ $rc -eq 2 ] && ! grep -q hunter2 <<<"$msg" || fail "a password in an error: rc $rc: $msg"
msg=$("$bin" agent --socket "$tmp/x.sock" --advertise 127.0.0.1 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "cluster is not" <<<"$msg" || fail "--advertise alone: rc $rc: $msg"
msg=$("$bin" agent --socket "$tmp/x.sock" --remote-tier redis 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "lives in the cluster's Redis" <<<"$msg" || fail "--remote-tier alone: rc $rc: $msg"
msg=$("$bin" agent --socket "$tmp/x.sock" --cluster redis://127.0.0.1:1 --advertise 192.0.2.77 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "no interface of this host" <<<"$msg" || fail "foreign --advertise: rc $rc: $msg"
set -e

# Waits (however busy the machine) for a condition while process $1 lives.
until_alive() {  # pid what command...
  local pid=$1 what=$2
  shift 2
  until "$@"; do
    kill -0 "$pid" 2>/dev/null || fail "$what: the process exited"
    sleep 0.05
  done
}
start_redis() {  # port [options]
  local p=$1
  shift
  redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --logfile /dev/null "$@" &
  pids+=($!)
  until_alive $! "redis-server on $p" eval "(exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null"
}
free_port() {
  "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
port=$(free_port)
start_redis "$port"

agent() {  # name [extra arguments]
  local name=$1
  shift
  "$bin" --log-level warning agent --socket "$tmp/$name.sock" --memory-bytes 64M \
    --max-chunk-size 64K --metrics-port 0 --cluster "redis://127.0.0.1:$port" \
    --cluster-prefix "t$$" --advertise 127.0.0.1 "$@" 2>"$tmp/$name.log" &
  pids+=($!)
  local pid=$!
  until [ -S "$tmp/$name.sock" ]; do
    kill -0 $pid 2>/dev/null || fail "agent $name did not start: $(cat "$tmp/$name.log")"
    sleep 0.05
  done
}
agent a --directory-replica-keys 0  # a asks Redis; b answers from its replica
agent b
"$bin" replay "$trace" --agent "$tmp/a.sock" --max-requests 200 --json >"$tmp/a.json"
# B sees A live once it re-reads the live agents (every second).
b_sees_a() {
  "$bin" stat --socket "$tmp/b.sock" --json | "$py" -c '
import json, sys
sys.exit(0 if json.load(sys.stdin).get("cluster_live_nodes", 0) >= 2 else 1)'
}
until_alive "${pids[-1]}" "agent b sees a" b_sees_a
"$bin" replay "$trace" --agent "$tmp/b.sock" --max-requests 200 --json >"$tmp/b.json"
"$py" - "$tmp/a.json" "$tmp/b.json" <<'PYEOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["errors"] == 0 and b["errors"] == 0, (a["failures"], b["failures"])
assert a["verify_failures"] == 0 and b["verify_failures"] == 0
ag = b["agent"]
# B stored nothing of what A had: its first lookups found A's blocks remotely.
assert ag["lookup_remote_hits"] > 0, ag
assert ag["remote_hits"] >= ag["lookup_remote_hits"], ag
assert ag["remote_checksum_failures"] == 0 and ag["remote_read_errors"] == 0, ag
assert b["block_hit_ratio"] > a["block_hit_ratio"], (a["block_hit_ratio"], b["block_hit_ratio"])
assert b["verified_bytes"] >= ag["remote_bytes"] > 0, (b["verified_bytes"], ag["remote_bytes"])
assert len(ag["peers"]) == 1 and ag["peers"][0]["fetched"] == ag["remote_hits"], ag["peers"]
assert ag["directory_lookups_local"] > 0, ag
assert a["agent"]["directory_lookups_local"] == 0, a["agent"]
PYEOF
"$bin" stat --socket "$tmp/a.sock" --json >"$tmp/a-stat.json"
"$py" - "$tmp/a-stat.json" "$tmp/b.json" <<'PYEOF'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))["agent"]
assert a["served_chunks"] == b["remote_hits"], (a["served_chunks"], b["remote_hits"])
assert a["peers"][0]["node"] == b["peers"][0]["node"] or a["peers"][0]["served"] > 0, a["peers"]
PYEOF
"$bin" stat --socket "$tmp/b.sock" >"$tmp/stat.txt"
grep -q "directory connected; replica ready" "$tmp/stat.txt" || fail "stat: $(cat "$tmp/stat.txt")"
grep -q "keys found on peers" "$tmp/stat.txt" || fail "stat: $(cat "$tmp/stat.txt")"
grep -qE "^  peer [0-9a-f]{16}  connected" "$tmp/stat.txt" || fail "stat: $(cat "$tmp/stat.txt")"
# Idle agents with a live peer sleep: CPU time over one second, sampled (a measure,
# not a wait: a machine busy with other work can only lower it). UCX's event fd
# once kept both agents of a pair spinning a core each after their first read.
"$py" - "${pids[1]}" "${pids[2]}" <<'PYEOF' || fail "an idle agent spins"
import os, sys, time
hz = os.sysconf("SC_CLK_TCK")
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / hz
pids = sys.argv[1:]
before = [cpu(p) for p in pids]
t0 = time.monotonic()
time.sleep(1.0)
used = [(cpu(p) - b) / (time.monotonic() - t0) for p, b in zip(pids, before)]
print("idle agents' CPU:", ", ".join(f"{u:.2f}" for u in used))
sys.exit(0 if all(u < 0.3 for u in used) else 1)
PYEOF

# One command: two agents, requests spread over them.
"$bin" replay "$trace" --nodes 2 --max-requests 600 --capacity-blocks 4000 --json >"$tmp/n.json" \
  2>"$tmp/n.err" || fail "replay --nodes 2: $(tail -5 "$tmp/n.err")"
"$py" - "$tmp/n.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["nodes"] == 2 and d["errors"] == 0 and d["verify_failures"] == 0, d["failures"]
assert d["remote_hit_blocks"] > 0, d
assert d["local_hit_blocks"] + d["remote_hit_blocks"] + d["miss_blocks"] == d["block_references"]
assert len(d["node_agents"]) == 2
import os
# As root the agents run each in a network namespace of its own.
assert d["network"] == ("namespaces" if os.geteuid() == 0 else "loopback"), d["network"]
PYEOF
[ -z "$(ip netns list 2>/dev/null | grep '^dkr')" ] || fail "replay --nodes left network namespaces behind"
# The simulation it is compared with sees the trace in order, whatever the agents'
# interleaving: the same as one agent's replay with the combined capacity.
"$bin" replay "$trace" --max-requests 600 --capacity-blocks 8000 --json >"$tmp/one.json"
"$py" - "$tmp/n.json" "$tmp/one.json" <<'PYEOF'
import json, sys
n, one = (json.load(open(p)) for p in sys.argv[1:3])
assert n["lru_sim_block_hit_ratio"] == one["lru_sim_block_hit_ratio"], (
    n["lru_sim_block_hit_ratio"], one["lru_sim_block_hit_ratio"])
PYEOF

# A Redis that wants a password: the agent gives it from a file (never on its
# command line); a wrong one is reported in Redis' words and the agent serves
# locally.
port=$(free_port)
start_redis "$port" --requirepass "s3cret-$$"
echo "s3cret-$$" >"$tmp/pw"
agent p --cluster-password-file "$tmp/pw"
connected() {
  "$bin" stat --socket "$tmp/$1.sock" >"$tmp/$1-stat.txt" && grep -q "directory connected" "$tmp/$1-stat.txt"
}
until_alive "${pids[-1]}" "agent with the password" connected p
! grep -q "s3cret" "/proc/${pids[-1]}/cmdline" || fail "the password is on the command line"
DPUKV_CLUSTER_PASSWORD=wrong agent w
until_alive "${pids[-1]}" "agent with a wrong password" grep -q WRONGPASS "$tmp/w.log"
"$bin" stat --socket "$tmp/w.sock" | grep -q "UNREACHABLE" || fail "wrong password: $(cat "$tmp/w.log")"

# Redis hangs (SIGSTOP): a stop of the agent is bounded all the same (systemd
# kills a service that takes 30 s).
kill -STOP "${pids[0]}"
apid=${pids[1]}
kill -TERM "$apid"
for _ in $(seq 400); do kill -0 "$apid" 2>/dev/null || break; sleep 0.05; done
kill -CONT "${pids[0]}"
! kill -0 "$apid" 2>/dev/null || fail "agent a still runs 20 s after SIGTERM with Redis hung"
echo "cli cluster: ok"
