#!/usr/bin/env bash
# NVMe interop with SPDK v24.01, a host and target stack nobody on this project
# wrote (built by ../shared/thirdparty/spdk/build.sh; scripts/spdk.sh finds or
# builds it):
#   SPDK against dpukv's target (`dpukv nvme`, configured with SPDK's rpc.py):
#     identify over TCP and vfio-user, discovery, perf for 15 s with SPDK's
#     default keep-alive, bdevperf verify over both transports, the vfio-user
#     compliance suite (18/18); then nothing may be left behind: no controller,
#     no connection, no busy poller.
#   dpukv's host against SPDK's nvmf_tgt: discover, perf over TCP and vfio-user
#     (polled and with interrupts), with no error in SPDK's log.
#   interop_spdk_test.sh DPUKV_BIN     (SPDK from $DPUKV_SPDK_DIR or /tmp/spdk/src)
# Exit 77 (skipped) where SPDK is not built or hugepages cannot be had.
set -euo pipefail
dpukv=$1
spdk=${DPUKV_SPDK_DIR:-/tmp/spdk/src}
for t in build/bin/spdk_nvme_identify build/bin/spdk_nvme_perf build/bin/spdk_nvme_discover \
         build/bin/nvmf_tgt build/examples/bdevperf test/nvme/compliance/nvme_compliance; do
  if [ ! -x "$spdk/$t" ]; then
    echo "SKIP: SPDK is not built at $spdk (scripts/spdk.sh builds it)"; exit 77
  fi
done
export LD_LIBRARY_PATH=$spdk/build/lib:$spdk/build/libvfio-user/build-release/lib
rpc_py() { /usr/bin/python3 "$spdk/scripts/rpc.py" -s "$1" "${@:2}"; }

# shellcheck source=../scripts/spdk_hugepages.sh
. "$(dirname "$0")/../scripts/spdk_hugepages.sh"
# SPDK's tools need hugepages (2 MiB): 1 GiB for the target and host in turn.
old_hp=$(cat /proc/sys/vm/nr_hugepages)
if [ "$old_hp" -lt 512 ]; then
  echo 512 > /proc/sys/vm/nr_hugepages 2>/dev/null || { echo "SKIP: cannot reserve hugepages (root?)"; exit 77; }
fi
mkdir -p /dev/hugepages
mountpoint -q /dev/hugepages || mount -t hugetlbfs nodev /dev/hugepages
drop_stale_spdk_hugepages
if [ "$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)" -lt 400 ]; then
  echo "SKIP: fewer than 400 free hugepages"; exit 77
fi

w=$(mktemp -d /tmp/dpukv-spdk.XXXXXX)
port=$((20000 + ($$ * 7) % 12000))
nqn=nqn.2026-11.io.dpukv:interop
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  echo "$old_hp" > /proc/sys/vm/nr_hugepages 2>/dev/null || true
  rm -rf "$w"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$w"/*.log; do echo "--- $f"; tail -20 "$f"; done; exit 1; }
