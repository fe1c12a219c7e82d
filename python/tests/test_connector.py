"""The connector against a real agent, with the reference Llama model: request A
prefills a prompt and saves its KV layer by layer; request B shares A's first
three chunks, loads them layer by layer into other blocks of the paged cache and
prefills only the rest. B's logits must be bit-identical to the same model
reusing A's KV kept in memory, and close to a full prefill of B. Then a lease
that expires before the load turns into a miss (LoadMiss), not stale bytes.
Usage: test_connector.py PACKAGE_DIR SOCKET (the agent runs with a 1 s pin timeout)

DPUKV_TEST_DEVICE=cuda-double runs every connector through the CUDA driver test
double (device.CudaDouble: its memory as GPU staging, its events), and
DPUKV_TEST_PATH says which path the connectors must then take: gpu (the agent's
CUDA engine copies into that staging) or host-pinned (the agent has no GPU path)."""
import os
import sys
import time

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.dirname(__file__))
import torch  # noqa: E402

import dpukv  # noqa: E402
from dpukv.connector import DpukvConnector, LoadMiss  # noqa: E402
from reference_model import LlamaConfig, LlamaModel, PagedKVCache  # noqa: E402

DEVICE = None
DEV = "cpu"  # where the model and the KV caches live
if os.environ.get("DPUKV_TEST_DEVICE") == "cuda-double":
    from dpukv.device import CudaDouble
    DEVICE = CudaDouble()
elif os.environ.get("DPUKV_TEST_DEVICE") == "cuda":  # a GPU machine (scripts/gpu_check.sh)
    DEV = "cuda"
PATH = os.environ.get("DPUKV_TEST_PATH", "host")
_Connector = DpukvConnector


def DpukvConnector(*args, **kw):  # noqa: N802: every connector of this test, on DEVICE
    return _Connector(*args, device=DEVICE, **kw)


torch.manual_seed(0)
cfg = LlamaConfig(dtype=torch.bfloat16)
model = LlamaModel(cfg, device=DEV)
BLOCK, CHUNK = 16, 32
client = dpukv.Client(sys.argv[2], model=dpukv.model_id("ref-llama"))
cache = PagedKVCache(cfg, num_blocks=64, block_size=BLOCK, device=DEV)
conn = DpukvConnector(client, "ref-llama", chunk_tokens=CHUNK, staging_bytes=8 << 20)
conn.register_kv_caches(cache.layers)
assert conn.path == PATH, (conn.path, conn.path_reason)


