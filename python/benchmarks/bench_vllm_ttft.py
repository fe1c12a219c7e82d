"""Time to first token in vLLM's own engine (its CPU platform), with and without a
dpukv hit, next to vLLM's own CPU offloading and LMCache where they run here.

The model is a Llama written here (config.json and seeded random weights) sized
so that prefill dominates a request: 8 layers, hidden 512, 8 heads (2 for KV),
FFN 2048. For each prompt length (2k and 8k tokens by default) and each engine
configuration, one engine process (a fresh one per configuration, so no cache is
shared but the one under test) runs, per repetition, a new prompt twice with
max_tokens 1: the first is a miss (full prefill; the connector stores it), the
second is a full hit from the configuration's cache (vLLM's own prefix cache is
off, so a hit can only come from the connector). TTFT is the wall time of the
request in the engine (LLM.generate of one prompt, one token).

Configurations: none (no connector: the baseline), prefix-cache (no connector,
vLLM's own prefix cache on: the KV never leaves the engine, the limit a connector's
hit can approach), dpukv (DpukvConnectorV1 as the README configures it, against an
agent this bench starts; dpukv-staging: the same with dpukv.share_caches off, its
loads through staging and the connector's scatter; dpukv-lossless, dpukv-int8,
dpukv-int4, asked for by name: dpukv.kv_codec set, the connector decoding;
dpukv-agent-compress: an agent of its own with --compress, decoding itself), vllm-offload (vLLM's kv_offloading_size, its native CPU
offloading), lmcache (vLLM's LMCacheMPConnector, what kv_offloading_backend
"lmcache" picks; lmcache-shm: the same in LMCache's lmcache-driven mode, its
server moving the KV through shared memory; each against an LMCache server this
bench starts: `lmcache server
--chunk-size 256 --l1-size-gb 2 --eviction-policy LRU --supported-transfer-mode
auto`, the CPU worker asking for engine-driven transfers; run the bench with a
python whose environment has LMCache, e.g. the vLLM venv plus `pip install
--no-deps lmcache==0.5.6 sortedcontainers aiofile caio`). One that cannot start
here is reported with its own words, not measured.

Each row: the configuration's median hit TTFT, the same run's median miss TTFT
(the baseline) and their ratio; and the ratio to dpukv's hit where both ran.
Prints a table, or with --json {"bench": "vllm_ttft", "results": [...]}.

  bench_vllm_ttft.py PACKAGE_DIR DPUKV_BIN [--lengths 2048,8192] [--reps 3] [--batch 1]
                     [--configs none,prefix-cache,dpukv,...] [--json]

Run with the vLLM venv's python (scripts/vllm_venv.sh prints it)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
          "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 2,
          "num_hidden_layers": 8, "vocab_size": 4096, "max_position_embeddings": 65536,
          "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
          "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1,
          "eos_token_id": 2}
CONFIGS = ("none", "prefix-cache", "dpukv", "dpukv-staging", "vllm-offload", "lmcache",
           "lmcache-shm")
# Asked for by name (--configs): dpukv with dpukv.kv_codec set, and dpukv against an
# agent of its own started with --compress (lossless on the agent's compress engine).
CODEC_CONFIGS = ("dpukv-lossless", "dpukv-int8", "dpukv-int4", "dpukv-agent-compress")


def prompt(seed, n):
    x, out = seed * 2654435761 + 7, []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & (2**64 - 1)
        out.append(3 + (x >> 33) % (CONFIG["vocab_size"] - 3))
    return out


def worker(model, config, socket, lengths, reps, lmcache_port=None, batch=1):
    """One engine with one configuration: per length and repetition, a miss then a hit."""
    from vllm import LLM, SamplingParams
    kw = {}
    if config.startswith("dpukv"):
        import dpukv
        # Each dpukv configuration starts from an empty cache (they share the agent,
        # and the prompts).
        dpukv.Client(socket).clear()
        from vllm.config import KVTransferConfig
        extra = {"dpukv.socket": socket}
        if config == "dpukv-staging":  # loads through staging: the caches not shared in place
            extra["dpukv.share_caches"] = False
        if config in CODEC_CONFIGS[:3]:  # chunks encoded, decoded into the blocks by the connector
            extra["dpukv.kv_codec"] = config.split("-", 1)[1]
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="DpukvConnectorV1", kv_connector_module_path="dpukv.vllm",
            kv_role="kv_both", kv_connector_extra_config=extra)
    elif config == "vllm-offload":
        kw["kv_offloading_size"] = 2.0  # GiB of CPU memory
    elif config in ("lmcache", "lmcache-shm"):
        from vllm.config import KVTransferConfig
        extra = {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": lmcache_port}
        if config == "lmcache-shm":  # the server reads and writes the KV through shared memory
            extra["lmcache.mp.mp_transfer_mode"] = "lmcache_driven"
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="LMCacheMPConnector", kv_role="kv_both",
            kv_connector_extra_config=extra)
    llm = LLM(model=model, skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=max(lengths) + 16, enforce_eager=True, seed=0, max_num_seqs=batch,
              kv_cache_memory_bytes=1 << 30, enable_prefix_caching=config == "prefix-cache",
              max_num_batched_tokens=batch * max(lengths) + 16, **kw)
    # The top two logprobs: a token that differs between the miss and the hit where
    # the miss's top two are within 0.5 is the order of the sums, not the KV. This
    # model's top bf16 logits are near 40, 0.25 apart; the hit computes its last
    # token alone, the miss in the prefill, and vLLM's own prefix cache (its last
    # block recomputed) lands a step or two away too: on one 8k prompt the miss's
    # top two were 0.5 apart, the prefix cache's hit 0.25, dpukv's hit a tie.
    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, logprobs=2)

    def margin(o):
        top = sorted((lp.logprob for lp in o.outputs[0].logprobs[0].values()), reverse=True)
        return top[0] - top[1] if len(top) > 1 else float("inf")
    llm.generate([{"prompt_token_ids": prompt(999, 64)}], params, use_tqdm=False)  # warm-up
    rows = []
    if config.startswith("dpukv"):
        client = dpukv.Client(socket)
        stored = json.loads(client.stats())["chunks"]
    for n in lengths:
        for r in range(reps):
            ps = [{"prompt_token_ids": prompt(1000 * n + 100 * r + b, n)} for b in range(batch)]
            times, tokens, margins = [], [], []
            for _ in range(2):  # the miss (stores), then the hit
                t0 = time.perf_counter()
                out = llm.generate(ps, params, use_tqdm=False)
                times.append(time.perf_counter() - t0)
                tokens.append([list(o.outputs[0].token_ids) for o in out])
                margins.append([margin(o) for o in out])
                if config.startswith("dpukv") and not times[1:]:
                    # dpukv stores asynchronously: the hit is asked for once the
                    # agent holds the prompt's chunks, its partial last one too
                    # (not timed).
                    stored += batch * -(-n // 256) * CONFIG["num_hidden_layers"]
                    while json.loads(client.stats())["chunks"] < stored:
                        time.sleep(0.001)
                elif config.startswith("lmcache") and not times[1:]:
                    # LMCache's server stores asynchronously and says nothing to the
                    # engine when it is done: the hit is asked for after a pause
                    # (not timed) long enough for the store to land.
                    time.sleep(1.0)
            rows.append({"tokens": n, "miss_s": times[0], "hit_s": times[1],
                         "same_token": tokens[0] == tokens[1], "tokens_miss_hit": tokens,
                         "margins_miss_hit": margins,
                         "differs_at_tie": tokens[0] != tokens[1] and all(
                             m <= 0.5 + 1e-3 for t0, t1, m in zip(tokens[0], tokens[1], margins[0])
                             if t0 != t1)})
    print("ROWS " + json.dumps(rows), flush=True)


def free_port():
    import socket as sk
    with sk.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lmcache(py):
    """LMCache's MP server from the environment of `py`; (process, port) once it
    listens, or (None, why)."""
    exe = os.path.join(os.path.dirname(py), "lmcache")
    if not os.path.exists(exe):
        return None, "LMCache is not installed in this python's environment"
    port = free_port()
    log = tempfile.TemporaryFile()
    p = subprocess.Popen([exe, "server", "--chunk-size", "256", "--l1-size-gb", "2",
                          "--eviction-policy", "LRU", "--supported-transfer-mode", "auto",
                          "--host", "127.0.0.1", "--port", str(port),
                          "--http-port", str(free_port()), "--disable-observability",
                          "--disable-metrics"],
                         stdout=log, stderr=subprocess.STDOUT,
                         env=dict(os.environ, LMCACHE_DISABLE_BANNER="1"))
    deadline = time.monotonic() + 300
    while True:
        log.seek(0)
        text = log.read().decode(errors="replace")
        if "cache server is running" in text:
            return p, port
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            errs = [l for l in text.splitlines() if "Error" in l]
            return None, (errs[-1] if errs else "the LMCache server did not start")[:300]
        time.sleep(0.1)


def run_config(py, pkg, model, config, socket, lengths, reps, lmcache_port=None, batch=1):
    # vLLM's CPU engine keeps cores for its scheduler process: one without a KV
    # connector, two with one (for NIXL's threads) - on a 2-core machine none, and
    # the worker computes on both. Every configuration gets vLLM's default without
    # a connector (one core kept), so that each prefill runs on the same cores.
    env = dict(os.environ, PYTHONPATH=pkg, VLLM_LOGGING_LEVEL="WARNING",
               PYTHONDONTWRITEBYTECODE="1", VLLM_CPU_NUM_OF_RESERVED_CPU="1")
    p = subprocess.run([py, os.path.abspath(__file__), "--worker", config, "--model", model,
                        "--socket", socket, "--lengths", ",".join(map(str, lengths)),
                        "--reps", str(reps), "--lmcache-port", str(lmcache_port or 0),
                        "--batch", str(batch), pkg, "-"],
                       env=env, capture_output=True, text=True)
    lines = [l for l in p.stdout.splitlines() if l.startswith("ROWS ")]
    if p.returncode != 0 or not lines:
        # vLLM's root cause: the first exception line other than "initialization failed".
        errs = [l.strip() for l in p.stderr.splitlines()
                if ("Error:" in l or "Exception:" in l) and "initialization failed" not in l]
        return None, (errs[0] if errs else f"exit {p.returncode}")[:300]
    return json.loads(lines[-1][5:]), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("package_dir")
    ap.add_argument("dpukv_bin")
    ap.add_argument("--lengths", default="2048,8192")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1,
                    help="prompts sent together (each row: the batch's time to its first tokens)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--lmcache-port", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    unknown = [c for c in a.configs.split(",") if c not in CONFIGS + CODEC_CONFIGS]
    if unknown:
        sys.exit(f"bench_vllm_ttft: unknown configuration {unknown[0]!r} (known: "
                 f"{', '.join(CONFIGS + CODEC_CONFIGS)})")
    if a.worker:
        worker(a.model, a.worker, a.socket, lengths, a.reps, a.lmcache_port, a.batch)
        return
    tmp = tempfile.mkdtemp(prefix="dpukv-bench-ttft-")
    model = os.path.join(tmp, "llama-prefill")
    # Seeded random weights (python/tests/random_llama.py): on vLLM's dummy ones every
    # prompt gave the same tokens, and same_token said nothing.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from random_llama import write_random_llama
    write_random_llama(model, CONFIG)
    def start_agent(path, *more):
        p = subprocess.Popen([a.dpukv_bin, "--log-level", "warning", "agent", "--socket", path,
                              "--memory-bytes", "2G", "--metrics-port", "0", *more])
        while not os.path.exists(path):
            if p.poll() is not None:
                sys.exit("the agent exited before it listened")
            time.sleep(0.05)
        return p

    sock = os.path.join(tmp, "agent.sock")
    agent = start_agent(sock)
    results, medians = [], {}
    try:
        for config in a.configs.split(","):
            print(f"bench vllm_ttft: {config} ...", file=sys.stderr, flush=True)
            server, port = None, None
            if config.startswith("lmcache"):
                server, port = start_lmcache(sys.executable)
                if server is None:
                    results.append({"config": config, "ran": False, "why": port})
                    continue
            own = None
            if config == "dpukv-agent-compress":
                own = start_agent(os.path.join(tmp, "compress.sock"), "--compress")
            try:
                rows, why = run_config(sys.executable, os.path.abspath(a.package_dir), model,
                                       config, os.path.join(tmp, "compress.sock") if own else sock,
                                       lengths, a.reps, port, a.batch)
            finally:
                if server is not None:
                    server.terminate()
                    server.wait()
                if own is not None:
                    own.terminate()
                    own.wait()
            if rows is None:
                results.append({"config": config, "ran": False, "why": why})
                continue
            for n in lengths:
                mine = [r for r in rows if r["tokens"] == n]
                miss = statistics.median(r["miss_s"] for r in mine)
                hit = statistics.median(r["hit_s"] for r in mine)
                medians[(config, n)] = hit
                results.append({
                    "config": config, "ran": True, "tokens": n, "batch": a.batch,
                    "ttft_hit_ms": round(hit * 1e3, 1),
                    "baseline": "the same run's miss (full prefill)",
                    "baseline_ttft_ms": round(miss * 1e3, 1),
                    "ratio": round(miss / hit, 2),
                    "same_token": all(r["same_token"] for r in mine),
                    "differs_only_at_ties": all(r["same_token"] or r["differs_at_tie"]
                                                for r in mine),
                    "samples_hit_ms": [round(r["hit_s"] * 1e3, 1) for r in mine],
                    "samples_miss_ms": [round(r["miss_s"] * 1e3, 1) for r in mine],
                    "samples_tokens_miss_hit": [r["tokens_miss_hit"] for r in mine],
                    "samples_margins_miss_hit": [r["margins_miss_hit"] for r in mine]})
    finally:
        agent.terminate()
        agent.wait()
    for r in results:  # dpukv's hit against each other configuration's, same run
        d = medians.get(("dpukv", r.get("tokens")))
        if r["ran"] and d and r["config"] != "dpukv":
            r["dpukv_speedup"] = round(r["ttft_hit_ms"] / (d * 1e3), 2)
    if a.json:
        print(json.dumps({"bench": "vllm_ttft", "results": results}, indent=2))
        return
    print(f"{'config':<14}{'tokens':>7}{'hit ms':>10}{'miss ms':>10}{'miss/hit':>10}"
          f"{'vs dpukv':>10}  same token")
    for r in results:
        if not r["ran"]:
            print(f"{r['config']:<14}  not run here: {r['why']}")
            continue
        print(f"{r['config']:<14}{r['tokens']:>7}{r['ttft_hit_ms']:>10.1f}"
              f"{r['baseline_ttft_ms']:>10.1f}{r['ratio']:>9.2f}x"
              f"{r.get('dpukv_speedup', ''):>10}  {r['same_token']}"
              f"{'' if r['same_token'] else ' (at ties)' if r['differs_only_at_ties'] else ''}")


if __name__ == "__main__":
    main()
