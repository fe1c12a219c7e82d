#!/usr/bin/env bash
# `dpukv nvme` (the NVMe-oF target application) configured from an SPDK-style
# JSON config and over JSON-RPC with `dpukv rpc`: bdevs, TCP and vfio-user
# transports, subsystems, listeners, namespaces, hosts, the emulation manager's
# functions, stats; I/O through both transports; clear errors for bad calls;
# --wait-for-rpc and --rpcs-allowed.
set -euo pipefail
bin=$1
py=/usr/bin/python3
[ -x "$py" ] || py=python3
tmp=$(mktemp -d)
sock=$tmp/rpc.sock
port=$((20000 + $$ % 12000))  # below the ephemeral ports (32768-)
nqn=nqn.2026-11.io.dpukv:cli
app=""
cleanup() { [ -n "$app" ] && kill "$app" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
rpc() { "$bin" rpc -s "$sock" "$@"; }
expect_fail() {  # expect_fail "message part" method params...
  local want=$1; shift
  if rpc "$@" 2>"$tmp/err"; then echo "expected failure: $*"; exit 1; fi
  grep -q -- "$want" "$tmp/err" || { echo "wrong error for $*:"; cat "$tmp/err"; exit 1; }
}
wait_sock() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1"; exit 1; }

cat > "$tmp/config.json" <<JSON
{"subsystems": [
  {"subsystem": "bdev", "config": [
    {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 16384, "block_size": 4096}},
    {"method": "bdev_null_create", "params": {"name": "Null0", "num_blocks": 1024, "block_size": 512}}]},
  {"subsystem": "nvmf", "config": [
    {"method": "nvmf_create_transport", "params": {"trtype": "TCP", "max_queue_depth": 64}},
    {"method": "nvmf_create_transport", "params": {"trtype": "VFIOUSER"}},
    {"method": "nvmf_create_subsystem", "params": {"nqn": "$nqn", "allow_any_host": true, "serial_number": "CLI0001"}},
    {"method": "nvmf_subsystem_add_ns", "params": {"nqn": "$nqn", "namespace": {"bdev_name": "Malloc0"}}},
    {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "$nqn",
      "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "$port"}}}]}]}
JSON
"$bin" nvme -r "$sock" --config "$tmp/config.json" 2>"$tmp/app.log" &
app=$!
wait_sock "$sock"

rpc rpc_get_methods | "$py" -c '
import json, sys
m = set(json.load(sys.stdin))
need = {"rpc_get_methods", "bdev_malloc_create", "bdev_file_create", "bdev_null_create", "bdev_get_bdevs",
        "bdev_delete", "nvmf_create_transport", "nvmf_get_transports", "nvmf_create_subsystem",
        "nvmf_delete_subsystem", "nvmf_get_subsystems", "nvmf_subsystem_add_listener",
        "nvmf_subsystem_remove_listener", "nvmf_subsystem_add_ns", "nvmf_subsystem_remove_ns", "nvmf_get_stats",
        "nvmf_doca_get_managers", "nvmf_doca_create_function", "nvmf_doca_destroy_function",
        "nvmf_doca_list_functions"}
assert need <= m, need - m
'
rpc nvmf_get_transports | "$py" -c '
import json, sys
t = {x["trtype"]: x for x in json.load(sys.stdin)}
assert set(t) == {"TCP", "VFIOUSER"} and t["TCP"]["max_queue_depth"] == 64, t
'
rpc nvmf_get_subsystems nqn=$nqn | "$py" -c '
import json, sys
s = json.load(sys.stdin)[0]
assert s["serial_number"] == "CLI0001" and s["namespaces"][0]["bdev_name"] == "Malloc0", s
assert s["listen_addresses"][0]["trsvcid"] == "'$port'", s
'
# I/O over NVMe/TCP through the configured listener.
"$bin" nvme perf --transport tcp --address 127.0.0.1:$port --nqn $nqn --workload randwrite,randread \
  --qd 1,4 --time 0.2 --warmup 0.05 --json | "$py" -c '
import json, sys
rows = json.load(sys.stdin)["results"]
assert len(rows) == 4 and all(r["iops"] > 0 and r["errors"] == 0 for r in rows), rows
'
# A vfio-user function of the same subsystem (the emulation manager), then I/O through it.
rpc nvmf_doca_get_managers | grep -q vfio-user
rpc nvmf_doca_create_function nqn=$nqn socket_path=$tmp/fn0.sock id=fn0 | grep -q '"power_on"'
"$bin" nvme identify --socket "$tmp/fn0.sock" --json | "$py" -c '
import json, sys
d = json.load(sys.stdin)
assert d["serial"] == "CLI0001" and d["subsystem_nqn"] == "'$nqn'" and d["namespaces"][0]["blocks"] == 16384, d
'
"$bin" nvme perf --socket "$tmp/fn0.sock" --workload randread --qd 4 --time 0.2 --warmup 0.05 --json >/dev/null
# A namespace added later is visible to the function (one namespace set per subsystem).
test "$(rpc nvmf_subsystem_add_ns nqn=$nqn namespace.bdev_name=Null0)" = 2
"$bin" nvme identify --socket "$tmp/fn0.sock" | grep -q "namespace 2: 1024 blocks of 512 bytes"
rpc nvmf_doca_list_functions | grep -q '"fn0"'
rpc nvmf_doca_destroy_function id=fn0
test "$(rpc nvmf_doca_list_functions)" = "[]"
# Stats count the TCP work above.
rpc nvmf_get_stats | "$py" -c '
import json, sys
g = json.load(sys.stdin)["poll_groups"][0]["transports"]
tcp = [t for t in g if t["trtype"] == "TCP"][0]
assert tcp["commands"] > 100 and tcp["connections"] >= 2, tcp
'
# Errors are clear and change nothing.
expect_fail "Method not found" no_such_method
expect_fail "missing 'num_blocks'" bdev_malloc_create name=M1
expect_fail "'num_blocks' must be a non-negative integer" bdev_malloc_create name=M1 num_blocks='"many"'
expect_fail "block_size must be 512 or 4096" bdev_malloc_create name=M1 num_blocks=8 block_size=1000
expect_fail "unknown parameter 'nmae'" bdev_malloc_create nmae=M1 num_blocks=8
expect_fail "already exists" bdev_malloc_create name=Malloc0 num_blocks=8
expect_fail "is a namespace of a subsystem" bdev_delete name=Malloc0
expect_fail "not found" nvmf_subsystem_add_ns nqn=$nqn namespace.bdev_name=nope
expect_fail "nqn must be" nvmf_create_subsystem nqn=not-an-nqn
expect_fail "trtype must be TCP or VFIOUSER" nvmf_create_transport trtype=RDMA
expect_fail "already exists" nvmf_create_transport trtype=TCP
expect_fail "listen_address" nvmf_subsystem_add_listener nqn=$nqn listen_address.trtype=TCP
expect_fail "not found" nvmf_delete_subsystem nqn=nqn.2026-11.io.dpukv:none
"$py" - "$sock" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.settimeout(10)
pending = ""
def next_response():
    global pending
    dec = json.JSONDecoder()
    while True:
        try:
            obj, end = dec.raw_decode(pending.lstrip())
            pending = pending.lstrip()[end:]
            return obj
        except ValueError:
            pending += s.recv(65536).decode()
def call(raw):
    s.sendall(raw)
    return next_response()
r = call(b'{"jsonrpc": "2.0", "id": 5, "method": "bdev_get_bdevs", "params": [1, 2]}')
assert r["error"]["code"] == -32602, r  # params of the wrong shape for this method
r = call(b'{"jsonrpc": "1.0", "id": 6, "method": "rpc_get_methods"}')
assert r["error"]["code"] == -32600 and r["id"] == 6, r
r = call(b'[{"jsonrpc": "2.0", "id": 7, "method": "rpc_get_methods"}]')
assert r["error"]["code"] == -32600, r
r = call(b'{"jsonrpc": "2.0", "id": 8, "method": "bdev_get_bdevs"} {"jsonrpc": "2.0", "id": 9, "method": "x"}')
assert r["id"] == 8 and len(r["result"]) == 2, r  # two requests in one write: both answered in order
r = next_response()
assert r["id"] == 9 and r["error"]["code"] == -32601, r
r = call(b'{"jsonrpc": "2.0", "id": 10, "method": 5}')
assert r["error"]["code"] == -32600, r
s.sendall(b'{"jsonrpc": "2.0", "id": 11, "method": "bdev_get_bdevs", ')  # incomplete, then gone
s.close()
PY
rpc bdev_get_bdevs | grep -q Malloc0  # still serving after all of it
# Names are strings; one bdev is at most one namespace of a subsystem.
expect_fail "'name' must be a string" bdev_malloc_create name=5 num_blocks=8
expect_fail "already a namespace of" nvmf_subsystem_add_ns nqn=$nqn namespace.bdev_name=Malloc0
# A second application on the same RPC path is refused; the first stays manageable.
set +e
timeout 20 "$bin" nvme -r "$sock" 2>"$tmp/second.log"; rc=$?
set -e
[ "$rc" -ne 0 ] && grep -q "in use by a running server" "$tmp/second.log" || {
  echo "second app on a live RPC socket: exit $rc"; cat "$tmp/second.log"; exit 1; }
rpc bdev_get_bdevs | grep -q Malloc0
# A client that sends without reading does not block the others: -t bounds the call.
"$py" - "$sock" <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.setblocking(False)
req = b'{"jsonrpc": "2.0", "id": 1, "method": "bdev_get_bdevs"}' * 1000
end = time.time() + 8
while time.time() < end:
    try:
        s.send(req)
    except BlockingIOError:
        time.sleep(0.01)
PY
hog=$!
sleep 1
start=$(date +%s%N)
"$bin" rpc -s "$sock" -t 5 bdev_get_bdevs | grep -q Malloc0
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ "$ms" -lt 3000 ] || { echo "rpc took $ms ms behind a client that does not read"; exit 1; }
kill $hog 2>/dev/null || true
wait $hog 2>/dev/null || true
# Subsystem and bdev teardown.
rpc nvmf_subsystem_remove_ns nqn=$nqn nsid=2
rpc bdev_delete name=Null0
rpc nvmf_subsystem_remove_listener nqn=$nqn listen_address.trtype=TCP listen_address.traddr=127.0.0.1 \
  listen_address.trsvcid=$port
rpc nvmf_delete_subsystem nqn=$nqn
test "$(rpc nvmf_get_subsystems)" = "[]"
kill $app; wait $app; app=""

# --wait-for-rpc: only startup methods until framework_start_init; --rpcs-allowed.
"$bin" nvme -r "$sock" --wait-for-rpc --rpcs-allowed rpc_get_methods,framework_start_init,bdev_get_bdevs \
  2>"$tmp/app2.log" &
app=$!
wait_sock "$sock"
expect_fail "framework_start_init" bdev_get_bdevs
rpc framework_start_init
rpc bdev_get_bdevs >/dev/null
expect_fail "Method not allowed" bdev_malloc_create name=M num_blocks=8
kill $app; wait $app; app=""
echo "cli rpc: ok"
