#!/usr/bin/env bash
# The real-initiator test: Debian's Linux kernel, booted under QEMU (TCG: no KVM
# here) with a busybox initramfs, connects its own nvme-tcp driver to a dpukv
# NVMe/TCP target on this host (QEMU user networking: the guest reaches
# 127.0.0.1 as 10.0.2.2), writes a pattern with O_DIRECT, reads it back and
# compares: once without digests, once with header and data digests. Prints the
# guest console; exit 0 only if both rounds report PASS.
#
# Needs: qemu-system-x86, linux-image-amd64, busybox-static, cpio (Debian). The
# test's time is mostly the TCG boot (a minute or two on 2 cores).
set -euo pipefail
bin=${1:?usage: linux_nvme_tcp_test.sh path/to/dpukv}
bin=$(readlink -f "$bin")
kver=$(ls /lib/modules | sort -V | tail -1)
kernel=/boot/vmlinuz-$kver
for need in qemu-system-x86_64 cpio busybox; do
  command -v $need >/dev/null || { echo "missing $need (apt-get install qemu-system-x86 cpio busybox-static)"; exit 2; }
done
[ -r "$kernel" ] || { echo "missing $kernel (apt-get install linux-image-amd64)"; exit 2; }
tmp=$(mktemp -d)
target=""
trap '[ -n "$target" ] && kill $target 2>/dev/null; rm -rf "$tmp"' EXIT
port=$((24420 + $$ % 10000))
nqn=nqn.2026-11.io.dpukv:linux-initiator

# The initramfs: busybox, the nvme-tcp stack and an e1000 NIC driver, an init script.
root=$tmp/root
mkdir -p $root/bin $root/lib $root/proc $root/sys $root/dev $root/tmp
cp "$(command -v busybox)" $root/bin/busybox
modpath() { modinfo -k "$kver" -n "$1"; }
add_module() {  # dependencies first, each once
  local m=$1 f deps
  grep -qx "$m" $tmp/order 2>/dev/null && return
  deps=$(modinfo -k "$kver" -F depends "$m" | tr ',' ' ')
  for d in $deps; do add_module "$d"; done
  f=$(modpath "$m")
  case "$f" in
    *.ko.xz) xz -dc "$f" > $root/lib/$m.ko ;;
    *.ko.zst) zstd -dcq "$f" > $root/lib/$m.ko ;;
    *) cp "$f" $root/lib/$m.ko ;;
  esac
  echo "$m" >> $tmp/order
}
for m in e1000 crc32c_generic nvme-core nvme-fabrics nvme-tcp; do add_module $m; done
cp $tmp/order $root/modules.order
cat > $root/init <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in \$(cat /modules.order); do insmod /lib/\$m.ko || echo "insmod \$m failed"; done
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
dd if=/dev/urandom of=/tmp/pattern bs=4096 count=256 2>/dev/null
round() {
  opts="transport=tcp,traddr=10.0.2.2,trsvcid=$port,nqn=$nqn\$1"
  if ! echo "\$opts" > /dev/nvme-fabrics; then echo "DPUKV-RESULT: FAIL connect \$2"; return; fi
  dev=""
  for i in \$(seq 100); do
    for d in /dev/nvme*n1; do [ -b "\$d" ] && dev=\$d; done
    [ -n "\$dev" ] && break
    sleep 0.1
  done
  [ -n "\$dev" ] || { echo "DPUKV-RESULT: FAIL no block device \$2"; return; }
  # The node can appear before the namespace takes I/O, and a disk whose capacity
  # is still 0 "reads" 0 bytes with success (and refuses the writes): ready once
  # the capacity is set and a whole block at the round's offset reads back.
  ready=""
  for i in \$(seq 100); do
    sectors=\$(cat /sys/block/\${dev#/dev/}/size 2>/dev/null || echo 0)
    if [ "\$sectors" -gt 0 ] && dd if=\$dev of=/tmp/probe bs=4096 count=1 skip=\$3 iflag=direct 2>/dev/null &&
       [ "\$(wc -c < /tmp/probe)" -eq 4096 ]; then ready=1; break; fi
    sleep 0.1
  done
  echo "size \$(cat /sys/block/\${dev#/dev/}/size) ro \$(cat /sys/block/\${dev#/dev/}/ro)"
  [ -n "\$ready" ] || { echo "DPUKV-RESULT: FAIL not ready \$2 (\$dev)"; return; }
  if ! dd if=/tmp/pattern of=\$dev bs=4096 count=256 seek=\$3 oflag=direct 2>/tmp/err; then
    echo "DPUKV-RESULT: FAIL write \$2: \$(tr '\n' ' ' < /tmp/err)"
  elif ! dd if=\$dev of=/tmp/back bs=4096 count=256 skip=\$3 iflag=direct 2>/tmp/err; then
    echo "DPUKV-RESULT: FAIL read \$2: \$(tr '\n' ' ' < /tmp/err)"
  elif ! dd if=\$dev of=/tmp/big bs=131072 count=8 skip=0 iflag=direct 2>/tmp/err; then
    echo "DPUKV-RESULT: FAIL large read \$2: \$(tr '\n' ' ' < /tmp/err)"
  elif cmp /tmp/pattern /tmp/back; then
    echo "DPUKV-RESULT: PASS \$2 (\$dev)"
  else
    echo "DPUKV-RESULT: FAIL data \$2"
  fi
  for c in /sys/class/nvme/nvme*; do echo 1 > \$c/delete_controller; done
  # Gone before the next round looks for its device (not this one's old node).
  for i in \$(seq 100); do ls /dev/nvme*n1 >/dev/null 2>&1 || break; sleep 0.1; done
}
round "" no-digests 100
round ",hdr_digest,data_digest" digests 600
echo "DPUKV-DONE"
poweroff -f
INIT
chmod +x $root/init
(cd $root && find . | cpio -o -H newc 2>/dev/null | gzip -1 > $tmp/initrd.gz)

"$bin" --lib-log-level ${DPUKV_LOG_LEVEL:-warning} nvme target --transport tcp --listen 127.0.0.1:$port --nqn $nqn --size 64M 2>$tmp/target.log &
target=$!
for _ in $(seq 200); do
  ss -Hltn "sport = :$port" | grep -q . && break
  kill -0 $target 2>/dev/null || { cat $tmp/target.log; echo "the target exited"; exit 1; }
  sleep 0.05
done
# TCG unless DPUKV_QEMU_ACCEL=kvm: on these machines /dev/kvm opens, but Debian's
# kernel hangs after "Probing EDD" with QEMU's default CPU under KVM, and -cpu host
# aborts (MSR 0x10a cannot be set), so KVM is opt-in where it works.
accel=${DPUKV_QEMU_ACCEL:-tcg}
echo "booting $kernel under qemu ($accel)..."
timeout 600 qemu-system-x86_64 -accel $accel -m 512 -smp 1 -nographic -no-reboot \
  -kernel "$kernel" -initrd $tmp/initrd.gz -append "console=ttyS0 panic=-1 quiet loglevel=4" \
  -netdev user,id=n0 -device e1000,netdev=n0 > $tmp/console.log 2>&1 || true
grep -E "DPUKV|nvme|insmod|^size" $tmp/console.log || true
kill $target; wait $target 2>/dev/null || true; target=""
cat $tmp/target.log
pass=$(grep -c "DPUKV-RESULT: PASS" $tmp/console.log || true)
if [ "$pass" != 2 ]; then
  echo "linux initiator: FAILED ($pass of 2 rounds passed); console tail:"
  tail -40 $tmp/console.log
  exit 1
fi
echo "linux initiator: ok (nvme-tcp without and with digests)"
