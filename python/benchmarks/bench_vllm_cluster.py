"""Routing by what is cached (issue 49): the Mooncake conversation trace's first
requests through vllm-router in front of N vLLM engines, each beside its own dpukv
agent, under each routing policy, with one engine of the same total cache as the
ceiling. Per request: which engine served it, how many of its prompt tokens were
cached (vLLM's own counters: its prefix cache and dpukv) and its time to first
token; per policy: hit ratio and TTFT p50/p99. Every sample kept (--json).

Policies (the cache per agent is the total divided by N):
  round_robin      vllm-router's round robin, each agent alone
  cache_aware      vllm-router's default policy (its own tree of what it routed where)
  kv_aware         vllm-router's policy fed by the engines' KV events: vLLM's own and
                   dpukv's (each connector relays its agent's event feed: the chunks
                   the agent beside that engine holds)
  round_robin+dir  round robin, the agents in one cluster (a Redis directory): an
                   engine's miss is read from whichever agent holds the chunk
  kv_aware+dir     kv_aware with the agents in one cluster
  kv_aware+dir+soft  the same, the router sampling engines by a softmax of their
                   costs (--router-temperature, --temperature here)
  ceiling          one engine and one agent holding the whole cache

The prompts are token ids made from the trace's hash ids (python/tests/vllm_cluster.py:
128 tokens per hash id, the input length scaled alike); requests are sent one at a
time in trace order (on two cores concurrent prefills only share the CPU), so the
engine and cached tokens of each are exact.

  bench_vllm_cluster.py PACKAGE_DIR DPUKV_BIN [--requests 300] [--engines 3]
      [--cache-fraction 0.3] [--policies ...] [--json]

Run with the vLLM venv's python; needs redis-server and the router's venv."""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE = os.path.join(HERE, "..", "..", "traces", "mooncake_conversation_trace.jsonl")
POLICIES = ["round_robin", "cache_aware", "kv_aware", "round_robin+dir", "kv_aware+dir",
            "kv_aware+dir+soft", "ceiling"]

# A sample per request, in trace order (a row of these, to keep a run's file small).
SAMPLE_FIELDS = ["engine", "tokens", "computed", "engine_cache", "dpukv", "ttft_ms"]


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def unique_chunk_bytes(prompts, chunk_tokens=256, chunk_bytes=2 * 64 << 10):
    """Bytes of every distinct chunk the slice stores (a chunk is named by its whole
    prefix; the tiny Llama's chunk is 64 KiB a layer, 2 layers)."""
    seen = set()
    for p in prompts:
        toks = p["prompt"]
        for end in range(chunk_tokens, len(toks) + chunk_tokens, chunk_tokens):
            seen.add(tuple(toks[:min(end, len(toks))]))
    return len(seen) * chunk_bytes


