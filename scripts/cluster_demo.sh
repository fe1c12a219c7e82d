#!/usr/bin/env bash
# A serving cluster on one machine (examples/cluster/README.md has the same steps for
# several): Redis, two dpukv agents in one cluster, two `vllm serve` engines (a prefill
# one, kv_producer, and a decode one, kv_consumer, each beside its own agent), and
# vLLM's router in its prefill/decode mode in front. Asks the router one chat question
# about the GPL-3 text, then prints what each agent did: the decode engine's agent
# read the prompt's KV from the prefill engine's agent. Everything it starts stops on
# exit. Needs `scripts/deps.sh --test` (the vLLM and router venvs, SmolLM2) and a build
# (cmake --preset release && cmake --build --preset release).
#   scripts/cluster_demo.sh [--keep]   (--keep: leave it serving until Ctrl-C)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/build/release/dpukv
pkg=$PWD/build/release/python
[ -x "$bin" ] || { echo "cluster_demo: build first (cmake --preset release && cmake --build --preset release)" >&2; exit 1; }
py=$(scripts/vllm_venv.sh --find) || { echo "cluster_demo: scripts/deps.sh --test first (the vLLM venv)" >&2; exit 1; }
router=$(scripts/vllm_router_venv.sh --find) || { echo "cluster_demo: scripts/deps.sh --test first (vllm-router)" >&2; exit 1; }
model=$(scripts/smollm2_model.sh --find) || { echo "cluster_demo: scripts/deps.sh --test first (SmolLM2)" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "cluster_demo: redis-server is not installed" >&2; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
wait_for() {  # what, then a command that succeeds once it is up
  local what=$1
  shift
  echo "cluster_demo: waiting for $what" >&2
  until "$@" >/dev/null 2>&1; do sleep 0.5; done
}
redis_port=6390 prefill_port=8101 decode_port=8102 router_port=8100

# 1. The cluster's directory.
redis-server --port $redis_port --bind 127.0.0.1 --save "" --appendonly no --logfile "$tmp/redis.log" &
pids+=($!)
wait_for redis bash -c "exec 3<>/dev/tcp/127.0.0.1/$redis_port"
# 2. An agent beside each engine, both in the cluster.
for side in prefill decode; do
  "$bin" --log-level warning agent --socket "$tmp/$side.sock" --memory-bytes 1G --metrics-port 0 \
    --cluster redis://127.0.0.1:$redis_port --advertise 127.0.0.1 &
  pids+=($!)
done
wait_for agents test -S "$tmp/decode.sock" -a -S "$tmp/prefill.sock"
# 3. The engines, each with dpukv as its connector: one produces KV, one consumes it.
for side in prefill decode; do
  role=$([ $side = prefill ] && echo kv_producer || echo kv_consumer)
  port=$([ $side = prefill ] && echo $prefill_port || echo $decode_port)
  PYTHONPATH=$pkg VLLM_LOGGING_LEVEL=WARNING "$py" -m vllm.entrypoints.cli.main serve "$model" \
    --served-model-name smollm2 --host 127.0.0.1 --port $port --max-model-len 4096 --enforce-eager \
    --kv-cache-memory-bytes 268435456 --no-enable-prefix-caching --kv-transfer-config \
    "{\"kv_connector\": \"DpukvConnectorV1\", \"kv_connector_module_path\": \"dpukv.vllm\", \"kv_role\": \"$role\", \"kv_connector_extra_config\": {\"dpukv.socket\": \"$tmp/$side.sock\"}}" \
    >"$tmp/serve-$side.log" 2>&1 &
  pids+=($!)
done
wait_for "the engines (a minute or two)" bash -c \
  "curl -sf 127.0.0.1:$prefill_port/health && curl -sf 127.0.0.1:$decode_port/health"
# 4. vLLM's router: prefill on one engine, decode on the other.
"$router" --host 127.0.0.1 --port $router_port --vllm-pd-disaggregation \
  --prefill http://127.0.0.1:$prefill_port --decode http://127.0.0.1:$decode_port \
  >"$tmp/router.log" 2>&1 &
pids+=($!)
wait_for "the router" curl -sf 127.0.0.1:$router_port/health

echo "cluster_demo: asking the router about the GPL-3 text"
request=$("$py" -c '
import json
text = open("/usr/share/common-licenses/GPL-3").read()[:4000]
print(json.dumps({"model": "smollm2", "temperature": 0, "max_tokens": 32, "messages": [
    {"role": "user", "content": text + "\n\nWho may copy this text?"}]}))')
curl -s 127.0.0.1:$router_port/v1/chat/completions -H 'Content-Type: application/json' \
  -d "$request" | "$py" -c 'import json, sys; print("answer:", json.load(sys.stdin)["choices"][0]["message"]["content"])'
for side in prefill decode; do
  echo "$side agent: $("$bin" stat --socket "$tmp/$side.sock" --json | "$py" -c '
import json, sys
d = json.load(sys.stdin)
print("%d chunks stored, %d retrieved, %d of them read from the other agent (%d bytes)" % (
    d["stores"], d["retrieves"], d["lookup_remote_hits"], d["remote_bytes"]))')"
done
if [ "${1:-}" = "--keep" ]; then
  echo "cluster_demo: serving at http://127.0.0.1:$router_port (Ctrl-C stops everything)"
  wait
fi