step() { echo "== $*"; }
wait_for_socket() {  # until the JSON-RPC server answers
  for _ in $(seq 600); do
    rpc_py "$1" -t 1 rpc_get_methods >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
# The same set-up for either target, through rpc.py: TCP and VFIOUSER transports,
# a 256 MiB malloc bdev of 4 KiB blocks as namespace 1, a listener on each.
configure_target() {  # RPC_SOCKET SERIAL
  rm -rf "$w/vu"; mkdir -p "$w/vu"
  for m in "nvmf_create_transport -t TCP" "nvmf_create_transport -t VFIOUSER" \
           "bdev_malloc_create 256 4096 -b Malloc0" "nvmf_create_subsystem $nqn -a -s $2 -m 32" \
           "nvmf_subsystem_add_ns $nqn Malloc0" \
           "nvmf_subsystem_add_listener $nqn -t TCP -a 127.0.0.1 -s $port" \
           "nvmf_subsystem_add_listener $nqn -t VFIOUSER -a $w/vu -s 0"; do
    # shellcheck disable=SC2086
    rpc_py "$1" $m >/dev/null || fail "rpc.py -s $1 $m"
  done
}
tcp_trid="trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:$nqn"
vu_trid="trtype:VFIOUSER traddr:$w/vu subnqn:$nqn"

# ---- SPDK's host, rpc.py and compliance suite against dpukv's target ----------
step "dpukv's target, configured with SPDK's rpc.py"
"$dpukv" --lib-log-level info nvme -r "$w/dpukv.sock" -m 0x1 >"$w/dpukv.log" 2>&1 &
dpid=$!; pids+=("$dpid")
wait_for_socket "$w/dpukv.sock" "$dpid" || fail "dpukv nvme did not answer on its RPC socket"
r() { rpc_py "$w/dpukv.sock" "$@" >/dev/null || fail "rpc.py $*"; }
configure_target "$w/dpukv.sock" DPUKVINTEROP

step "spdk_nvme_identify over TCP and vfio-user"
"$spdk/build/bin/spdk_nvme_identify" -r "$tcp_trid" >"$w/identify-tcp.log" 2>&1 || fail "identify (TCP)"
grep -Eq "Serial Number: +DPUKVINTEROP" "$w/identify-tcp.log" || fail "identify (TCP): serial"
grep -Eq "Namespace ID:1" "$w/identify-tcp.log" || fail "identify (TCP): namespace 1"
"$spdk/build/bin/spdk_nvme_identify" -g -d 256 -r "$vu_trid" >"$w/identify-vu.log" 2>&1 || fail "identify (vfio-user)"
grep -Eq "Serial Number: +DPUKVINTEROP" "$w/identify-vu.log" || fail "identify (vfio-user): serial"

step "spdk_nvme_discover: the log, then a change notice (it watches until SIGTERM)"
stdbuf -oL "$spdk/build/bin/spdk_nvme_discover" -r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port" \
  >"$w/discover.log" 2>&1 &  # line-buffered: it prints each log as it reads it
discover_pid=$!; pids+=("$discover_pid")
records() { grep -c "NVM Subsystem Qualified Name: *$nqn" "$w/discover.log" || true; }
for _ in $(seq 400); do [ "$(records)" -ge 1 ] && break; sleep 0.05; done
grep -Eq "Transport Service Identifier: +$port" "$w/discover.log" || fail "discover: port $port not listed"
# A second listener changes the log: the host's AER completes and it reads the
# log again, now with two records for the subsystem.
r nvmf_subsystem_add_listener "$nqn" -t TCP -a 127.0.0.1 -s $((port + 1))
for _ in $(seq 400); do [ "$(records)" -ge 3 ] && break; sleep 0.05; done
[ "$(records)" -ge 3 ] || fail "discover: no second log after the change notice"
grep -Eq "Transport Service Identifier: +$((port + 1))" "$w/discover.log" || fail "discover: new listener"
kill -TERM "$discover_pid"; wait "$discover_pid" || fail "spdk_nvme_discover exited $? on SIGTERM"
unset 'pids[-1]'

step "spdk_nvme_perf, 15 s at q1 with SPDK's keep-alive (10 s)"
"$spdk/build/bin/spdk_nvme_perf" -c 0x2 -q 1 -o 4096 -w randread -t 15 -r "$tcp_trid" \
  >"$w/perf-ka.log" 2>&1 || fail "perf with keep-alive exited $?"
grep -q "^Total" "$w/perf-ka.log" || fail "perf: no total line"

for tr in tcp vfiouser; do
  step "bdevperf -w verify over $tr"
  if [ $tr = tcp ]; then
    ctrl="\"trtype\": \"tcp\", \"adrfam\": \"ipv4\", \"traddr\": \"127.0.0.1\", \"trsvcid\": \"$port\""
  else
    ctrl="\"trtype\": \"vfiouser\", \"traddr\": \"$w/vu\""
  fi
  cat >"$w/bdevperf-$tr.json" <<EOF
{"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_nvme_attach_controller",
  "params": {"name": "N0", $ctrl, "subnqn": "$nqn"}}]}]}
EOF
  for bs in 4096 65536; do
    "$spdk/build/examples/bdevperf" -m 0x2 -g -s 256 --json "$w/bdevperf-$tr.json" -q 32 -o $bs \
      -w verify -t 3 >"$w/bdevperf-$tr-$bs.log" 2>&1 || fail "bdevperf verify $tr $bs exited $?"
    # Total : IOPS MiB/s Fail/s TO/s ...: a miscompare or a failed I/O is a Fail/s.
    total=$(tr '\r' '\n' <"$w/bdevperf-$tr-$bs.log" | awk '$1 == "Total" && $2 == ":"')
    [ -n "$total" ] || fail "bdevperf $tr $bs: no total"
    echo "  $tr $bs: $total"
    echo "$total" | awk '$3 > 0 && $5 == 0 && $6 == 0 {ok = 1} END {exit !ok}' \
      || fail "bdevperf verify $tr $bs: failed or timed-out I/O"
    if grep -Eiq "miscompare|data mismatch" "$w/bdevperf-$tr-$bs.log"; then
      fail "bdevperf verify $tr $bs: wrong bytes"
    fi
  done
done

step "SPDK's vfio-user compliance suite"
"$spdk/test/nvme/compliance/nvme_compliance" -g -r "$vu_trid" >"$w/compliance.log" 2>&1 || true
grep -Eq "tests +18 +18 +18 +0" "$w/compliance.log" || {
  grep -E "FAIL|failed|Test:" "$w/compliance.log" | head -40; fail "compliance suite not 18/18"; }

