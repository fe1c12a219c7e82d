#!/usr/bin/env bash
# dpukv's NVMe targets and host side by side with SPDK's, in one run:
#   1. SPDK's spdk_nvme_perf as the host against dpukv's target (`dpukv nvme`)
#      and against SPDK's nvmf_tgt, both configured by rpc.py alike (1 GiB
#      malloc, 4 KiB blocks), over vfio-user and NVMe/TCP (keep-alive off).
#   2. dpukv's host (`dpukv nvme perf`) and SPDK's host against SPDK's target.
# Target on CPU 0, host on CPU 1; each point runs TIME seconds; the figure is
# the median of ROUNDS rounds, the targets taking turns within each round.
#   scripts/nvme_vs_spdk.sh [--time S] [--rounds N] [--transports vfio-user,tcp] [--json]
# Needs SPDK (scripts/spdk.sh) and hugepages (set up here, as root).
set -euo pipefail
cd "$(dirname "$0")/.."
time_s=10 rounds=3 json=0 transports="vfio-user tcp"
while [ $# -gt 0 ]; do
  case $1 in
    --time) time_s=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --json) json=1; shift ;;
    --transports) transports=${2//,/ }; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
dpukv=${DPUKV_BIN:-build/release/dpukv}
spdk=${DPUKV_SPDK_DIR:-$(scripts/spdk.sh)}
export LD_LIBRARY_PATH=$spdk/build/lib:$spdk/build/libvfio-user/build-release/lib
[ "$(cat /proc/sys/vm/nr_hugepages)" -ge 1024 ] || echo 1024 > /proc/sys/vm/nr_hugepages
mkdir -p /dev/hugepages; mountpoint -q /dev/hugepages || mount -t hugetlbfs nodev /dev/hugepages
w=$(mktemp -d /tmp/dpukv-vs-spdk.XXXXXX)
nqn=nqn.2026-11.io.dpukv:perf
port=4420
tpid=""
# shellcheck source=spdk_hugepages.sh
. scripts/spdk_hugepages.sh  # drop_stale_spdk_hugepages
cleanup() {
  [ -n "$tpid" ] && { kill "$tpid" 2>/dev/null; sleep 1; kill -9 "$tpid" 2>/dev/null; } || true
  rm -rf "$w"
  drop_stale_spdk_hugepages
}
trap cleanup EXIT
log() { [ $json = 1 ] || echo "$*" >&2; }
rpc() { /usr/bin/python3 "$spdk/scripts/rpc.py" -s "$w/rpc.sock" "$@" >/dev/null; }

start_target() {  # dpukv | spdk
  rm -rf "$w/vu" "$w/rpc.sock"; mkdir -p "$w/vu"
  if [ "$1" = dpukv ]; then
    "$dpukv" --lib-log-level error nvme -r "$w/rpc.sock" -m 0x1 >"$w/target.log" 2>&1 &
  else
    "$spdk/build/bin/nvmf_tgt" -m 0x1 -r "$w/rpc.sock" >"$w/target.log" 2>&1 &
  fi
  tpid=$!
  for _ in $(seq 400); do rpc -t 1 rpc_get_methods 2>/dev/null && break; sleep 0.05; done
  rpc nvmf_create_transport -t TCP
  rpc nvmf_create_transport -t VFIOUSER
  rpc bdev_malloc_create 1024 4096 -b Malloc0
  rpc nvmf_create_subsystem "$nqn" -a -s PERF0001
  rpc nvmf_subsystem_add_ns "$nqn" Malloc0
  rpc nvmf_subsystem_add_listener "$nqn" -t TCP -a 127.0.0.1 -s $port
  rpc nvmf_subsystem_add_listener "$nqn" -t VFIOUSER -a "$w/vu" -s 0
}
stop_target() {
  kill -TERM "$tpid"
  for _ in $(seq 200); do kill -0 "$tpid" 2>/dev/null || break; sleep 0.05; done
  kill -9 "$tpid" 2>/dev/null || true; wait "$tpid" 2>/dev/null || true; tpid=""
}
trid() {
  if [ "$1" = tcp ]; then echo "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$port subnqn:$nqn"
  else echo "trtype:VFIOUSER traddr:$w/vu subnqn:$nqn"; fi
}
spdk_host() {  # transport workload qd -> "IOPS p99_us"
  local out
  out=$("$spdk/build/bin/spdk_nvme_perf" -c 0x2 -g -s 512 -k 0 -q "$3" -o 4096 -w "$2" -t "$time_s" -L \
        -r "$(trid "$1")" 2>&1) || { echo "0 0"; return; }
  local iops p99
  iops=$(echo "$out" | awk '/^Total/ {print $3; exit}')
  p99=$(echo "$out" | awk '/99.00000%/ {gsub("us","",$3); print $3; exit}')
  echo "${iops:-0} ${p99:-0}"
}
dpukv_host() {  # transport workload qd -> "IOPS p99_us"
  local args
  if [ "$1" = tcp ]; then args=(--transport tcp --address "127.0.0.1:$port" --nqn "$nqn")
  else args=(--socket "$w/vu/cntrl"); fi
  "$dpukv" nvme perf "${args[@]}" -w "$2" -q "$3" -o 4K -t "$time_s" --warmup 0.5 --cpu 1 --json \
    2>/dev/null | /usr/bin/python3 -c 'import json,sys
r=json.load(sys.stdin)["results"][0]; print(r["iops"], r["p99_us"])' 2>/dev/null || echo "0 0"
}

points=()
for tr in $transports; do for wl in randread randwrite; do for qd in 1 32; do
  points+=("$tr $wl $qd"); done; done; done
declare -A res
for ((round = 1; round <= rounds; round++)); do
  for target in dpukv spdk; do
    log "round $round/$rounds: $target's target"
    start_target $target
    for p in "${points[@]}"; do
      set -- $p
      res["$target-spdkhost-$1-$2-$3-$round"]=$(spdk_host "$1" "$2" "$3")
      log "  SPDK host  $1 $2 q$3: ${res["$target-spdkhost-$1-$2-$3-$round"]}"
      if [ $target = spdk ]; then
        res["$target-dpukvhost-$1-$2-$3-$round"]=$(dpukv_host "$1" "$2" "$3")
        log "  dpukv host $1 $2 q$3: ${res["$target-dpukvhost-$1-$2-$3-$round"]}"
      fi
    done
    stop_target
  done
done

median() { tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
col() {  # key field(1 iops, 2 p99)
  local v=()
  for ((round = 1; round <= rounds; round++)); do v+=("$(echo "${res["$1-$round"]}" | cut -d' ' -f"$2")"); done
  echo "${v[@]}" | median
}
rows=()
for p in "${points[@]}"; do
  set -- $p
  k="$1-$2-$3"
  rows+=("$1 $2 $3 $(col dpukv-spdkhost-$k 1) $(col spdk-spdkhost-$k 1) $(col spdk-dpukvhost-$k 1) $(col dpukv-spdkhost-$k 2) $(col spdk-spdkhost-$k 2) $(col spdk-dpukvhost-$k 2)")
done
if [ $json = 1 ]; then
  printf '%s\n' "${rows[@]}" | /usr/bin/python3 -c 'import json,sys
rows=[]
for line in sys.stdin:
    t,w,q,a,b,c,pa,pb,pc=line.split()
    a,b,c=float(a),float(b),float(c)
    rows.append({"transport":t,"workload":w,"qd":int(q),"block_size":4096,
      "dpukv_target_iops":a,"baseline_spdk_target_iops":b,"ratio":round(a/b,3) if b else None,
      "dpukv_host_iops":c,"spdk_host_iops":b,"host_ratio":round(c/b,3) if b else None,
      "p99_us":{"dpukv_target":float(pa),"spdk_target":float(pb),"dpukv_host":float(pc)}})
print(json.dumps({"bench":"nvme_vs_spdk","results":rows}))'
  exit 0
fi
printf "\n4 KiB, %s s a point, median of %s rounds; target on CPU 0, host on CPU 1\n" "$time_s" "$rounds"
printf "%-9s %-9s %3s | %12s %12s %6s | %12s %6s | %9s %9s %9s\n" transport workload qd \
  "dpukv tgt" "SPDK tgt" ratio "dpukv host" ratio "p99 dpukv" "p99 SPDK" "p99 dhost"
printf "%-9s %-9s %3s | %12s %12s %6s | %12s %6s | %9s %9s %9s\n" "" "" "" \
  "(SPDK host)" "(SPDK host)" "" "(SPDK tgt)" "" "tgt us" "tgt us" "us"
for r in "${rows[@]}"; do
  set -- $r
  awk -v t="$1" -v w="$2" -v q="$3" -v a="$4" -v b="$5" -v c="$6" -v pa="$7" -v pb="$8" -v pc="$9" 'BEGIN {
    printf "%-9s %-9s %3s | %12.0f %12.0f %6.2f | %12.0f %6.2f | %9.1f %9.1f %9.1f\n",
      t, w, q, a, b, (b ? a / b : 0), c, (b ? c / b : 0), pa, pb, pc }'
done