def run(req, tokens, blocks_cache, blocks):
    """One request through the connector as an engine drives it."""
    hit = conn.get_num_new_matched_tokens(req, tokens, 0)
    conn.update_state_after_alloc(req, blocks, hit)
    conn.start_load_kv(req)
    logits = model.forward(tokens[hit:], hit, blocks_cache, blocks,
                           layer_hook=lambda l: conn.wait_for_layer_load(req, l),
                           layer_done=lambda l: conn.save_kv_layer(req, l, tokens, blocks,
                                                                   skip_chunks=hit // CHUNK))
    conn.wait_for_save()
    return hit, logits


prompt_a = torch.randint(0, cfg.vocab_size, (100,)).tolist()
blocks_a = cache.allocate(len(prompt_a))
hit_a, _ = run("a", prompt_a, cache, blocks_a)
conn.request_finished("a")
assert hit_a == 0, hit_a
assert conn.counters["saved_chunks"] == 3 * cfg.layers, conn.counters  # 100 tokens: 3 chunks
assert conn.counters["save_failures"] == 0, conn.counters

# B shares A's first 96 tokens (3 chunks), then goes its own way. Its blocks are
# other blocks of the same cache, zeroed: only the loads can fill them.
prompt_b = prompt_a[:96] + torch.randint(0, cfg.vocab_size, (20,)).tolist()
blocks_b = cache.allocate(len(prompt_b))
for kv in cache.layers:
    kv[:, blocks_b] = 0
hit_b, logits_b = run("b", prompt_b, cache, blocks_b)
conn.request_finished("b")
assert hit_b == 96, hit_b
assert conn.counters["loaded_chunks"] == 3 * cfg.layers, conn.counters

# The same model reusing A's prefix KV held in memory (no dpukv).
ref = PagedKVCache(cfg, num_blocks=64, block_size=BLOCK, device=DEV)
blocks_r = ref.allocate(len(prompt_b))
for l in range(cfg.layers):
    ref.layers[l][:, blocks_r[:96 // BLOCK]] = cache.layers[l][:, blocks_a[:96 // BLOCK]]
logits_r = model.forward(prompt_b[96:], 96, ref, blocks_r)
assert torch.equal(logits_b, logits_r), (logits_b - logits_r).abs().max()

# A full prefill of B: the same up to the rounding of a different computation order.
full = PagedKVCache(cfg, num_blocks=64, block_size=BLOCK, device=DEV)
logits_f = model.forward(prompt_b, 0, full, full.allocate(len(prompt_b)))
diff = (logits_b - logits_f).abs().max().item()
assert diff <= 0.05 * logits_f.abs().max().item(), (diff, logits_f.abs().max().item())
assert logits_b.argmax() == logits_f.argmax()

# Saves through a small staging (5 save slots for 12 chunks): batches wrap around
# the ring of slots and wait for earlier stores; a connector with room loads the
# same bytes back.
client2 = dpukv.Client(sys.argv[2], model=dpukv.model_id("ref-llama-2"))
small = DpukvConnector(client2, "ref-llama-2", chunk_tokens=CHUNK, staging_bytes=10 * 4096)
small.register_kv_caches(cache.layers)
assert small.slots == 5 and small.chunk_bytes == 4096
for l in range(cfg.layers):
    small.save_kv_layer("s", l, prompt_a, blocks_a)
small.wait_for_save()
assert small.counters["saved_chunks"] == 3 * cfg.layers, small.counters
big = DpukvConnector(client2, "ref-llama-2", chunk_tokens=CHUNK, staging_bytes=8 << 20)
big.register_kv_caches(cache.layers)
assert big.get_num_new_matched_tokens("s", prompt_a, 0) == 96
blocks_s = cache.allocate(96)
big.update_state_after_alloc("s", blocks_s, 96)
big.start_load_kv("s")
for l in range(cfg.layers):
    big.wait_for_layer_load("s", l)
    assert torch.equal(cache.layers[l][:, blocks_s], cache.layers[l][:, blocks_a[:6]]), l
big.request_finished("s")

# A lease that expires before the load: the chunks go (here removed; in life
# evicted) and the load is a miss, never stale bytes.
hit_c = conn.get_num_new_matched_tokens("c", prompt_b, 0)
assert hit_c == 96, hit_c
keys = conn._keys(prompt_b[:96], 0)
assert client.remove(keys[:1]) == ["BAD_STATE"]  # pinned: the lease holds
# The agent's pin timeout is 1 s: the lease runs out, the chunk can go.
deadline = time.monotonic() + 60
while client.remove(keys[:1]) != ["SUCCESS"]:
    assert time.monotonic() < deadline, "the lease never expired"
    time.sleep(0.05)
blocks_c = cache.allocate(len(prompt_b))
conn.update_state_after_alloc("c", blocks_c, hit_c)
conn.start_load_kv("c")
try:
    conn.wait_for_layer_load("c", 0)
    raise AssertionError("an expired lease loaded")
except LoadMiss:
    pass
for l in range(1, cfg.layers):
    conn.wait_for_layer_load("c", l)  # other layers still there
conn.request_finished("c")

# ---- A batch: several requests' loads in flight at once, waited for layer by
# layer and request by request as an engine's batch interleaves them. Each must
# get its own prompt's KV (they once all read the same staging offsets).
def save_prompt(c, req, tokens):
    blocks = cache.allocate(len(tokens))
    for kv in cache.layers:
        kv[:, blocks] = torch.randn(kv[:, blocks].shape).to(kv.dtype).to(kv.device)
    for layer in range(cfg.layers):
        c.save_kv_layer(req, layer, tokens, blocks)
    c.wait_for_save()
    return blocks


def batch_loads(c, prompts, sources):
    """Looks up and loads every prompt at once; returns the blocks each got."""
    got = []
    for i, p in enumerate(prompts):
        assert c.get_num_new_matched_tokens(f"batch{i}", p, 0) == 96
        blocks = cache.allocate(96)
        for kv in cache.layers:
            kv[:, blocks] = 0
        c.update_state_after_alloc(f"batch{i}", blocks, 96)
        got.append(blocks)
    for i in range(len(prompts)):
        c.start_load_kv(f"batch{i}")
    for layer in range(cfg.layers):
        for i in range(len(prompts)):
            c.wait_for_layer_load(f"batch{i}", layer)
            assert torch.equal(cache.layers[layer][:, got[i]],
                               cache.layers[layer][:, sources[i][:6]]), (i, layer)
    for i in range(len(prompts)):
        c.request_finished(f"batch{i}")


cache = PagedKVCache(cfg, num_blocks=256, block_size=BLOCK, device=DEV)
client3 = dpukv.Client(sys.argv[2], model=dpukv.model_id("ref-llama-3"))
batch = DpukvConnector(client3, "ref-llama-3", chunk_tokens=CHUNK, staging_bytes=8 << 20)
batch.register_kv_caches(cache.layers)
prompts = [torch.randint(0, cfg.vocab_size, (100,)).tolist() for _ in range(3)]
sources = [save_prompt(batch, f"save{i}", p) for i, p in enumerate(prompts)]
assert batch.counters["save_failures"] == 0, batch.counters
batch_loads(batch, prompts, sources)
assert all(batch.load_free), "load slots not given back"
# A load staging too small for the whole batch (3 chunks x layers each, room for
# two requests): the third request's start finishes the first's loads early,
# into the first request's own blocks.
tight = DpukvConnector(client3, "ref-llama-3", chunk_tokens=CHUNK,
                       staging_bytes=2 * (2 * 3 * cfg.layers) * 4096)
tight.register_kv_caches(cache.layers)
assert tight.slots == 2 * 3 * cfg.layers, tight.slots
batch_loads(tight, prompts, sources)
assert all(tight.load_free), "load slots not given back"

# ---- Bad input gets a clear error, before anything is stored or loaded.
def refused(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except ValueError as e:
        return str(e)
    raise AssertionError(f"{fn.__name__}{args} was accepted")


refused(DpukvConnector, client3, "x", chunk_tokens=0)
refused(DpukvConnector, client3, "x", chunk_tokens=-32)
refused(DpukvConnector, client3, "x", staging_bytes=0)
refused(DpukvConnector, client3, "x", world_size=2, rank=2)
refused(DpukvConnector(client3, "x", chunk_tokens=CHUNK).register_kv_caches, [])
v = DpukvConnector(client3, "ref-llama-3", chunk_tokens=CHUNK, staging_bytes=8 << 20)
v.register_kv_caches(cache.layers)
assert v.get_num_new_matched_tokens("v", prompts[0], 0) == 96
assert "not in" in refused(v.update_state_after_alloc, "v", [-1] + sources[0][1:], 96)
assert "not in" in refused(v.update_state_after_alloc, "v", [10 ** 6] + sources[0][1:], 96)
assert "need" in refused(v.update_state_after_alloc, "v", sources[0][:5], 96)
assert "unknown request" in refused(v.start_load_kv, "nobody")
before = [kv.clone() for kv in cache.layers]
assert "not in" in refused(v.save_kv_layer, "v", 0, prompts[0], [-2] + sources[0][1:])
assert "need" in refused(v.save_kv_layer, "v", 0, prompts[0], sources[0][:2])
assert v.saves == [] and all(torch.equal(a, b) for a, b in zip(before, cache.layers))
v.request_finished("v")

import json  # noqa: E402
st = json.loads(client.stats())
if PATH == "gpu":  # the bytes went through the agent's CUDA engine, not host staging
    assert st["gpu_copies"] >= 2 * 3 * cfg.layers and st["gpu_copy_failures"] == 0, st
else:
    assert st["gpu_copies"] == 0, st
print("connector: ok, %s path (hit %d of %d tokens, logits identical to in-memory reuse, "
      "max |diff| vs full prefill %.4f)" % (conn.path, hit_b, len(prompt_b), diff))
