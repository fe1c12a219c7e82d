"""Prefill and decode on different vLLM engines behind vLLM's own router (issue 49,
first part): two `vllm serve` processes of the tiny Llama (seeded random weights),
one kv_producer and one kv_consumer, each beside its own dpukv agent, the agents in
one cluster (a Redis this test starts, UCX on loopback); `vllm-router
--vllm-pd-disaggregation` in front. A completions request through the router is
prefilled on the producer (its agent stores the prompt's chunks) and decoded on the
consumer, whose agent reads every chunk from the producer's agent through the
directory (remote hits) and computes none of the prompt but its last token (vLLM's
own count of cached prompt tokens): the tokens are those of one engine without dpukv.
Then the two steps the router takes, by hand: a prompt prefilled on the producer,
the producer's agent killed, the same prompt decoded on the consumer: its lookup
finds the dead agent's chunks in the directory, their reads fail, it recomputes the
prompt and gives one engine's tokens; nothing hangs.

test_vllm_pd.py PYTHON PACKAGE_DIR DPUKV_BIN (PYTHON: the vLLM venv's). Skipped
(77) where the router's venv (scripts/vllm_router_venv.sh) or redis-server is not
here."""
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

PY, PKG, BIN = sys.argv[1:4]
HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
from test_vllm_engine import kill, run, stat, tokens, workspace  # noqa: E402
from test_vllm_serve import free_port, post, serve, stop  # noqa: E402


def router_cmd():
    p = subprocess.run([os.path.join(SRC, "scripts", "vllm_router_venv.sh"), "--find"],
                       capture_output=True, text=True)
    if p.returncode != 0 or shutil.which("redis-server") is None:
        print("SKIP: no vllm-router venv (scripts/deps.sh --test makes it) or no redis-server")
        sys.exit(77)
    return p.stdout.strip()


def prompt_sources(port):
    """vLLM's own count of prompt tokens by where they came from (its /metrics:
    local_compute, local_cache_hit, external_kv_transfer)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("vllm:prompt_tokens_by_source_total{"):
            source = line.split('source="', 1)[1].split('"', 1)[0]
            out[source] = out.get(source, 0) + float(line.rsplit(" ", 1)[1])
    return out


def serve_role(py, model, role, sock, port, log, name="pd-tiny", max_len=4096,
               kv_bytes=256 << 20):
    """`vllm serve` of model as a kv_producer or kv_consumer whose connector talks to
    the agent at sock (vLLM's prefix cache off), once it answers /health."""
    cfg = {"kv_connector": "DpukvConnectorV1", "kv_connector_module_path": "dpukv.vllm",
           "kv_role": role, "kv_connector_extra_config": {"dpukv.socket": sock, "dpukv.model": name}}
    return serve([py, "-m", "vllm.entrypoints.cli.main", "serve", model, "--kv-transfer-config",
                  json.dumps(cfg), "--host", "127.0.0.1", "--port", str(port),
                  "--skip-tokenizer-init", "--dtype", "bfloat16", "--max-model-len", str(max_len),
                  "--max-num-batched-tokens", str(max_len), "--enforce-eager", "--seed", "0",
                  "--max-num-seqs", "4", "--kv-cache-memory-bytes", str(kv_bytes),
                  "--no-enable-prefix-caching"], port, log)


def until(what, cond, deadline_s=300):
    deadline = time.monotonic() + deadline_s
    while not cond():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.05)


