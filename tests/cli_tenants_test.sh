#!/usr/bin/env bash
# Issue 46: one agent shared by local users who must not poison, read, remove,
# clear or watch each other's chunks, and a tenant over its quota that evicts its
# own chunks only. Real processes under real uids (setpriv), the real binary, the
# client library over its C ABI (tests/tenant_peer.py). Every attack of the
# issue is tried, and beside each, the same move by a member of the victim's own
# tenant, which must work: the check can fail.
#
#   uid 1001: the victim (tenant uid:1001, the default of one tenant a user)
#   uid 1002: the attacker (tenant uid:1002; through pod.sock, tenant pod)
#   uids 1003, 1004 in group 4242: tenant team (a rule: several engines of one service)
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "cli tenants: needs root (other uids); skipped"; exit 77; }
command -v setpriv >/dev/null || { echo "cli tenants: needs setpriv (util-linux); skipped"; exit 77; }
bin_src=$1
lib_src=$2
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
chmod 755 "$tmp"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for l in "$tmp"/*.log; do echo "== $l"; tail -20 "$l"; done; exit 1; }
# The other users run copies: the checkout may sit where they cannot read.
cp "$bin_src" "$tmp/dpukv"
cp -L "$lib_src" "$tmp/libdpukv_client.so.0"
mkdir -p "$tmp/py"
cp -r "$here/python/dpukv" "$tmp/py/"
cp "$here/tests/tenant_peer.py" "$tmp/peer.py"
chmod -R a+rX "$tmp"
bin=$tmp/dpukv
# The peers load the client library into Python: an ASan build's needs its runtime first.
py=(/usr/bin/python3)
if ldd "$lib_src" | grep libasan >/dev/null; then  # not -q: with pipefail, ldd may die of SIGPIPE
  py=(env "LD_PRELOAD=$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
      ASAN_OPTIONS=detect_leaks=0 /usr/bin/python3)
fi
export DPUKV_CLIENT_LIB=$tmp/libdpukv_client.so.0 DPUKV_PY_CLIENT=ctypes
as() {  # as UID[:GID] CMD...
  local uid=${1%%:*} gid=${1#*:}
  [ "$gid" = "$1" ] && gid=$uid
  shift
  setpriv --reuid="$uid" --regid="$gid" --clear-groups "$@"
}
peer() {  # peer UID[:GID] SOCK ACTION ARGS...: one JSON line
  local who=$1 s=$2; shift 2
  as "$who" "${py[@]}" "$tmp/peer.py" "$tmp/py" "$s" "$@"
}
field() { /usr/bin/python3 -c "import json,sys; print(json.dumps(json.loads(sys.argv[1])$2))" "$1"; }
wait_for() {
  local what=$1; shift
  for _ in $(seq 1200); do "$@" && return 0; sleep 0.1; done
  fail "$what"
}
start_agent() {  # start_agent NAME ARGS...: sockets made reachable by every test uid
  local name=$1; shift
  "$bin" agent --socket "$tmp/$name.sock" --metrics-port 0 "$@" 2>"$tmp/$name.log" &
  pids+=("$!")
  disown "$!"  # killed at the end without the shell's "Killed" line
  wait_for "agent $name did not start" test -S "$tmp/$name.sock"
  wait_for "agent $name did not serve" grep -q "serving on" "$tmp/$name.log"
  chmod 666 "$tmp"/*.sock
}

start_agent a --memory-bytes 64M --max-chunk-size 64K --tenant "team gid:4242" \
  --tenant "pod socket:$tmp/pod.sock"
A=$tmp/a.sock
P=$tmp/pod.sock

# --- Poisoning: the attacker stores garbage under the victim's prompt first.
r=$(peer 1002 "$A" store 7 4 238)
[ "$(field "$r" '["status"]')" = '["SUCCESS", "SUCCESS", "SUCCESS", "SUCCESS"]' ] || fail "attacker store: $r"
r=$(peer 1001 "$A" store 7 4 16)
[ "$(field "$r" '["status"]')" = '["SUCCESS", "SUCCESS", "SUCCESS", "SUCCESS"]' ] || fail "victim store: $r"
r=$(peer 1001 "$A" retrieve 7 4)
[ "$(field "$r" '["first_bytes"]')" = '[16, 17, 18, 19]' ] ||
  fail "the victim got bytes other than its own (poisoned): $r"
echo "poisoning: the victim reads its own bytes [16..19], not the attacker's [238..241]"
# The same move inside one tenant does share: the team's second engine reads
# what the first stored (the store is first-writer-wins there, as before).
peer 1003:4242 "$A" store 9 2 100 >/dev/null
r=$(peer 1004:4242 "$A" retrieve 9 2)
[ "$(field "$r" '["first_bytes"]')" = '[100, 101]' ] || fail "one tenant (team) does not share: $r"
echo "sharing: a team member reads the other's chunks"

# --- Reading, finding and removing another tenant's chunks: prompt 5 is the
# victim's alone; a teammate's lookup of the team's prompt 9 is the control.
peer 1001 "$A" store 5 4 50 >/dev/null
r=$(peer 1004:4242 "$A" lookup 9 2)
[ "$(field "$r" '["hits"]')" = 2 ] || fail "a team member did not find the team's chunks: $r"
r=$(peer 1002 "$A" lookup 5 4)
[ "$(field "$r" '["hits"]')" = 0 ] || fail "the attacker found the victim's chunks: $r"
r=$(peer 1002 "$A" retrieve 5 4)
[ "$(field "$r" '["first_bytes"]')" = '[null, null, null, null]' ] || fail "the attacker read the victim's chunks: $r"
peer 1002 "$A" remove 5 4 >/dev/null
r=$(peer 1001 "$A" retrieve 5 4)
[ "$(field "$r" '["first_bytes"]')" = '[50, 51, 52, 53]' ] || fail "the attacker's remove took the victim's chunks: $r"
peer 1002 "$A" remove 7 4 >/dev/null
r=$(peer 1001 "$A" retrieve 7 4)
[ "$(field "$r" '["first_bytes"]')" = '[16, 17, 18, 19]' ] || fail "the attacker's remove of a shared prompt took the victim's: $r"
r=$(peer 1002 "$A" lookup 7 4)
[ "$(field "$r" '["hits"]')" = 0 ] || fail "the attacker's remove left its own chunks: $r"
peer 1002 "$A" store 7 4 238 >/dev/null
echo "reading: the attacker finds and reads 0 of the victim's chunks; its remove reaches its own only"

# --- A tenant's own socket: the attacker through pod.sock is tenant pod.
r=$(peer 1002 "$P" lookup 7 4)
[ "$(field "$r" '["hits"]')" = 0 ] || fail "pod.sock reached the attacker's uid tenant: $r"
r=$(peer 1002 "$P" stats)
[ "$(field "$r" '["stats"]["tenant"]')" = '"pod"' ] || fail "pod.sock's tenant: $r"

# --- The event feed: the victim watches while the attacker and the team store.
watch() {  # watch UID SEED OUT: a subscriber in the background until told to go on
  rm -f "$tmp/go"
  WATCH_GO=$tmp/go as "$1" "${py[@]}" "$tmp/peer.py" "$tmp/py" "$A" watch "$2" >"$3" 2>&1 &
  pids+=("$!")
  wait_for "watcher $1 did not subscribe" grep -q SUBSCRIBED "$3"
}
watch 1001 70 "$tmp/victim_watch.out"
peer 1002 "$A" store 71 3 1 >/dev/null
peer 1003:4242 "$A" store 72 2 1 >/dev/null
echo READY >"$tmp/go"
wait_for "victim's watch did not end" grep -q events_before_marker "$tmp/victim_watch.out"
r=$(tail -1 "$tmp/victim_watch.out")
[ "$(field "$r" '["events_before_marker"]')" = '[]' ] || fail "the victim saw another tenant's events: $r"
watch 1004:4242 73 "$tmp/team_watch.out"
peer 1003:4242 "$A" store 74 2 1 >/dev/null
peer 1002 "$A" store 75 2 1 >/dev/null
echo READY >"$tmp/go"
wait_for "team's watch did not end" grep -q events_before_marker "$tmp/team_watch.out"
r=$(tail -1 "$tmp/team_watch.out")
n=$(field "$r" '["events_before_marker"].__len__()')
[ "$n" = 2 ] || fail "a team member saw $n events of the other's 2 stores (and none of the attacker's): $r"
[ "$(field "$r" '["events_before_marker"][0]["world_size"]')" = 1 ] || fail "events carry the agent's keys: $r"
echo "events: the victim's feed held 0 of 5 others' stores; a team member's held its teammate's 2"
as 1002 "$bin" events --socket "$A" --all-tenants --count 1 >"$tmp/ev.out" 2>&1 && fail "a user watched every tenant"
grep -q "only an admin may watch every tenant" "$tmp/ev.out" || fail "no reason: $(cat "$tmp/ev.out")"

# --- Clearing: the attacker clears its own chunks only; every tenant's is an admin's.
as 1002 "$bin" cache clear --socket "$A" >"$tmp/clear.out" 2>&1 || fail "clear: $(cat "$tmp/clear.out")"
r=$(peer 1001 "$A" retrieve 7 4)
[ "$(field "$r" '["first_bytes"]')" = '[16, 17, 18, 19]' ] || fail "the attacker's clear dropped the victim's chunks: $r"
r=$(peer 1002 "$A" lookup 7 4)
[ "$(field "$r" '["hits"]')" = 0 ] || fail "the attacker's clear left its own: $r"
if as 1002 "$bin" cache clear --all-tenants --socket "$A" >"$tmp/clear.out" 2>&1; then
  fail "a user cleared every tenant"
fi
grep -q "only an admin may clear every tenant" "$tmp/clear.out" || fail "no reason: $(cat "$tmp/clear.out")"
echo "clear: $(cat "$tmp/clear.out")"

# --- stat: a user sees its own tenant; root (an admin) every tenant.
r=$(peer 1002 "$A" stats)
[ "$(field "$r" '["stats"]["tenants"].__len__()')" = 1 ] || fail "a user saw other tenants' figures: $r"
"$bin" stat --socket "$A" >"$tmp/stat.out"
grep -q "uid:1001" "$tmp/stat.out" && grep -q "team" "$tmp/stat.out" && grep -q "(admin" "$tmp/stat.out" ||
  fail "root's stat: $(cat "$tmp/stat.out")"
# Output to a file first: grep -q leaving a pipe early can kill the writer (pipefail).
"$bin" cache clear --all-tenants --socket "$A" >"$tmp/clear.out"
grep -q "cleared" "$tmp/clear.out" || fail "root could not clear every tenant: $(cat "$tmp/clear.out")"
r=$(peer 1001 "$A" lookup 7 4)
[ "$(field "$r" '["hits"]')" = 0 ] || fail "root's clear of every tenant left the victim's: $r"

# --- Quotas: 1 MiB of memory, 512 KiB a tenant. The victim stores 64 chunks of
# 4 KiB (256 KiB); the attacker 200 (800 KiB, more than its share). Without
# quotas the tier fills and the coldest chunks, the victim's, go.
start_agent q --memory-bytes 1M --max-chunk-size 64K --tenant-memory-quota 512K
Q=$tmp/q.sock
peer 1001 "$Q" store 80 64 0 >/dev/null
peer 1002 "$Q" store 81 200 0 >/dev/null
r=$(peer 1001 "$Q" lookup 80 64)
[ "$(field "$r" '["hits"]')" = 64 ] || fail "the attacker's stores over its quota evicted the victim's: $r"
r=$(peer 1002 "$Q" stats)
mem=$(field "$r" '["stats"]["tenants"][0]["memory_bytes"]')
ev=$(field "$r" '["stats"]["tenants"][0]["quota_evictions"]')
[ "$mem" -le $((512 * 1024)) ] && [ "$ev" -gt 0 ] || fail "the attacker over its quota: $r"
echo "quota: the victim kept 64 of 64 chunks; the attacker holds $mem bytes (quota 524288) after $ev quota evictions"
# The same load without quotas: the victim loses chunks (the check can fail).
start_agent n --memory-bytes 1M --max-chunk-size 64K
N=$tmp/n.sock
peer 1001 "$N" store 80 64 0 >/dev/null
peer 1002 "$N" store 81 200 0 >/dev/null
r=$(peer 1001 "$N" lookup 80 64)
h=$(field "$r" '["hits"]')
[ "$h" -lt 64 ] || fail "without quotas the victim kept every chunk: the quota check proves nothing"
echo "no quota: the victim kept $h of 64"

# --- tenant_by refuse: a user no rule names is refused, with the reason.
start_agent r --memory-bytes 16M --max-chunk-size 64K --tenant-by refuse --tenant "only uid:1001"
peer 1001 "$tmp/r.sock" lookup 7 1 >/dev/null || fail "a named user was refused"
if as 1002 "$bin" stat --socket "$tmp/r.sock" >"$tmp/refused.out" 2>&1; then fail "an unnamed user got in"; fi
grep -q "not let in" "$tmp/refused.out" || fail "no reason: $(cat "$tmp/refused.out")"
echo "refuse: $(cat "$tmp/refused.out")"
# --- Staging: a tenant's clients together export at most its share (96 KiB).
# The team's first engine holds 64 KiB; its second cannot export 64 KiB more,
# while a client of another tenant can; alone, the second one can.
start_agent st --memory-bytes 16M --max-chunk-size 64K --tenant "team gid:4242" \
  --tenant-staging-quota 96K
S=$tmp/st.sock
rm -f "$tmp/go"
WATCH_GO=$tmp/go as 1003:4242 "${py[@]}" "$tmp/peer.py" "$tmp/py" "$S" hold 16 >"$tmp/hold.out" 2>&1 &
pids+=("$!")
wait_for "the holder did not export its staging" grep -q HOLDING "$tmp/hold.out"
r=$(peer 1004:4242 "$S" store 95 16 1)
grep -q '"error"' <<<"$r" || fail "a second client of the team exported past the tenant's share: $r"
r=$(peer 1001 "$S" store 95 16 1)
[ "$(field "$r" '["status"].count("SUCCESS")')" = 16 ] || fail "another tenant's client was held to the team's share: $r"
echo READY >"$tmp/go"
wait_for "the holder did not end" grep -q '"held"' "$tmp/hold.out"
held_gone() { [ "$(field "$(peer 1001 "$S" stats)" '["stats"]["clients"]')" = 0 ]; }
wait_for "the holder's session did not end" held_gone
r=$(peer 1004:4242 "$S" store 95 16 1)
[ "$(field "$r" '["status"].count("SUCCESS")')" = 16 ] || fail "the team's second client alone: $r"
"$bin" stat --socket "$S" >"$tmp/stat.out"
grep -qE "^  team .*staging 0.0 MiB of 0.1 MiB" "$tmp/stat.out" || fail "stat: $(cat "$tmp/stat.out")"
grep -q "over its tenant's staging share" "$tmp/st.log" || fail "the agent did not say why"
echo "staging: with 64 KiB held by the team, its second client's 64 KiB was refused and another tenant's taken"

# --- A cluster: the namespace travels with the key. Two agents share a Redis
# directory; what the victim stored through c1 is a hit for the victim through c2
# (read from c1), and a miss for the attacker there. The team, a rule named alike
# on both agents, shares across them too.
if command -v redis-server >/dev/null; then
  port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --logfile /dev/null &
  pids+=("$!")
  disown "$!"
  wait_for "redis-server did not start" eval "(exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null"
  for n in c1 c2; do
    start_agent "$n" --memory-bytes 16M --max-chunk-size 64K --cluster "redis://127.0.0.1:$port" \
      --cluster-prefix "t$$" --advertise 127.0.0.1 --directory-replica-keys 0 --tenant "team gid:4242"
  done
  c2_sees_c1() {
    "$bin" stat --socket "$tmp/c2.sock" --json |
      /usr/bin/python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin).get("cluster_live_nodes",0) >= 2 else 1)'
  }
  wait_for "c2 never saw c1" c2_sees_c1
  peer 1001 "$tmp/c1.sock" store 90 3 60 >/dev/null
  peer 1003:4242 "$tmp/c1.sock" store 91 2 70 >/dev/null
  victim_hits_on_c2() { [ "$(field "$(peer 1001 "$tmp/c2.sock" lookup 90 3)" '["hits"]')" = 3 ]; }
  wait_for "the victim's chunks stored through c1 were never a hit through c2" victim_hits_on_c2
  r=$(peer 1001 "$tmp/c2.sock" retrieve 90 3)
  [ "$(field "$r" '["first_bytes"]')" = '[60, 61, 62]' ] || fail "the victim through c2: $r"
  r=$(peer 1002 "$tmp/c2.sock" lookup 90 3)
  [ "$(field "$r" '["hits"]')" = 0 ] || fail "the attacker found the victim's chunks through the cluster: $r"
  team_hits_on_c2() { [ "$(field "$(peer 1004:4242 "$tmp/c2.sock" lookup 91 2)" '["hits"]')" = 2 ]; }
  wait_for "the team's chunks stored through c1 were never a hit through c2" team_hits_on_c2
  r=$(peer 1004:4242 "$tmp/c2.sock" retrieve 91 2)
  [ "$(field "$r" '["first_bytes"]')" = '[70, 71]' ] || fail "the team did not share across agents: $r"
  echo "cluster: the victim's chunks through c1 are hits for it through c2 and misses for the attacker; the team shares across agents"
else
  echo "cluster part skipped: no redis-server"
fi
echo "cli tenants: ok"