step "nothing left behind on dpukv's target"
left=""
for _ in $(seq 400); do
  ctrls=$(rpc_py "$w/dpukv.sock" nvmf_get_subsystems | /usr/bin/python3 -c \
    'import json,sys; print(sum(s.get("controllers",0) for s in json.load(sys.stdin)))')
  conns=$(rpc_py "$w/dpukv.sock" nvmf_get_stats | /usr/bin/python3 -c \
    'import json,sys; t=json.load(sys.stdin)["poll_groups"][0]["transports"]; print(sum(x.get("active_connections",0) for x in t))')
  left="$ctrls controllers, $conns connections"
  [ "$ctrls" = 0 ] && [ "$conns" = 0 ] && break
  sleep 0.05
done
[ "$left" = "0 controllers, 0 connections" ] || fail "after every host left: $left"
if grep -q "fatal status" "$w/dpukv.log"; then fail "a controller went fatal"; fi
# A poll group with nothing connected sleeps: under half a CPU over 2 s (a
# spinning one takes a whole one).
ticks() { awk '{print $14 + $15}' "/proc/$dpid/stat"; }
t0=$(ticks); sleep 2; t1=$(ticks)
hz=$(getconf CLK_TCK)
[ $((t1 - t0)) -lt "$hz" ] || fail "idle target used $((t1 - t0)) of $((2 * hz)) ticks in 2 s"
kill -TERM "$dpid"; wait "$dpid" || fail "dpukv nvme exited $? on SIGTERM"
pids=()

# ---- dpukv's host against SPDK's target ----------------------------------------
step "SPDK's nvmf_tgt"
"$spdk/build/bin/nvmf_tgt" -m 0x1 -r "$w/spdk.sock" >"$w/nvmf_tgt.log" 2>&1 &
spid=$!; pids+=("$spid")
wait_for_socket "$w/spdk.sock" "$spid" || fail "nvmf_tgt did not answer on its RPC socket"
configure_target "$w/spdk.sock" SPDKINTEROP

# SPDK's vfio-user transport removes a controller some time after its host has
# gone; a host that attaches before that gets "cntlid 1 already exists" (and
# SPDK 24.01 has crashed after it). Each attach waits for the last to be gone.
no_controllers() {
  for _ in $(seq 400); do
    n=$(rpc_py "$w/spdk.sock" nvmf_subsystem_get_controllers "$nqn" | /usr/bin/python3 -c \
      'import json,sys; print(len(json.load(sys.stdin)))')
    [ "$n" = 0 ] && return 0
    sleep 0.05
  done
  return 1
}

step "dpukv nvme discover, perf over TCP and vfio-user (polled, interrupts)"
"$dpukv" nvme discover --connect "127.0.0.1:$port" --json >"$w/dpukv-discover.json" \
  || fail "dpukv nvme discover against SPDK"
grep -q "\"subnqn\":\"$nqn\"" "$w/dpukv-discover.json" || fail "dpukv nvme discover: $nqn not listed"
"$dpukv" nvme identify --socket "$w/vu/cntrl" >"$w/dpukv-identify.log" || fail "dpukv identify (vfio-user)"
grep -q "SPDKINTEROP" "$w/dpukv-identify.log" || fail "dpukv identify: serial"
no_controllers || fail "SPDK's target kept dpukv identify's controller"
"$dpukv" nvme perf --transport tcp --address "127.0.0.1:$port" --nqn "$nqn" -w randread,randwrite \
  -q 1,32 -t 1 --warmup 0.2 --cpu 1 >"$w/dpukv-perf-tcp.log" || fail "dpukv perf (TCP) against SPDK"
no_controllers || fail "SPDK's target kept dpukv perf's TCP controllers"
"$dpukv" nvme perf --socket "$w/vu/cntrl" -w randread,randwrite -q 1,32 -t 1 --warmup 0.2 --cpu 1 \
  >"$w/dpukv-perf-vu.log" || fail "dpukv perf (vfio-user) against SPDK"
no_controllers || fail "SPDK's target kept dpukv perf's vfio-user controller"
"$dpukv" nvme perf --socket "$w/vu/cntrl" --interrupts -w randread -q 32 -t 1 --warmup 0.2 --cpu 1 \
  >"$w/dpukv-perf-vu-irq.log" || fail "dpukv perf (vfio-user, interrupts) against SPDK"
cat "$w/dpukv-perf-tcp.log" "$w/dpukv-perf-vu.log"
if grep -Eq "failed to trigger interrupt|no fd for interrupt|fatal" "$w/nvmf_tgt.log"; then
  grep -E "ERROR" "$w/nvmf_tgt.log" | head; fail "SPDK's target logged interrupt or fatal errors"
fi
# Every host of dpukv's left cleanly (shutdown, unmap, close): SPDK's target
# has no controller left, and then stops at SIGTERM.
no_controllers || fail "SPDK's target still has $n controllers after dpukv's hosts left"
kill -TERM "$spid"
for _ in $(seq 200); do kill -0 "$spid" 2>/dev/null || break; sleep 0.05; done
kill -0 "$spid" 2>/dev/null && fail "nvmf_tgt still running 10 s after SIGTERM"
wait "$spid" || true
pids=()
echo "interop with SPDK: all checks passed"
