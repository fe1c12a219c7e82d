#!/usr/bin/env bash
# Two agents, each in its own network namespace, joined by veth pairs on a bridge
# the test makes, with a Redis server in the root namespace: chunks stored through
# agent A are found and read by agent B over the veths (UCX over TCP, each agent
# advertising its namespace's address). Then A's veth is cut (a partition): B's
# lookups of A's chunks become misses after at most one request timeout, B goes on
# serving and storing, no wrong byte; the link is healed and B reads from A again.
# Needs root (network namespaces); skipped (77) otherwise.
set -euo pipefail
bin=$1
src=$2
[ "$(id -u)" -eq 0 ] || { echo "cluster netns: needs root; skipped"; exit 77; }
command -v ip >/dev/null || { echo "cluster netns: no ip (iproute2); skipped"; exit 77; }
trace=$src/traces/mooncake_conversation_trace.jsonl
tag=$(( $$ % 100000 ))
br=dkb$tag
nsa=dkva$tag
nsb=dkvb$tag
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$nsa" 2>/dev/null || true
  ip netns del "$nsb" 2>/dev/null || true
  ip link del "$br" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "cluster netns: $*" >&2
  for f in "$tmp"/*.log; do echo "--- $f" >&2; tail -5 "$f" >&2; done
  exit 1
}
py=/usr/bin/python3
[ -x "$py" ] || py=python3

ip link add "$br" type bridge
ip addr add 10.198.0.1/24 dev "$br"
ip link set "$br" up
n=10
for ns in "$nsa" "$nsb"; do
  n=$((n + 1))
  ip netns add "$ns"
  ip link add "v$ns" type veth peer name "p$ns"
  ip link set "p$ns" master "$br" up
  ip link set "v$ns" netns "$ns"
  ip -n "$ns" addr add "10.198.0.$n/24" dev "v$ns"
  ip -n "$ns" link set "v$ns" up
  ip -n "$ns" link set lo up
done

port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 10.198.0.1 --protected-mode no --save "" --appendonly no \
  --logfile /dev/null &
pids+=($!)
for _ in $(seq 100); do (exec 3<>/dev/tcp/10.198.0.1/"$port") 2>/dev/null && break; sleep 0.05; done

agent() {  # name namespace address
  ip netns exec "$2" "$bin" --log-level warning agent --socket "$tmp/$1.sock" \
    --memory-bytes 128M --max-chunk-size 64K --metrics-port 0 \
    --cluster "redis://10.198.0.1:$port" --cluster-prefix "ns$tag" --advertise "$3" \
    2>"$tmp/$1.log" &
  pids+=($!)
  for _ in $(seq 200); do [ -S "$tmp/$1.sock" ] && return; sleep 0.05; done
  fail "agent $1 did not start"
}
agent a "$nsa" 10.198.0.11
agent b "$nsb" 10.198.0.12

replay() {  # socket requests out
  "$bin" --log-level error replay "$trace" --agent "$1" --max-requests "$2" --json >"$3" \
    2>>"$tmp/replay.log" || fail "replay through $1 failed: $(cat "$3")"
}
check() {  # file python-expression message
  "$py" -c "import json,sys; d=json.load(open('$1')); a=d['agent']; sys.exit(0 if ($2) else 1)" ||
    fail "$3"
}
replay "$tmp/a.sock" 600 "$tmp/a.json"
sleep 1.2  # B re-reads the live agents every second
replay "$tmp/b.sock" 200 "$tmp/b1.json"
check "$tmp/b1.json" "a['lookup_remote_hits'] > 0 and d['verify_failures'] == 0 and d['errors'] == 0" \
  "B found nothing of A's across the namespaces"
check "$tmp/b1.json" "a['remote_read_errors'] == 0 and a['remote_checksum_failures'] == 0" \
  "reads across the namespaces failed"

# Partition: A's veth goes down on the bridge side.
ip link set "p$nsa" down
t0=$(date +%s)
replay "$tmp/b.sock" 400 "$tmp/b2.json"
t1=$(date +%s)
check "$tmp/b2.json" "d['verify_failures'] == 0 and d['errors'] == 0" "wrong bytes or errors during the partition"
check "$tmp/b2.json" "a['remote_timeouts'] + a['remote_read_errors'] >= 1" \
  "B never noticed that A was cut off"
[ $((t1 - t0)) -lt 60 ] || fail "200 requests during the partition took $((t1 - t0)) s"

# Healed: A renews its lease, publishes again, and B reads from it again.
ip link set "p$nsa" up
before=$("$py" -c "import json; print(json.load(open('$tmp/b2.json'))['agent']['lookup_remote_hits'])")
sleep 3
replay "$tmp/b.sock" 600 "$tmp/b3.json"
check "$tmp/b3.json" "a['lookup_remote_hits'] > $before and d['verify_failures'] == 0" \
  "B did not read from A again after the partition healed"
echo "cluster netns: ok (partition of 200 requests: $((t1 - t0)) s)"
