"""A KV connector core for paged KV caches, engine-independent: what an inference
engine's connector (vLLM's KVConnectorBase_V1, LMCache's) needs from dpukv.

Per layer the engine keeps a paged KV tensor [2, num_blocks, block_size,
kv_heads, head_dim] (vLLM's layout). A prompt is cut into chunks of
`chunk_tokens` tokens (a multiple of block_size); chunk i of layer l is stored
under dpukv's chunk key of the prompt's first (i+1)*chunk_tokens tokens, with
the layer folded into the key's layout fingerprint, so layers load and save on
their own (layer l+1's bytes move while layer l computes) as LMCache's layerwise
mode does.

The methods follow vLLM's KVConnectorBase_V1 split:
  scheduler side: get_num_new_matched_tokens, update_state_after_alloc,
                  request_finished
  worker side:    register_kv_caches, start_load_kv, wait_for_layer_load,
                  save_kv_layer, wait_for_save
This class has not been run inside vLLM (vLLM cannot be installed here); it is
exercised by python/test_connector.py with the reference model of model.py.

Data path today: through the client's host staging (shared memory the agent
maps): gather the blocks of a chunk into staging with torch, store; retrieve
into staging, scatter into the blocks. On a GPU the gather/scatter run on the
GPU and the host copy is one D2H or H2D per chunk. (The agent's CUDA copy engine
that writes into GPU memory directly is not built yet; see issue 14.)

Leases: get_num_new_matched_tokens pins what it reports (lookup with pin), so a
hit is still there when it is loaded; request_finished unpins. A pin that
expires (the agent's pin timeout) before the load turns the load into a miss:
wait_for_layer_load raises LoadMiss, never hands back stale bytes."""
from dataclasses import dataclass, field

import torch

from . import _native as native

_GOLDEN = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


class LoadMiss(RuntimeError):
    """A chunk reported as a hit could not be loaded (its lease expired, the agent
    dropped it): recompute those tokens."""


@dataclass
class _Request:
    tokens: list
    matched_chunks: int = 0
    pinned: list = field(default_factory=list)  # per layer: keys pinned by lookup
    block_ids: list = field(default_factory=list)
    loads: list = field(default_factory=list)  # per layer: (Pending, chunks) or None


