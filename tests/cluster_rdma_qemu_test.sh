#!/usr/bin/env bash
# Two agents that read each other's chunks over RDMA: two Debian kernels booted under
# QEMU (TCG: KVM hangs these guests on this kind of machine), each with Soft-RoCE
# (rdma_rxe) on a NIC that joins the two guests (QEMU socket networking), and UCX
# limited to its verbs transports (UCX_TLS=rc_verbs,ud_verbs: no TCP to fall back
# on). Both agents use a Redis server on this host as their directory (QEMU user
# networking: the guests reach 127.0.0.1 as 10.0.2.2). A replay through agent A
# stores the trace's blocks; the same replay through agent B finds them on A and
# reads them one-sided into its arena, every byte checked. B's rxe counters show
# the packets that carried them.
#
# Needs: qemu-system-x86, linux-image-amd64, busybox-static, cpio, iproute2 (rdma),
# redis-server, and UCX's verbs module with rdma-core's rxe provider (libucx0,
# ibverbs-providers). A few minutes on 2 cores, mostly emulated CPU time.
set -euo pipefail
bin=${1:?usage: cluster_rdma_qemu_test.sh path/to/dpukv path/to/source}
src=${2:?usage: cluster_rdma_qemu_test.sh path/to/dpukv path/to/source}
bin=$(readlink -f "$bin")
kver=$(ls /lib/modules | sort -V | tail -1)
kernel=/boot/vmlinuz-$kver
multiarch=x86_64-linux-gnu
for need in qemu-system-x86_64 cpio busybox rdma redis-server strip modinfo; do
  command -v $need >/dev/null || { echo "cluster rdma: missing $need"; exit 2; }
done
[ -r "$kernel" ] || { echo "cluster rdma: missing $kernel (apt-get install linux-image-amd64)"; exit 2; }
for f in /usr/lib/$multiarch/ucx/libuct_ib.so.0 /usr/lib/$multiarch/libibverbs/librxe-rdmav34.so; do
  [ -r "$f" ] || { echo "cluster rdma: missing $f (libucx0, ibverbs-providers)"; exit 2; }
done
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
py=/usr/bin/python3
[ -x "$py" ] || py=python3
requests=${DPUKV_RDMA_REQUESTS:-60}

# ---- the initramfs (one for both guests; the role comes on the kernel command line)
root=$tmp/root
mkdir -p $root/usr/bin $root/usr/lib/$multiarch $root/usr/lib64 $root/proc $root/sys $root/dev \
  $root/tmp $root/etc/libibverbs.d $root/kmod
