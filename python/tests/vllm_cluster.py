"""A serving cluster on one machine, for python/tests/test_vllm_cluster.py and
python/benchmarks/bench_vllm_cluster.py (issue 49): a Redis, one dpukv agent per
vLLM engine (in one cluster or each alone), `vllm serve` engines of the tiny Llama
with dpukv as connector (kv_both) and vLLM's KV events on ZMQ, and `vllm-router`
in front with one of its policies. Requests are token ids (the router does not
tokenize for HTTP workers), one at a time: each request's engine and its cached
prompt tokens are read from the engines' own counters (vLLM's
prompt_tokens_by_source) before and after it.

The router's `kv_aware` policy scores engines from their KV event streams: vLLM's
own (the blocks in its cache) and, through the connector's `take_events()`, the
agent's event feed (chunks held by the dpukv agent beside that engine, medium
"CPU"). That feed is how dpukv tells the router where a prompt's KV is, in the
router's own terms (`--kv-event-source WORKER_URL=ENDPOINT`).

Helpers take the vLLM venv's python, the package folder and the dpukv binary as
set up by test_vllm_engine (argv)."""
import json
import os
import subprocess
import time

from test_vllm_engine import BIN, VOCAB, kill, stat  # noqa: F401
from test_vllm_pd import listening, router_healthy, until
from test_vllm_pd import prompt_sources as sources  # vLLM's count by source, per engine
from test_vllm_serve import free_port, healthy, launch, post, stop

BLOCK_TOKENS = 128  # tokens per Mooncake hash id (its blocks are 512: scaled by 1/4)
# The engines' served model name, the one requests name and the router's
# --kv-event-model: kv_aware scores a request only against KV events of its model.
NAME = "cluster"


def start_redis(tmp):
    port = free_port()
    p = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save",
                          "", "--appendonly", "no", "--logfile", os.path.join(tmp, "redis.log")])
    until("redis listening", lambda: listening(port))
    return p, port


def start_agents(tmp, n, memory_bytes, redis_port=None):
    """n agents, each with memory_bytes of memory; in one cluster when redis_port is
    given. (processes, sockets)"""
    socks = [os.path.join(tmp, f"agent{i}.sock") for i in range(n)]
    procs = []
    for s in socks:
        if os.path.exists(s):
            os.unlink(s)
        cmd = [BIN, "--log-level", "warning", "agent", "--socket", s, "--memory-bytes",
               str(memory_bytes), "--max-chunk-size", "1M", "--metrics-port", "0"]
        if redis_port is not None:
            cmd += ["--cluster", f"redis://127.0.0.1:{redis_port}", "--advertise", "127.0.0.1"]
        procs.append(subprocess.Popen(cmd))
    def listening_all():
        assert all(p.poll() is None for p in procs), "an agent exited before it listened"
        return all(os.path.exists(s) for s in socks)
    until("the agents listening", listening_all)
    return procs, socks


def start_engines(py, model, socks, tmp, max_len=4096, kv_bytes=8 << 20):
    """One `vllm serve` per agent socket, started together, returned once all answer
    /health: [(process, http port, KV event port)]. vLLM's prefix cache is on (its
    block hashes are what KV events name) and small (kv_bytes), so the agents hold
    most of the cache."""
    started = []
    for i, sock in enumerate(socks):
        port, events = free_port(), free_port()
        cfg = {"kv_connector": "DpukvConnectorV1", "kv_connector_module_path": "dpukv.vllm",
               "kv_role": "kv_both",
               "kv_connector_extra_config": {"dpukv.socket": sock, "dpukv.model": NAME}}
        ev = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events}"}
        cmd = [py, "-m", "vllm.entrypoints.cli.main", "serve", model, "--kv-transfer-config",
               json.dumps(cfg), "--kv-events-config", json.dumps(ev), "--host", "127.0.0.1",
               "--port", str(port), "--skip-tokenizer-init", "--dtype", "bfloat16",
               "--max-model-len", str(max_len), "--max-num-batched-tokens", str(max_len),
               "--enforce-eager", "--seed", "0", "--max-num-seqs", "4",
               "--kv-cache-memory-bytes", str(kv_bytes), "--served-model-name", NAME]
        started.append((launch(cmd, os.path.join(tmp, f"serve{i}.log")), port, events))
    return [(healthy(l, port), port, events) for l, port, events in started]


