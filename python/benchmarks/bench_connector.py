"""Time to first token with and without a dpukv prefix hit, through the connector
and the reference model (python/tests/reference_model.py), against a running agent.

For each prefix length: a full prefill of prefix + 128 new tokens (the baseline),
then the same prompt after the prefix was saved: lookup, layerwise load, and a
prefill of the 128 new tokens. Also the cost of saving (a forward pass that saves
each layer, against the same pass without) and the GB/s of a load alone (lookup,
retrieve and scatter of every layer, no compute) next to a same-run copy of the
same bytes (torch clone on the same device). Prints one JSON object,
{"bench": "connector", "results": [...]}, each row with its baseline and ratio.

On a GPU (cuda available) the KV cache and compute are on the GPU, and the
connector takes the GPU path when the agent has one (the agent's CUDA engine
copies into exported GPU staging) or the pinned-host fallback; each row says which
(`path`). There it also measures the agent's retrieve into GPU memory alone next
to a same-run pinned host-to-GPU copy of the same bytes. Without a GPU it says so
and measures the CPU path with a small shape; --device cuda-double runs the GPU
path's code through the CUDA driver test double (its figures are not GPU figures).
Usage:
  bench_connector.py PACKAGE_DIR SOCKET [--shape small|llama-8b] [--prefixes 512,2048]
                     [--device cuda-double] [--only copies]"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))  # the reference model
import torch  # noqa: E402

import dpukv  # noqa: E402
from dpukv.connector import DpukvConnector  # noqa: E402
from reference_model import LlamaConfig, LlamaModel, PagedKVCache  # noqa: E402


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def copy_seconds(nbytes, device, reps=5):
    """The same run's memcpy of nbytes on the device, into memory touched before
    (no page faults in the time, as a connector's caches are): the median."""
    src = torch.ones(max(nbytes, 1), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    ts = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        ts.append(time.perf_counter() - t0)
    return median(ts)


def load_rows(conn, cache, cfg, prompt, n, shape, device, path, kv_bytes_per_token, reps):
    """A load alone (lookup, every layer's retrieve and scatter), reps times, next to
    the same run's memcpy of as many bytes."""
    load_t = []
    for rep in range(reps):
        rid = "load%d-%d" % (n, rep)
        blocks = cache.allocate(len(prompt))
        sync(device)
        t0 = time.perf_counter()
        hit = conn.get_num_new_matched_tokens(rid, prompt, 0)
        conn.update_state_after_alloc(rid, blocks, hit)
        conn.start_load_kv(rid)
        for l in range(cfg.layers):
            conn.wait_for_layer_load(rid, l)
        sync(device)
        load_t.append((time.perf_counter() - t0, hit))
        conn.request_finished(rid)
        cache.release(blocks)
    loaded = load_t[-1][1] * kv_bytes_per_token
    copy_s = copy_seconds(loaded, device)
    load_s = median([x for x, _ in load_t])
    return {"op": "load", "device": device, "shape": shape, "prefix_tokens": n,
            "in_place": conn.loads_in_place,
            "hit_tokens": load_t[-1][1], "bytes": loaded,
            "gbps": loaded / load_s / 1e9 if loaded else 0.0, "path": path,
            "baseline": "memcpy of the same bytes on the device, same run",
            "baseline_gbps": loaded / copy_s / 1e9 if loaded else 0.0,
            "ratio": copy_s / load_s if loaded else 0.0,
            "samples_s": [round(x, 6) for x, _ in load_t]}


def checksum_design(stats):
    """Where the agent checksums GPU copies, from its gpu path ("...; checksums on
    the GPU" or "on host threads: why")."""
    path = stats.get("gpu_path", "")
    return path.split("; checksums ", 1)[1] if "; checksums " in path else "no GPU path"


def agent_copy_rows(client, conn, prompt, hit_tokens, cfg, shape, n):
    """The agent's copies alone, every layer's chunks with one request per layer
    submitted at once: retrieve into GPU staging next to a same-run pinned host ->
    GPU copy of as many bytes, and store out of GPU staging (under fresh keys, so
    that every chunk is copied) next to a pinned GPU -> host copy."""
    chunks = hit_tokens // conn.chunk_tokens
    if chunks == 0 or chunks * cfg.layers > conn.slots:
        return [{"op": "agent_copy_gpu", "skipped": "the hit does not fit the load staging"}]
    total = chunks * conn.chunk_bytes * cfg.layers

    def timed(op, keys_of):
        times = []
        for rep in range(3):
            t0 = time.perf_counter()
            pend = []
            for l in range(cfg.layers):
                offs = [(l * chunks + c) * conn.chunk_bytes for c in range(chunks)]
                pend.append(op(conn.staging, keys_of(l, rep), offs, [conn.chunk_bytes] * chunks))
            ok = all(all(s == "SUCCESS" for s in client.wait(p)) for p in pend)
            times.append(time.perf_counter() - t0)
            if not ok:
                return None
        return median(times)

    def fresh(l, rep):  # keys no chunk has: another layout value per layer and rep
        salt = (rep + 1) * 0x5BD1E995
        return dpukv.chunk_keys(conn.model, prompt[:hit_tokens], conn.chunk_tokens, False,
                                conn.world_size, conn.rank, conn.layouts[l] ^ salt)

    t_get = timed(client.submit_retrieve, lambda l, rep: conn.keys(prompt[:hit_tokens], l))
    t_put = timed(client.submit_store, fresh)
    host = torch.empty(total, dtype=torch.uint8).pin_memory()
    dev = torch.empty(total, dtype=torch.uint8, device="cuda")

    def base(dst, src):
        ts = []
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        return median(ts)

    st = json.loads(client.stats())
    rows = []
    for op, t, b, what in (("agent_retrieve_gpu", t_get, base(dev, host), "pinned host -> GPU"),
                           ("agent_store_gpu", t_put, base(host, dev), "pinned GPU -> host")):
        if t is None:
            rows.append({"op": op, "skipped": "a request failed"})
            continue
        rows.append({"op": op, "device": "cuda", "shape": shape, "prefix_tokens": n,
                     "bytes": total, "gbps": total / t / 1e9,
                     # Where the agent checksummed these copies (--gpu-checksum).
                     "checksums": checksum_design(st),
                     "gpu_checksums_gpu": st.get("gpu_checksums_gpu"),
                     "gpu_checksums_host": st.get("gpu_checksums_host"),
                     "baseline": what + " copy, same bytes, same run",
                     "baseline_gbps": total / b / 1e9, "ratio": b / t})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("socket")
    ap.add_argument("--shape", default=None, help="small (default without a GPU) or llama-8b")
    ap.add_argument("--prefixes", default=None, help="prefix lengths in tokens")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=0, help="override the layer count")
    ap.add_argument("--only", choices=["copies", "loads"], default=None,
                    help="copies: only the agent's copies to and from GPU staging (the "
                         "prefix saved without a forward pass), e.g. to compare agents run "
                         "with another --gpu-checksum; loads: only the connector's loads "
                         "(lookup, retrieve, scatter) next to a memcpy, the prefix saved "
                         "without a forward pass (long prefixes in seconds on a CPU)")
    ap.add_argument("--device", default=None,
                    help="cuda-double: the connector's device calls through the CUDA driver "
                         "test double ($DPUKV_CUDA_DRIVER)")
    a = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    conn_device = None
    if a.device == "cuda-double":
        from dpukv.device import CudaDouble
        conn_device = CudaDouble()
    shape = a.shape or ("llama-8b" if device == "cuda" else "small")
    if shape == "llama-8b":
        cfg = LlamaConfig.llama_3_1_8b()
        prefixes = a.prefixes or "2048,8192,32768"
        block, chunk = 16, 256
    else:
        cfg = LlamaConfig(dtype=torch.bfloat16, hidden=512, layers=8, heads=8, kv_heads=2,
                          head_dim=64, ffn=1024, vocab_size=4096)
        prefixes = a.prefixes or "256,1024"
        block, chunk = 16, 128
    if a.layers:
        cfg.layers = a.layers
    prefixes = [int(x) for x in prefixes.split(",")]
    if device == "cpu":
        print("bench connector: no GPU here; measuring the CPU path with the %s shape" % shape,
              file=sys.stderr)
    model = LlamaModel(cfg, device=device)
    suffix = 128
    max_tokens = max(prefixes) + suffix
    blocks_needed = 3 * ((max_tokens + block - 1) // block) + 8
    cache = PagedKVCache(cfg, num_blocks=blocks_needed, block_size=block, device=device)
    client = dpukv.Client(a.socket, model=dpukv.model_id("bench-llama-%s" % shape))
    kv_bytes_per_token = 2 * cfg.layers * cfg.kv_heads * cfg.head_dim * 2
    staging = 2 * (max(prefixes) // chunk + 1) * cfg.layers * (kv_bytes_per_token // cfg.layers) * chunk
    conn = DpukvConnector(client, "bench-llama-%s" % shape, chunk_tokens=chunk,
                          staging_bytes=staging + (64 << 20), device=conn_device)
    conn.register_kv_caches(cache.layers)
    # Host caches: the same loads through staging too (a second cache and connector,
    # not shared in place), beside the in-place ones in the same run.
    through_staging = None
    if conn.loads_in_place and a.only == "loads":
        cache2 = PagedKVCache(cfg, num_blocks=blocks_needed, block_size=block, device=device)
        through_staging = (DpukvConnector(client, "bench-llama-%s" % shape, chunk_tokens=chunk,
                                          staging_bytes=staging + (64 << 20),
                                          device=conn_device, share_caches=False), cache2)
        through_staging[0].register_kv_caches(cache2.layers)
    # The agent faults clients' exports in ahead of the copies (a step per loop
    # turn): the loads are timed once it has, and the time it took is said.
    t0 = time.perf_counter()
    while json.loads(client.stats()).get("populating", 0):
        time.sleep(0.01)
    print("bench connector: the agent faulted the exports in within %.2f s"
          % (time.perf_counter() - t0), file=sys.stderr)
    path = conn.path + (" (CUDA driver test double: not GPU figures)" if conn_device else "")
    print("bench connector: %s path%s" % (conn.path, (": " + conn.path_reason)
                                         if conn.path_reason else ""), file=sys.stderr)
    rows = []
    g = torch.Generator().manual_seed(7)
    if a.only:
        if a.only == "copies" and not (device == "cuda" and conn.path == "gpu"):
            sys.exit("bench connector: --only copies needs a GPU and the agent's GPU path")
        for n in prefixes:
            prompt = torch.randint(0, cfg.vocab_size, (n + suffix,), generator=g).tolist()
            client.clear()
            rid = "copies%d" % n
            blocks = cache.allocate(len(prompt))
            for kv in cache.layers:  # KV to save, without a forward pass
                kv.normal_()
            conn.get_num_new_matched_tokens(rid, prompt, 0)
            conn.update_state_after_alloc(rid, blocks, 0)
            for layer in range(cfg.layers):
                conn.save_kv_layer(rid, layer, prompt, blocks)
            conn.wait_for_save()
            conn.request_finished(rid)
            cache.release(blocks)
            hit_tokens = (n // chunk) * chunk
            if a.only == "copies":
                rows += agent_copy_rows(client, conn, prompt, hit_tokens, cfg, shape, n)
            else:
                for c, kv in ((conn, cache), through_staging or (None, None)):
                    if c is None:
                        continue
                    rows.append(load_rows(c, kv, cfg, prompt, n, shape, device, path,
                                          kv_bytes_per_token, a.reps))
                    r = rows[-1]
                    print("bench connector: %d-token prefix: load %s %.1f GB/s vs memcpy %.1f "
                          "(%.2fx)" % (n, "in place" if r["in_place"] else "through staging",
                                       r["gbps"], r["baseline_gbps"], r["ratio"]),
                          file=sys.stderr)
        print(json.dumps({"bench": "connector", "results": rows}, indent=2))
        return
    for n in prefixes:
        prompt = torch.randint(0, cfg.vocab_size, (n + suffix,), generator=g).tolist()
        full, saved, plain, hit_t, phases = [], [], [], [], []
        for rep in range(a.reps):
            client.clear()
            # Full prefill without saving, then with saving (the save overhead).
            blocks = cache.allocate(len(prompt))
            sync(device)
            t0 = time.perf_counter()
            model.forward(prompt, 0, cache, blocks)
            sync(device)
            plain.append(time.perf_counter() - t0)
            cache.release(blocks)
            rid = "save%d" % rep
            conn.get_num_new_matched_tokens(rid, prompt, 0)
            blocks = cache.allocate(len(prompt))
            conn.update_state_after_alloc(rid, blocks, 0)
            sync(device)
            t0 = time.perf_counter()
            model.forward(prompt, 0, cache, blocks,
                          layer_done=lambda l: conn.save_kv_layer(rid, l, prompt, blocks))
            sync(device)
            saved.append(time.perf_counter() - t0)
            conn.wait_for_save()
            conn.request_finished(rid)
            cache.release(blocks)
            full.append(plain[-1])
            # The same prompt again: a hit on the prefix.
            rid = "hit%d" % rep
            blocks = cache.allocate(len(prompt))
            sync(device)
            before = dict(conn.phase_s)
            t0 = time.perf_counter()
            hit = conn.get_num_new_matched_tokens(rid, prompt, 0)
            conn.update_state_after_alloc(rid, blocks, hit)
            conn.start_load_kv(rid)
            model.forward(prompt[hit:], hit, cache, blocks,
                          layer_hook=lambda l: conn.wait_for_layer_load(rid, l))
            sync(device)
            hit_t.append(time.perf_counter() - t0)
            # Where the first token's time went: the connector's phases, and the rest
            # (the prefill of what was not loaded, the layers' compute).
            ph = {k: round(conn.phase_s[k] - before[k], 6) for k in before}
            ph["compute_and_rest"] = round(hit_t[-1] - sum(ph.values()), 6)
            phases.append(ph)
            conn.request_finished(rid)
            cache.release(blocks)
        # The load alone (every layer retrieved and scattered, no compute) of the
        # prefix the last repetition saved, next to a memcpy of as many bytes.
        load = load_rows(conn, cache, cfg, prompt, n, shape, device, path, kv_bytes_per_token,
                         a.reps)
        hit_tokens = load["hit_tokens"]
        if device == "cuda" and conn.path == "gpu" and load["bytes"]:
            rows += agent_copy_rows(client, conn, prompt, hit_tokens, cfg, shape, n)
        rows.append({"op": "ttft", "device": device, "shape": shape, "prefix_tokens": n,
                     "hit_tokens": hit_tokens, "seconds": median(hit_t), "path": path,
                     "checksums": checksum_design(json.loads(client.stats())),
                     "attention": model.attention,
                     "baseline": "full prefill", "baseline_seconds": median(full),
                     "ratio": median(full) / median(hit_t),
                     # Every sample, in order (the first is a fresh agent's first hit).
                     "samples_s": [round(x, 6) for x in hit_t],
                     "baseline_samples_s": [round(x, 6) for x in full],
                     "phases_s": phases})
        rows.append({"op": "save_overhead", "device": device, "shape": shape,
                     "prefix_tokens": n, "seconds": median(saved),
                     "baseline": "same forward without saving",
                     "baseline_seconds": median(plain),
                     "ratio": median(saved) / median(plain),
                     "samples_s": [round(x, 6) for x in saved],
                     "baseline_samples_s": [round(x, 6) for x in plain]})
        rows.append(load)
        print("bench connector: %d-token prefix: first token %.3f s hit / %.3f s prefill "
              "(%.2fx), save %.2fx, load %.1f GB/s vs copy %.1f" %
              (n, median(hit_t), median(full), median(full) / median(hit_t),
               median(saved) / median(plain), load["gbps"], load["baseline_gbps"]),
              file=sys.stderr, flush=True)
    print(json.dumps({"bench": "connector", "results": rows}, indent=2))


if __name__ == "__main__":
    main()