ln -s usr/bin $root/bin
ln -s usr/lib $root/lib
ln -s usr/lib64 $root/lib64
cp "$(command -v busybox)" $root/usr/bin/busybox
add_file() {  # a file at its own path, symlinks followed
  mkdir -p "$root$(dirname "$1")"
  [ -e "$root$1" ] || cp -L "$1" "$root$1"
}
add_libs() {  # the shared libraries a program or library loads
  local l
  for l in $(ldd "$1" | awk '/=>/ { print $3 } /^\t\/lib/ { print $1 }'); do add_file "$l"; done
}
strip -o $root/usr/bin/dpukv "$bin"
add_libs "$bin"
add_file "$(command -v rdma)"
add_libs "$(command -v rdma)"
for f in /usr/lib/$multiarch/ucx/*.so.0 /usr/lib/$multiarch/libibverbs/librxe-rdmav34.so; do
  add_file "$f"
  add_libs "$f"
done
cp /etc/libibverbs.d/rxe.driver $root/etc/libibverbs.d/
head -n "$requests" "$src/traces/mooncake_conversation_trace.jsonl" > $root/trace.jsonl
sed -n "$((requests + 1)),$((2 * requests))p" "$src/traces/mooncake_conversation_trace.jsonl" \
  > $root/trace2.jsonl
add_module() {  # dependencies first, each once
  local m=$1 f d
  grep -qx "$m" $tmp/order 2>/dev/null && return
  for d in $(modinfo -k "$kver" -F depends "$m" | tr ',' ' '); do add_module "$d"; done
  f=$(modinfo -k "$kver" -n "$m")
  case "$f" in
    *.ko.xz) xz -dc "$f" > $root/kmod/$m.ko ;;
    *.ko.zst) zstd -dcq "$f" > $root/kmod/$m.ko ;;
    *) cp "$f" $root/kmod/$m.ko ;;
  esac
  echo "$m" >> $tmp/order
}
# rxe checksums its packets with the kernel crypto API's crc32.
for m in e1000 crc32_generic rdma_rxe; do add_module $m; done
cp $tmp/order $root/modules.order

port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
link_port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
prefix=rdma$$
cat > $root/init <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/shm; mount -t tmpfs tmpfs /dev/shm; mount -t tmpfs tmpfs /tmp
for m in \$(cat /modules.order); do insmod /kmod/\$m.ko || echo "insmod \$m failed"; done
role=\$(sed -n 's/.*dpukv.role=\([ab]\).*/\1/p' /proc/cmdline)
n=1; [ "\$role" = b ] && n=2
for i in \$(seq 100); do [ -e /sys/class/net/eth1 ] && break; sleep 0.1; done  # NICs probe late
ip link set lo up
ip addr add 10.0.2.15/24 dev eth0; ip link set eth0 up
ip addr add 192.168.77.\$n/24 dev eth1; ip link set eth1 up
rdma link add rxe0 type rxe netdev eth1 || echo "DPUKV-RESULT: FAIL rxe"
for i in \$(seq 100); do grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null && break; sleep 0.1; done
echo "DPUKV-RXE-STATE \$role: \$(cat /sys/class/infiniband/rxe0/ports/1/state 2>&1)"
redis() { printf '%s\r\nQUIT\r\n' "\$1" | nc 10.0.2.2 $port; }
# GID 0 (the link-local RoCE v2 GID): with GID 1 (IPv4-mapped) UCX 1.13's UD wireup
# over rxe times out (ucx_perftest fails the same way; ibv_ud_pingpong on GID 1 works).
export UCX_TLS=rc_verbs,ud_verbs UCX_NET_DEVICES=rxe0:1 UCX_IB_GID_INDEX=0
dpukv --log-level warning agent --socket /tmp/agent.sock --memory-bytes 128M \
  --max-chunk-size 64K --metrics-port 0 --cluster redis://10.0.2.2:$port \
  --cluster-prefix $prefix --advertise 192.168.77.\$n 2>/tmp/agent.log &
for i in \$(seq 600); do [ -S /tmp/agent.sock ] && break; sleep 0.1; done
[ -S /tmp/agent.sock ] || { echo "DPUKV-RESULT: FAIL agent \$role"; cat /tmp/agent.log; poweroff -f; }
if [ "\$role" = b ]; then
  for i in \$(seq 1200); do redis "GET $prefix:test:stored" | grep -q done && break; sleep 0.5; done
  sleep 2  # B sees A live
  before=\$(cat /sys/class/infiniband/rxe0/ports/1/hw_counters/rcvd_pkts)
fi
dpukv --log-level error replay /trace.jsonl --agent /tmp/agent.sock --json > /tmp/replay.json \
  2>/tmp/replay.log || echo "DPUKV-RESULT: FAIL replay \$role"
if [ "\$role" = a ]; then
  redis "SET $prefix:test:stored done" >/dev/null
  for i in \$(seq 1200); do redis "GET $prefix:test:read" | grep -q done && break; sleep 0.5; done
  # A second agent on A that B has never reached stores the next requests and is
  # killed with -9 while the directory still lists it (its lease runs 10 s).
  dpukv --log-level warning agent --socket /tmp/a2.sock --memory-bytes 128M \
    --max-chunk-size 64K --metrics-port 0 --cluster redis://10.0.2.2:$port \
    --cluster-prefix $prefix --advertise 192.168.77.1 2>/tmp/a2.log &
  a2=\$!
  for i in \$(seq 600); do [ -S /tmp/a2.sock ] && break; sleep 0.1; done
  dpukv --log-level error replay /trace2.jsonl --agent /tmp/a2.sock --json > /tmp/replay2.json \
    2>>/tmp/replay.log || echo "DPUKV-RESULT: FAIL replay a2"
  sleep 0.5  # its entries are published
  kill -9 \$a2
  redis "SET $prefix:test:stored2 done" >/dev/null
  for i in \$(seq 1200); do redis "GET $prefix:test:read2" | grep -q done && break; sleep 0.5; done