def start_router(router_bin, engines, policy, tmp, temperature=None):
    """vllm-router over the engines with policy; kv_aware subscribes to every
    engine's KV events (temperature: its softmax over engines' costs, None: its
    default, the cheapest). Returns (process, port) once it is healthy."""
    port = free_port()
    cmd = [router_bin, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
           "--log-level", "debug", "--worker-urls"] + [f"http://127.0.0.1:{p}" for _, p, _ in engines]
    if policy == "kv_aware":
        cmd += ["--kv-event-model", NAME, "--kv-event-block-size", "128"]
        for _, p, e in engines:
            cmd += ["--kv-event-source", f"http://127.0.0.1:{p}=tcp://127.0.0.1:{e}"]
        if temperature is not None:
            cmd += ["--router-temperature", str(temperature)]
    proc = subprocess.Popen(cmd, stdout=open(os.path.join(tmp, f"router-{policy}.log"), "w"),
                            stderr=subprocess.STDOUT)
    until("the router healthy", lambda: router_healthy(proc, port))
    return proc, port


def router_credit(tmp, policy, decisions=1):
    """The cached prefix tokens the router credited its last kv_aware decision with
    (its debug log's "KV prefix decision ... credited_prefix_tokens=N"), once the log
    holds `decisions` of them (its writer may lag the response)."""
    import re
    found = []

    def logged():
        with open(os.path.join(tmp, f"router-{policy}.log"), errors="replace") as f:
            text = re.sub(r"\x1b\[[0-9;]*m", "", f.read())  # its colours
        found[:] = re.findall(r"KV prefix decision.*?credited_prefix_tokens=(\d+)", text)
        return len(found) >= decisions
    until(f"{decisions} kv_aware decisions in the router's log", logged, 60)
    return int(found[-1])


def send(router_port, engines, prompt):
    """One request through the router, max_tokens 1 (its latency is the time to first
    token): {engine, tokens (the prompt's), computed, engine_cache (vLLM's prefix
    cache), dpukv, ttft_ms}."""
    before = [sources(p) for _, p, _ in engines]
    # Nothing else in the body: with return_token_ids (or return_tokens_as_token_ids)
    # vllm-router 0.1.17's kv_aware credits no engine with anything, so the token is
    # not asked for (without a tokenizer vLLM has no other way to tell it).
    body = {"model": NAME, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
    t0 = time.perf_counter()
    post(router_port, "/v1/completions", body)
    ttft = (time.perf_counter() - t0) * 1e3
    after = [sources(p) for _, p, _ in engines]
    moved = [{k: a.get(k, 0) - b.get(k, 0) for k in a} for a, b in zip(after, before)]
    served = [i for i, m in enumerate(moved) if sum(m.values()) > 0]
    assert len(served) == 1, (served, moved)
    m = moved[served[0]]
    return {"engine": served[0], "tokens": len(prompt), "computed": int(m.get("local_compute", 0)),
            "engine_cache": int(m.get("local_cache_hit", 0)),
            "dpukv": int(m.get("external_kv_transfer", 0)), "ttft_ms": round(ttft, 1)}


def block_tokens(hash_id):
    """BLOCK_TOKENS token ids standing for Mooncake block hash_id (ids 3 and up)."""
    x, out = hash_id * 2654435761 + 7, []
    for _ in range(BLOCK_TOKENS):
        x = (x * 6364136223846793005 + 1442695040888963407) & (2**64 - 1)
        out.append(3 + (x >> 33) % (VOCAB - 3))
    return out


def trace_prompts(path, n, max_blocks):
    """The trace's first n requests as token ids: each hash id a block of
    BLOCK_TOKENS tokens, the request's input length scaled by BLOCK_TOKENS / 512, at
    most max_blocks blocks (a longer prompt keeps its first max_blocks: its shared
    prefix is what routing is about)."""
    out = []
    with open(path) as f:
        for line in f:
            if len(out) == n:
                break
            r = json.loads(line)
            ids = r["hash_ids"][:max_blocks]
            if not ids:
                continue
            toks = [t for h in ids for t in block_tokens(h)]
            want = -(-r["input_length"] * BLOCK_TOKENS // 512)
            out.append({"hash_ids": ids, "prompt": toks[:max(1, min(want, len(toks)))]})
    return out


def stop_all(servers, procs):
    for s in servers:
        stop(s)
    for p in procs:
        kill(p)
