"""Prefill on one vLLM engine, decode on another, the KV moving between their dpukv
agents (issue 49): the decode engine's time to first token on a prompt the prefill
engine computed, next to the same engine's local dpukv hit on that prompt (the
baseline, same run) and the prefill engine's miss.

Two `vllm serve` processes of bench_vllm_ttft.py's Llama (seeded random weights), a
kv_producer and a kv_consumer, each beside its own agent, the agents in one cluster
(a Redis started here, UCX on loopback), as python/tests/test_vllm_pd.py sets them up
(the router's PD mode does the same two requests). Per prompt: the prompt prefilled
on the producer (max_tokens 1: its step waits for its stores); the same request
timed on the consumer, whose agent reads the chunks from the producer's agent
(transferred); the same again on the consumer (a local hit: its agent keeps what it
read); a new prompt on the producer (a miss). The first prompt is a warm-up.

  bench_vllm_pd.py PACKAGE_DIR DPUKV_BIN [--tokens 8192] [--reps 5] [--json]

Run with the vLLM venv's python; needs redis-server."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("package_dir")
    ap.add_argument("dpukv_bin")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    # The tests' helpers take (python, package dir, dpukv binary) from argv.
    sys.argv = [sys.argv[0], sys.executable, os.path.abspath(a.package_dir),
                os.path.abspath(a.dpukv_bin)]
    sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests")]
    import bench_vllm_ttft as ttft
    from random_llama import write_random_llama
    from test_vllm_engine import kill, stat, workspace
    from test_vllm_pd import listening, serve_role, until
    from test_vllm_serve import free_port, post, stop

    tmp, _, _ = workspace("dpukv-bench-pd-")
    model = os.path.join(tmp, "llama-prefill")
    write_random_llama(model, ttft.CONFIG)
    procs, servers = [], []
    try:
        rport = free_port()
        procs.append(subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1",
                                       "--save", "", "--appendonly", "no", "--logfile", "/dev/null"]))
        until("redis listening", lambda: listening(rport))
        socks = [os.path.join(tmp, f"agent{i}.sock") for i in (1, 2)]
        for s in socks:
            procs.append(subprocess.Popen(
                [a.dpukv_bin, "--log-level", "warning", "agent", "--socket", s, "--memory-bytes",
                 "1G", "--metrics-port", "0", "--cluster", f"redis://127.0.0.1:{rport}",
                 "--advertise", "127.0.0.1"]))
        until("the agents listening", lambda: all(os.path.exists(s) for s in socks))
        ports = [free_port(), free_port()]
        for role, sock, port in zip(("kv_producer", "kv_consumer"), socks, ports):
            servers.append(serve_role(sys.executable, model, role, sock, port,
                                      os.path.join(tmp, f"serve-{role}.log"), "pd-bench",
                                      a.tokens + 16, 1 << 30))
        rows = []
        for i in range(a.reps + 1):
            print(f"bench vllm_pd: prompt {i + 1} of {a.reps + 1} ...", file=sys.stderr, flush=True)
            body = {"model": model, "prompt": ttft.prompt(100 + i, a.tokens), "max_tokens": 1,
                    "temperature": 0.0, "return_token_ids": True}
            post(ports[0], "/v1/completions", body)  # the prefill, stored
            t0 = time.perf_counter()
            moved = post(ports[1], "/v1/completions", body)
            t1 = time.perf_counter()
            local = post(ports[1], "/v1/completions", body)
            t2 = time.perf_counter()
            post(ports[0], "/v1/completions", dict(body, prompt=ttft.prompt(900 + i, a.tokens)))
            t3 = time.perf_counter()
            rows.append({"transferred_ms": round((t1 - t0) * 1e3, 1),
                         "local_hit_ms": round((t2 - t1) * 1e3, 1),
                         "miss_ms": round((t3 - t2) * 1e3, 1),
                         "same_token": moved["choices"][0]["token_ids"] ==
                         local["choices"][0]["token_ids"]})
        rows = rows[1:]  # the first paid first-use costs on both sides
        cons = stat(socks[1])
    finally:
        for s in servers:
            stop(s)
        for p in procs:
            kill(p)
    tr = statistics.median(r["transferred_ms"] for r in rows)
    lo = statistics.median(r["local_hit_ms"] for r in rows)
    result = {"tokens": a.tokens, "transferred_ttft_ms": tr,
              "baseline": "the same engine's local dpukv hit on the prompt",
              "baseline_ttft_ms": lo, "ratio": round(tr / lo, 2),
              "miss_ms": statistics.median(r["miss_ms"] for r in rows),
              "remote_hits": cons.get("lookup_remote_hits"),
              "remote_bytes": cons.get("remote_bytes"), "samples": rows}
    if a.json:
        print(json.dumps({"bench": "vllm_pd", "results": [result]}, indent=2))
        return
    print(f"{a.tokens}-token prompt prefilled on the producer: the consumer's first token "
          f"{tr:.1f} ms (chunks read from the producer's agent), its local hit {lo:.1f} ms "
          f"({tr / lo:.2f}x), the producer's miss {result['miss_ms']:.0f} ms; "
          f"same token: {all(r['same_token'] for r in rows)}")


if __name__ == "__main__":
    main()