else
  after=\$(cat /sys/class/infiniband/rxe0/ports/1/hw_counters/rcvd_pkts)
  echo "DPUKV-RXE: \$before \$after"
  echo "DPUKV-JSON: \$(tr -d '\n' < /tmp/replay.json)"
  redis "SET $prefix:test:read done" >/dev/null
  for i in \$(seq 1200); do redis "GET $prefix:test:stored2" | grep -q done && break; sleep 0.5; done
  dpukv --log-level error replay /trace2.jsonl --agent /tmp/agent.sock --json \
    > /tmp/replay2.json 2>>/tmp/replay.log || echo "DPUKV-RESULT: FAIL replay b after a2 died"
  echo "DPUKV-JSON2: \$(tr -d '\n' < /tmp/replay2.json)"
  redis "SET $prefix:test:read2 done" >/dev/null
fi
tail -n 40 /tmp/agent.log | sed "s/^/DPUKV-LOG \$role: /"
echo "DPUKV-DONE \$role"
poweroff -f
INIT
chmod +x $root/init
(cd $root && find . | cpio -o -H newc 2>/dev/null | gzip -1 > $tmp/initrd.gz)

redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --logfile /dev/null &
pids+=($!)
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.05; done

guest() {  # role socket-netdev-option mac
  timeout 900 qemu-system-x86_64 -accel tcg -m 1024 -smp 1 -nographic -no-reboot \
    -kernel "$kernel" -initrd $tmp/initrd.gz \
    -append "console=ttyS0 panic=-1 quiet loglevel=4 dpukv.role=$1" \
    -netdev user,id=u0 -device e1000,netdev=u0 \
    -netdev socket,id=l0,"$2" -device e1000,netdev=l0,mac="$3" \
    > $tmp/$1.log 2>&1 &
  pids+=($!)
}
echo "booting two guests under qemu (tcg), Soft-RoCE between them..."
guest a "listen=127.0.0.1:$link_port" 52:54:00:77:00:01
sleep 1
guest b "connect=127.0.0.1:$link_port" 52:54:00:77:00:02
wait "${pids[1]}" "${pids[2]}" || true
grep -aE "DPUKV-(RESULT|DONE|RXE|LOG)|insmod" $tmp/a.log $tmp/b.log || true
if grep -aq "DPUKV-RESULT: FAIL" $tmp/a.log $tmp/b.log || ! grep -aq "DPUKV-DONE b" $tmp/b.log; then
  echo "cluster rdma: FAILED; console tails:"
  for f in $tmp/a.log $tmp/b.log; do echo "--- $f"; tail -n 30 "$f"; done
  exit 1
fi
grep -a "DPUKV-JSON: " $tmp/b.log | sed 's/^.*DPUKV-JSON: //' | tr -d '\r' > $tmp/b.json
read -r before after < <(grep -a "DPUKV-RXE: " $tmp/b.log | sed 's/^.*DPUKV-RXE: //' | tr -d '\r')
grep -a "DPUKV-JSON2: " $tmp/b.log | sed 's/^.*DPUKV-JSON2: //' | tr -d '\r' > $tmp/b2.json
"$py" - $tmp/b.json "$before" "$after" $tmp/b2.json <<'PYEOF'
import json, sys
b = json.load(open(sys.argv[1]))
before, after = int(sys.argv[2]), int(sys.argv[3])
b2 = json.load(open(sys.argv[4]))
ag = b["agent"]
assert b["errors"] == 0 and b["verify_failures"] == 0, b["failures"]
assert ag["lookup_remote_hits"] > 0 and ag["remote_hits"] > 0, ag
assert ag["remote_checksum_failures"] == 0 and ag["remote_read_errors"] == 0, ag
# Every remote byte came over rxe0 (no other transport was allowed): at least one
# packet per 4 KiB of MTU-sized payload.
assert after - before >= ag["remote_bytes"] // 4096, (before, after, ag["remote_bytes"])
# The holder that died before B ever reached it: B's asks time out (its endpoint to
# the dead node is closed while UCX's wireup is still pending), the keys are misses,
# B stays up (it answered the replay and its stats) and every byte it served is right.
ag2 = b2["agent"]
assert b2["errors"] == 0 and b2["verify_failures"] == 0, b2["failures"]
assert ag2["remote_timeouts"] + ag2["remote_read_errors"] > ag["remote_timeouts"] + ag["remote_read_errors"], ag2
assert ag2["remote_checksum_failures"] == 0, ag2
print(f"cluster rdma: after the second holder was killed: {ag2['remote_timeouts']} timed-out "
      f"asks, {b2['block_hit_ratio']:.3f} block hits, every byte verified")
print(f"cluster rdma: B read {ag['remote_hits']} chunks ({ag['remote_bytes']} bytes) from A "
      f"over Soft-RoCE, {after - before} packets received on rxe0, every byte verified")
PYEOF
echo "cluster rdma: ok"
