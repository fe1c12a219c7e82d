"""Three vLLM engines behind vllm-router, each beside its own dpukv agent, the
agents in one cluster (issue 49, routing by what is cached):

1. Routing from dpukv's knowledge. Prompt A is prefilled on engine 1 directly; its
   agent stores A's chunks and its connector relays the agent's event feed as KV
   events (medium "CPU"). Other prompts then push A out of engine 1's own (small)
   prefix cache: vLLM publishes BlockRemoved for its blocks. A sent through the
   router's kv_aware policy still goes to engine 1, found there by the router from
   dpukv's events alone, and its prompt is loaded from dpukv (vLLM's counters).
2. Cluster-wide hits. Prompt B prefilled on engine 0 is a hit on engine 2: its
   agent reads B's chunks from engine 0's agent through the directory, and engine 2
   computes only B's last token, with engine 0's token.

test_vllm_cluster.py PYTHON PACKAGE_DIR DPUKV_BIN (PYTHON: the vLLM venv's).
Skipped (77) where the router's venv or redis-server is not here."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vllm_cluster as vc  # noqa: E402
from test_vllm_engine import PY, tokens, workspace  # noqa: E402
from test_vllm_pd import router_cmd  # noqa: E402
from test_vllm_serve import post  # noqa: E402


def direct(engines, i, prompt):
    """A request straight to engine i (no router): its first token."""
    body = {"model": vc.NAME, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
            "return_token_ids": True}
    return post(engines[i][1], "/v1/completions", body)["choices"][0]["token_ids"][0]


def main():
    router = router_cmd()
    tmp, model, _ = workspace("dpukv-vllm-cluster-")
    procs, servers = [], []
    try:
        redis, redis_port = vc.start_redis(tmp)
        procs.append(redis)
        agents, socks = vc.start_agents(tmp, 3, 256 << 20, redis_port)
        procs += agents
        engines = vc.start_engines(PY, model, socks, tmp)
        servers += [e for e, _, _ in engines]
        rproc, rport = vc.start_router(router, engines, "kv_aware", tmp)
        procs.append(rproc)

        # 1. A's KV only in dpukv beside engine 1; the router finds it there.
        a = tokens(11, 1000)
        direct(engines, 1, a)
        for k in range(24):  # 24k tokens: engine 1's own cache (8 MiB, 16k tokens) forgets A
            direct(engines, 1, tokens(100 + k, 1000))
        before = vc.stat(socks[1])
        r = vc.send(rport, engines, a)
        assert r["engine"] == 1, r
        assert r["engine_cache"] == 0 and r["dpukv"] >= 768, r  # 3 of A's whole chunks
        credit = vc.router_credit(tmp, "kv_aware")
        # A's 3 whole chunks, at the router's credit for KV on the host (0.8): what
        # it knows from dpukv's events, vLLM's own having said A's blocks left.
        assert credit >= int(0.8 * 768), credit
        assert vc.stat(socks[1])["retrieves"] > before["retrieves"]
        print(f"vllm.cluster: the router's kv_aware sent prompt A to engine 1, whose prefix "
              f"cache had dropped it (the router credited {credit} cached tokens): {r['dpukv']} of "
              f"{len(a)} tokens loaded from its dpukv agent")

        # 2. B prefilled on engine 0 is a hit on engine 2 through the directory.
        b = tokens(12, 1000)
        want_b = direct(engines, 0, b)
        before = vc.sources(engines[2][1])
        got_b = direct(engines, 2, b)
        after = vc.sources(engines[2][1])
        moved = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        remote = vc.stat(socks[2])
        assert moved.get("external_kv_transfer", 0) >= 768, moved
        assert remote["lookup_remote_hits"] >= 3 and remote["remote_bytes"] > 0, remote
        assert got_b == want_b, (got_b, want_b)
        print(f"vllm.cluster: ok: prompt B prefilled on engine 0 was a hit on engine 2 "
              f"({int(moved['external_kv_transfer'])} tokens, {remote['lookup_remote_hits']} "
              f"chunks read from engine 0's agent), same token")
    finally:
        vc.stop_all(servers, procs)


if __name__ == "__main__":
    main()