class DpukvConnector:
    """client: a dpukv.Client opened with model=model_id(model_name) (the agent
    refuses keys of another model: they count as save failures and misses)."""

    def __init__(self, client, model_name: str, chunk_tokens: int = 256,
                 staging_bytes: int = 256 << 20, world_size: int = 1, rank: int = 0):
        self.client = client
        self.model = native.model_id(model_name)
        self.chunk_tokens = chunk_tokens
        self.world_size = world_size
        self.rank = rank
        self.staging_bytes = staging_bytes
        self.kv = None
        self.requests = {}
        self.saves = []  # (Pending, chunks) of stores not yet waited for
        self.saving_chunks = 0
        self.counters = {"lookup_hit_tokens": 0, "loaded_chunks": 0, "saved_chunks": 0,
                         "save_failures": 0}

    # ---- worker side -----------------------------------------------------------

    def register_kv_caches(self, kv_caches):
        """kv_caches: per layer a tensor [2, num_blocks, block_size, kv_heads, head_dim]."""
        first = kv_caches[0]
        if first.dim() != 5 or first.shape[0] != 2:
            raise ValueError("KV caches must be [2, num_blocks, block_size, kv_heads, head_dim]")
        for t in kv_caches:
            if t.shape != first.shape or t.dtype != first.dtype:
                raise ValueError("every layer's KV cache must have the same shape and dtype")
        self.kv = list(kv_caches)
        _, _, self.block_size, heads, dim = first.shape
        if self.chunk_tokens % self.block_size:
            raise ValueError("chunk_tokens must be a multiple of the block size")
        self.blocks_per_chunk = self.chunk_tokens // self.block_size
        self.chunk_bytes = 2 * self.chunk_tokens * heads * dim * first.element_size()
        dtype = str(first.dtype).replace("torch.", "")
        base = native.kv_layout_fingerprint(dtype, len(kv_caches), heads, dim)
        self.layouts = [base ^ ((l + 1) * _GOLDEN & _MASK) for l in range(len(kv_caches))]
        # Two halves of staging: loads and saves run at the same time.
        self.slots = self.staging_bytes // self.chunk_bytes // 2
        if self.slots < len(kv_caches):
            raise ValueError("staging_bytes must hold at least one chunk per layer for loads "
                             "and one for saves")
        self.staging = self.client.alloc_staging(2 * self.slots * self.chunk_bytes)
        self.staging_u8 = torch.frombuffer(memoryview(self.staging), dtype=torch.uint8)
        self.save_slot = 0

    def _keys(self, tokens, layer, include_partial=False):
        return native.chunk_keys(self.model, list(tokens), self.chunk_tokens, include_partial,
                                 self.world_size, self.rank, self.layouts[layer])

    # ---- scheduler side --------------------------------------------------------

    def get_num_new_matched_tokens(self, request_id, tokens, num_computed_tokens: int) -> int:
        """Tokens beyond num_computed_tokens that dpukv can load, pinned until
        request_finished. A full hit still leaves the last chunk to compute (the
        engine needs at least one token to produce logits)."""
        req = _Request(tokens=list(tokens))
        matched = None
        for l in range(len(self.kv)):
            keys = self._keys(tokens, l)
            n = self.client.lookup(keys, pin=True)
            req.pinned.append(keys[:n])
            matched = n if matched is None else min(matched, n)
        matched = matched or 0
        if matched * self.chunk_tokens >= len(tokens):
            matched -= 1
        req.matched_chunks = max(matched, 0)
        self.requests[request_id] = req
        hit = req.matched_chunks * self.chunk_tokens
        self.counters["lookup_hit_tokens"] += hit
        return max(hit - num_computed_tokens, 0)

    def update_state_after_alloc(self, request_id, block_ids, num_external_tokens: int):
        req = self.requests[request_id]
        req.block_ids = list(block_ids)
        req.matched_chunks = min(req.matched_chunks, num_external_tokens // self.chunk_tokens)

    def request_finished(self, request_id):
        req = self.requests.pop(request_id, None)
        if req is not None:
            for keys in req.pinned:
                if keys:
                    self.client.unpin(keys)

    # ---- loads -----------------------------------------------------------------

    def start_load_kv(self, request_id):
        """Starts every layer's retrieve at once; wait_for_layer_load(l) finishes
        layer l (the engine calls it just before the layer's attention)."""
        req = self.requests[request_id]
        n = req.matched_chunks
        if n * len(self.kv) > self.slots:
            raise ValueError("the hit is larger than the load staging; raise staging_bytes")
        req.loads = []
        for l in range(len(self.kv)):
            if n == 0:
                req.loads.append(None)
                continue
            keys = self._keys(req.tokens[:n * self.chunk_tokens], l)
            offsets = [(l * n + c) * self.chunk_bytes for c in range(n)]
            pending = self.client.submit_retrieve(self.staging, keys, offsets,
                                                  [self.chunk_bytes] * n)
            req.loads.append((pending, n))

    def wait_for_layer_load(self, request_id, layer: int):
        req = self.requests[request_id]
        if not req.loads or req.loads[layer] is None:
            return
        pending, n = req.loads[layer]
        req.loads[layer] = None
        status = self.client.wait(pending)
        if any(s != "SUCCESS" for s in status):
            raise LoadMiss(f"layer {layer}: {status}")
        # One scatter for the layer: staging holds its n chunks back to back, each
        # [2, blocks_per_chunk, block_size, heads, dim].
        kv = self.kv[layer]
        first = layer * n * self.chunk_bytes
        src = self.staging_u8[first:first + n * self.chunk_bytes].view(kv.dtype)
        src = src.view((n, 2, self.blocks_per_chunk) + tuple(kv.shape[2:])).transpose(0, 1)
        blocks = torch.tensor(req.block_ids[:n * self.blocks_per_chunk], device=kv.device)
        kv[:, blocks] = src.reshape((2, n * self.blocks_per_chunk) + tuple(kv.shape[2:])).to(
            kv.device, non_blocking=True)
        self.counters["loaded_chunks"] += n

    # ---- saves -----------------------------------------------------------------

    def save_kv_layer(self, request_id, layer: int, tokens, block_ids, skip_chunks: int = 0):
        """Saves the whole chunks of layer `layer` of a request after the layer has
        written its KV; returns at once (wait_for_save collects). Chunks below
        skip_chunks (loaded from dpukv) are not stored again."""
        keys = self._keys(tokens, layer)[skip_chunks:]
        kv = self.kv[layer]
        # Slots of the save half are reused only once their stores have landed.
        for first in range(0, len(keys), self.slots):
            batch = keys[first:first + self.slots]
            if self.saving_chunks + len(batch) > self.slots:
                self.wait_for_save()
            # One gather for the batch's chunks, copied into consecutive slots (two
            # pieces when the ring of slots wraps).
            c0 = skip_chunks + first
            n = len(batch)
            blocks = torch.tensor(
                block_ids[c0 * self.blocks_per_chunk:(c0 + n) * self.blocks_per_chunk],
                device=kv.device)
            data = kv[:, blocks].view((2, n, self.blocks_per_chunk) + tuple(kv.shape[2:]))
            data = data.transpose(0, 1)  # [n, 2, blocks_per_chunk, ...]: chunk after chunk
            offsets = []
            done = 0
            while done < n:
                slot = self.slots + (self.save_slot + done) % self.slots
                run = min(n - done, 2 * self.slots - slot)
                b = slot * self.chunk_bytes
                dst = self.staging_u8[b:b + run * self.chunk_bytes].view(kv.dtype)
                dst.view(data[done:done + run].shape).copy_(data[done:done + run])
                offsets += [(slot + i) * self.chunk_bytes for i in range(run)]
                done += run
            self.save_slot = (self.save_slot + len(batch)) % self.slots
            self.saving_chunks += len(batch)
            pending = self.client.submit_store(self.staging, batch, offsets,
                                               [self.chunk_bytes] * len(batch))
            self.saves.append((pending, len(batch)))

    def wait_for_save(self):
        for pending, n in self.saves:
            status = self.client.wait(pending)
            ok = sum(1 for s in status if s == "SUCCESS")
            self.counters["saved_chunks"] += ok
            self.counters["save_failures"] += n - ok
        self.saves = []
        self.saving_chunks = 0