def run_policy(policy, prompts, a, router_bin, model, tmp, vc):
    n = 1 if policy == "ceiling" else a.engines
    total = a.cache_bytes
    procs, servers = [], []
    try:
        redis_port = None
        if "+dir" in policy:
            redis, redis_port = vc.start_redis(tmp)
            procs.append(redis)
        agents, socks = vc.start_agents(tmp, n, total // n, redis_port)
        procs += agents
        engines = vc.start_engines(sys.executable, model, socks, tmp)
        servers += [e for e, _, _ in engines]
        router, rport = vc.start_router(
            router_bin, engines, "round_robin" if policy == "ceiling" else policy.split("+")[0],
            tmp, temperature=a.temperature if policy.endswith("+soft") else None)
        procs.append(router)
        rows = []
        t0 = time.monotonic()
        for i, p in enumerate(prompts):
            r = vc.send(rport, engines, p["prompt"])
            rows.append(r)
            if (i + 1) % 50 == 0:
                print(f"bench vllm_cluster: {policy}: {i + 1}/{len(prompts)} requests, "
                      f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        stats = [vc.stat(s) for s in socks]
    finally:
        vc.stop_all(servers, procs)
    toks = sum(r["tokens"] for r in rows)
    hit = sum(r["engine_cache"] + r["dpukv"] for r in rows)
    ttft = [r["ttft_ms"] for r in rows]
    return {"policy": policy, "engines": n, "cache_bytes_per_agent": total // n,
            "requests": len(rows), "prompt_tokens": toks, "hit_tokens": hit,
            "hit_ratio": round(hit / toks, 4),
            "dpukv_tokens": sum(r["dpukv"] for r in rows),
            "engine_cache_tokens": sum(r["engine_cache"] for r in rows),
            "ttft_p50_ms": statistics.median(ttft), "ttft_p99_ms": percentile(ttft, 0.99),
            "per_engine": [sum(1 for r in rows if r["engine"] == e) for e in range(n)],
            "remote_hits": sum(s.get("lookup_remote_hits", 0) for s in stats),
            "evictions": sum(s.get("evictions", 0) for s in stats),
            "samples": [[r[f] for f in SAMPLE_FIELDS] for r in rows]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("package_dir")
    ap.add_argument("dpukv_bin")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--engines", type=int, default=3)
    ap.add_argument("--max-blocks", type=int, default=31, help="hash ids kept per request")
    ap.add_argument("--cache-fraction", type=float, default=0.3,
                    help="total dpukv memory as a fraction of the slice's distinct chunks")
    ap.add_argument("--temperature", type=float, default=100.0,
                    help="the router's --router-temperature for the +soft policies")
    ap.add_argument("--policies", nargs="+", default=POLICIES, choices=POLICIES)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    # The tests' helpers take (python, package dir, dpukv binary) from argv.
    sys.argv = [sys.argv[0], sys.executable, os.path.abspath(a.package_dir),
                os.path.abspath(a.dpukv_bin)]
    sys.path[:0] = [HERE, os.path.join(HERE, "..", "tests")]
    import vllm_cluster as vc
    from test_vllm_engine import workspace
    from test_vllm_pd import router_cmd

    router_bin = router_cmd()
    tmp, model, _ = workspace("dpukv-bench-cluster-")
    prompts = vc.trace_prompts(TRACE, a.requests, a.max_blocks)
    distinct = unique_chunk_bytes(prompts)
    a.cache_bytes = max(64 << 20, int(distinct * a.cache_fraction)) // (1 << 20) << 20
    results = []
    for policy in a.policies:
        print(f"bench vllm_cluster: {policy} ...", file=sys.stderr, flush=True)
        results.append(run_policy(policy, prompts, a, router_bin, model, tmp, vc))
    ceiling = next((r for r in results if r["policy"] == "ceiling"), None)
    for r in results:
        r["baseline"] = "ceiling: one engine with the whole cache"
        r["ratio"] = round(r["hit_ratio"] / ceiling["hit_ratio"], 3) if ceiling else None
    if a.json:
        print(json.dumps({"bench": "vllm_cluster", "distinct_chunk_bytes": distinct,
                          "cache_bytes": a.cache_bytes, "sample_fields": SAMPLE_FIELDS,
                          "results": results}, separators=(",", ":")))
        return
    print(f"{len(prompts)} Mooncake requests, {a.cache_bytes >> 20} MiB of dpukv cache in all "
          f"({a.cache_fraction:.0%} of the slice's distinct chunks)")
    print(f"{'policy':<16} {'engines':>7} {'hit ratio':>9} {'vs ceiling':>10} "
          f"{'TTFT p50':>9} {'p99':>8}  requests per engine")
    for r in results:
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
        print(f"{r['policy']:<16} {r['engines']:>7} {r['hit_ratio']:>9.1%} {ratio:>10} "
              f"{r['ttft_p50_ms']:>7.1f}ms {r['ttft_p99_ms']:>6.0f}ms  {r['per_engine']}")


if __name__ == "__main__":
    main()