def router_healthy(proc, port):
    """vllm-router (proc) answers /health on port; an exited router fails at once."""
    if proc.poll() is not None:
        raise AssertionError(f"vllm-router exited ({proc.returncode}): see its log")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def listening(port):
    import socket
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def main():
    router = router_cmd()
    tmp, model, _ = workspace("dpukv-vllm-pd-")
    procs = []
    servers = []
    try:
        redis_port = free_port()
        procs.append(subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind",
                                       "127.0.0.1", "--save", "", "--appendonly", "no",
                                       "--logfile", os.path.join(tmp, "redis.log")]))
        until("redis listening", lambda: listening(redis_port))
        socks = [os.path.join(tmp, f"agent{i}.sock") for i in (1, 2)]
        for s in socks:
            procs.append(subprocess.Popen(
                [BIN, "--log-level", "warning", "agent", "--socket", s, "--memory-bytes", "256M",
                 "--metrics-port", "0", "--cluster", f"redis://127.0.0.1:{redis_port}",
                 "--advertise", "127.0.0.1"]))
        until("the agents listening", lambda: all(os.path.exists(s) for s in socks))

        prompt = tokens(7, 600)  # 2 whole 256-token chunks and a tail, of 2 layers
        second = tokens(8, 600)
        want, want2 = [r["tokens"] for r in run(model, None, [prompt, second])]  # no dpukv

        ports = [free_port(), free_port()]
        for role, sock, port in zip(("kv_producer", "kv_consumer"), socks, ports):
            servers.append(serve_role(PY, model, role, sock, port,
                                      os.path.join(tmp, f"serve-{role}.log")))
        rport = free_port()
        procs.append(subprocess.Popen(
            [router, "--host", "127.0.0.1", "--port", str(rport), "--vllm-pd-disaggregation",
             "--prefill", f"http://127.0.0.1:{ports[0]}", "--decode", f"http://127.0.0.1:{ports[1]}"],
            stdout=open(os.path.join(tmp, "router.log"), "w"), stderr=subprocess.STDOUT))
        until("the router healthy", lambda: router_healthy(procs[-1], rport))

        body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0.0,
                "return_token_ids": True}
        before = prompt_sources(ports[1])
        got = post(rport, "/v1/completions", body)["choices"][0]["token_ids"]
        # The decode engine computed the prompt's last token only, the rest came from
        # dpukv (its answer's usage reports the prefill engine's hits, as vLLM's PD does).
        after = prompt_sources(ports[1])
        moved = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        assert moved.get("external_kv_transfer") == len(prompt) - 1, moved
        assert moved.get("local_compute") == 1, moved
        cached = int(moved["external_kv_transfer"])
        prod, cons = stat(socks[0]), stat(socks[1])
        chunks = 3 * 2
        assert prod["stores"] == chunks and prod["retrieves"] == 0, prod
        assert cons["stores"] == 0 and cons["retrieves"] == chunks, cons
        assert cons["lookup_remote_hits"] == chunks and cons["remote_bytes"] > 0, cons
        assert got == want, (got, want)
        print(f"vllm.pd: through vllm-router's PD mode, the producer's agent stored "
              f"{prod['stores']} chunks, the consumer's read all {cons['lookup_remote_hits']} "
              f"from it ({cons['remote_bytes']} bytes over UCX), {cached} of "
              f"{len(prompt)} prompt tokens not computed; tokens {got} as one engine's")

        # The producer's agent killed between prefill and decode.
        first = post(ports[0], "/v1/completions", dict(body, prompt=second, max_tokens=1))
        assert first["choices"][0]["token_ids"] == want2[:1], first
        assert stat(socks[0])["stores"] == 2 * chunks  # the producer's step waited for them
        kill(procs[1])
        t0 = time.monotonic()
        late = post(ports[1], "/v1/completions", dict(body, prompt=second))
        took = time.monotonic() - t0
        assert late["choices"][0]["token_ids"] == want2, (late, want2)
        after = stat(socks[1])
        assert after["retrieves"] == cons["retrieves"], (cons, after)  # nothing loaded
        print(f"vllm.pd: ok: with the producer's agent killed after the prefill, the decode "
              f"engine recomputed the prompt in {took:.1f} s and gave one engine's tokens")
    finally:
        for s in servers:
            stop(s)
        for p in procs:
            kill(p)


if __name__ == "__main__":
    main()
