#!/usr/bin/env bash
# Issue 45.1, 45.2 and 45.8: the agent's own socket against a hostile local user
# (uid nobody), through the real binary and real sockets. Under prlimit
# --nofile=128, 2,000 peers that never say HELLO (and reconnect as they are
# closed), then 2,000 that say HELLO and stay idle: the agent must stay under 0.2
# of a core and 100 log lines, and serve a legitimate client (root) throughout;
# the hostile uid is refused beyond its share, with words that say so; a HELLO
# asking for an hour's heartbeat is refused; a full agent, a second agent on the
# same socket and a socket directory the user cannot enter each say what happened.
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "cli flood: needs root (a second uid); skipped"; exit 77; }
command -v setpriv >/dev/null && command -v prlimit >/dev/null ||
  { echo "cli flood: needs setpriv and prlimit (util-linux); skipped"; exit 77; }
tmp=$(mktemp -d)
chmod 755 "$tmp"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
# The hostile user runs copies: the checkout may sit where nobody cannot read.
cp "$1" "$tmp/dpukv"
cp "$(dirname "$0")/comch_flood.py" "$tmp/flood.py"
bin=$tmp/dpukv
py=/usr/bin/python3
# An array, not a function: a function in the background is a subshell, and its
# $! is not the flood's pid.
as_nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
wait_for() {  # wait_for WHAT COMMAND...: up to two minutes (a busy machine)
  local what=$1; shift
  for _ in $(seq 1200); do "$@" && return 0; sleep 0.1; done
  fail "$what"
}
stat_ok() { "$bin" stat --socket "$sock" >/dev/null 2>&1; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
fds_of() { ls "/proc/$1/fd" | wc -l; }
# The hostile uid holds its whole share (6 of the 26 connections allowed).
filled() { [ "$(fds_of "$agent")" -ge $((base_fds + 6)) ]; }

sock=$tmp/a.sock
prlimit --nofile=128:128 "$bin" agent --socket "$sock" --memory-bytes 64M --metrics-port 0 \
  2>"$tmp/agent.log" &
agent=$!
pids+=("$agent")
wait_for "no agent socket" test -S "$sock"
chmod 666 "$sock"
# The limits were fitted to the descriptor limit, and said so once.
wait_for "no start line" grep -q "serving on" "$tmp/agent.log"
grep -q "connections allowed (.* per uid), not 1024: the descriptor limit is 128" "$tmp/agent.log" ||
  { cat "$tmp/agent.log"; fail "max_clients not fitted to the descriptor limit"; }
hz=$(getconf CLK_TCK)
base_fds=$(fds_of "$agent")

flood_round() {  # flood_round NAME FLOOD-ARGS...: 4 s of flood, checks, prints figures
  local name=$1; shift
  local serve=1
  [ "${1:-}" = "--no-client" ] && { serve=0; shift; }
  local lines0 cpu0 t0 cpu1 t1 lines
  lines0=$(wc -l <"$tmp/agent.log")
  cpu0=$(cpu_ticks "$agent")
  t0=$(date +%s%N)
  "${as_nobody[@]}" "$py" "$tmp/flood.py" "$sock" --conns 2000 --seconds 4 "$@" >"$tmp/flood.json" &
  local fl=$!
  pids+=("$fl")
  # The flood holds its uid's share before the legitimate client comes.
  wait_for "$name: the flood never filled the agent" filled
  for i in $(seq $((serve * 3))); do
    local s0 s1
    s0=$(date +%s%N)
    "$bin" stat --socket "$sock" >"$tmp/stat.out" 2>&1 ||
      { cat "$tmp/stat.out"; fail "$name: a legitimate client was refused (try $i)"; }
    s1=$(date +%s%N)
    echo "$name: legitimate stat $i served in $(( (s1 - s0) / 1000000 )) ms"
  done
  wait "$fl"
  cpu1=$(cpu_ticks "$agent")
  t1=$(date +%s%N)
  lines=$(( $(wc -l <"$tmp/agent.log") - lines0 ))
  echo "$name: flood $(cat "$tmp/flood.json")"
  local share
  share=$("$py" -c "print(f'{($cpu1 - $cpu0) / $hz / (($t1 - $t0) / 1e9):.3f}')")
  echo "$name: agent CPU $share of a core over $(( (t1 - t0) / 1000000 )) ms; $lines log lines"
  "$py" -c "import sys; sys.exit(0 if $share < 0.2 else 1)" || fail "$name: agent used $share of a core"
  [ "$lines" -lt 100 ] || { tail -20 "$tmp/agent.log"; fail "$name: $lines log lines"; }
}

# 45.1: 2,000 peers that never say HELLO, each reconnecting as it is closed.
flood_round "no HELLO"
# 45.2: 2,000 peers that say HELLO (heartbeat 60 s, allowed) and stay idle.
flood_round "idle sessions" --hello-ms 60000
# While the hostile uid holds its share, its own new client is told why.
"${as_nobody[@]}" "$py" "$tmp/flood.py" "$sock" --conns 2000 --seconds 30 --hello-ms 60000 >/dev/null &
fl=$!
pids+=("$fl")
share_said() {
  "${as_nobody[@]}" "$bin" stat --socket "$sock" >"$tmp/stat.out" 2>&1 && return 1
  grep -q "this user holds its share of the agent's connections" "$tmp/stat.out"
}
wait_for "a uid over its share was not told why" share_said
"$bin" stat --socket "$sock" >/dev/null || fail "root was refused while nobody held its share"
kill "$fl" 2>/dev/null || true
wait "$fl" 2>/dev/null || true
nobody_ok() { "${as_nobody[@]}" "$bin" stat --socket "$sock" >/dev/null 2>&1; }
wait_for "the hostile uid's share never came back after its sessions left" nobody_ok
# A HELLO asking for an hour's heartbeat is refused, with its reason (5: bad HELLO).
"${as_nobody[@]}" "$py" "$tmp/flood.py" "$sock" --conns 8 --seconds 1 --hello-ms 3600000 >"$tmp/flood.json"
grep -q '"refused": {"5"' "$tmp/flood.json" || { cat "$tmp/flood.json"; fail "an hour's heartbeat was accepted"; }
"$bin" stat --socket "$sock" | grep -q "^agent " || fail "stat after the floods"

# 45.1 itself: out of descriptors (the limit lowered under the running agent, below
# what it fitted its limits to), accept fails with EMFILE. The listener rests
# instead of spinning; no real client can be served while the flood holds every
# descriptor, so only the cost is checked, then that it serves once the flood ends.
prlimit --pid "$agent" --nofile=$((base_fds + 2)):128
filled() { [ "$(fds_of "$agent")" -ge $((base_fds + 1)) ]; }
flood_round "out of descriptors" --no-client
prlimit --pid "$agent" --nofile=128:128
wait_for "no service after the descriptor flood" stat_ok
grep -q "Too many open files with" "$tmp/agent.log" || fail "EMFILE was never reached"

# 45.8: a second agent on the same socket says so, not "not allowed in the current state".
set +e
"$bin" agent --socket "$sock" --memory-bytes 64M --metrics-port 0 >"$tmp/second.out" 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q "another server is listening on $sock" "$tmp/second.out" ||
  { cat "$tmp/second.out"; fail "a second agent on the socket did not say why (exit $rc)"; }
kill "$agent"
wait "$agent" || true

# 45.8: a full agent says it is full (max_clients 2, both held by idle sessions).
"$bin" agent --socket "$sock" --memory-bytes 64M --metrics-port 0 --max-clients 2 \
  --max-clients-per-uid 0 2>"$tmp/agent2.log" &
agent=$!
pids+=("$agent")
wait_for "no agent socket (full agent)" test -S "$sock"
chmod 666 "$sock"
"${as_nobody[@]}" "$py" "$tmp/flood.py" "$sock" --conns 2 --seconds 60 --hello-ms 60000 >/dev/null &
fl=$!
pids+=("$fl")
full_said() {
  "$bin" stat --socket "$sock" >"$tmp/stat.out" 2>&1 && return 1
  grep -q "the agent is full: it holds its max_clients connections" "$tmp/stat.out"
}
wait_for "a full agent did not say it is full" full_said
kill "$fl"
wait "$fl" 2>/dev/null || true
wait_for "no room again after the idle sessions left" stat_ok

# 45.8: a socket in a directory this user cannot enter is "permission denied", not "no agent".
mkdir -m 700 "$tmp/private"
set +e
"${as_nobody[@]}" "$bin" stat --socket "$tmp/private/x.sock" >"$tmp/stat.out" 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q "permission denied: this user cannot enter the directory" "$tmp/stat.out" ||
  { cat "$tmp/stat.out"; fail "an unreachable socket directory read as no agent (exit $rc)"; }
echo "cli flood: passed"
