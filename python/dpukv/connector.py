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
exercised by python/tests/test_connector.py with the reference model
(python/tests/reference_model.py).

Data path (`path`): "gpu" when the KV caches are CUDA tensors and the agent has
a GPU path: staging is GPU memory exported to the agent, whose CUDA engine copies
each layer's chunks between its arena and that staging (one copy per chunk, the
offload side owning the copy); the connector gathers or scatters between staging
and the paged blocks with one torch indexing op per layer on its own stream, and
wait_for_layer_load makes the compute stream wait for that layer's event, never
the host. "host-pinned": the agent cannot reach this GPU; staging is host shared
memory registered with the driver, and layer l's host-to-device copy runs while
the agent copies layer l+1. "host": CPU tensors. The device calls sit behind
device.py (torch's CUDA on a GPU, the CUDA driver test double in CI), so the code
here is the same on every path.

Leases: get_num_new_matched_tokens pins what it reports (lookup with pin), so a
hit is still there when it is loaded; request_finished unpins. A pin that
expires (the agent's pin timeout) before the load turns the load into a miss:
wait_for_layer_load raises LoadMiss, never hands back stale bytes.

Loads of several requests overlap as an engine's batch makes them: each
request's layer gets its own run of slots in the load half of staging, taken in
start_load_kv and given back when the layer is scattered. A request's layers that
do not fit at once wait their turn and start as earlier layers are scattered (a
hit needs one layer's chunks in staging at a time: max_load_chunks). When the
slots run out, the oldest loads of other requests are finished early (waited for
and scattered into their own blocks, which the engine has already allocated to
them) until there is room: a bounded pool with a wait, never shared bytes.

An agent that is away is a miss, never an error the engine has to handle: the
lookup answers 0, a load that cannot start makes every layer of the request
raise LoadMiss, a save that cannot start is counted as a save failure."""
import operator
import time
import weakref
from collections import deque
from dataclasses import dataclass, field

import torch

from . import _native as native
from . import device as devices

_GOLDEN = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


def release_pins(client, key_lists):
    """Unpins what lookups pinned (a list of key lists, one call: the client sends
    every layer's keys before it awaits an answer); an agent that went away took
    its pins with it."""
    keys = [k for ks in key_lists for k in ks]
    if keys:
        try:
            client.unpin(keys)
        except native.AgentUnavailable:
            pass


def layer_layouts(dtype: str, layers: int, kv_heads: int, head_dim: int, kv_layout="NHD"):
    """The layout field of each layer's chunk keys: the cache's dtype, shape and
    layout (the bytes of an HND block are not those of an NHD block), and the layer."""
    name = dtype if kv_layout == "NHD" else f"{dtype}:{kv_layout}"
    base = native.kv_layout_fingerprint(name, layers, kv_heads, head_dim)
    return [base ^ ((l + 1) * _GOLDEN & _MASK) for l in range(layers)]


class LoadMiss(RuntimeError):
    """A chunk reported as a hit could not be loaded (its lease expired, the agent
    dropped it or went away): recompute those tokens."""


@dataclass
class _Load:
    """One layer's retrieve in flight: n chunks into slots [slot, slot + n)."""
    pending: object
    n: int
    slot: int


class _Queued:
    """A layer whose retrieve waits for room in the load staging."""


@dataclass
class _Failed:
    """A layer that will not load; wait_for_layer_load raises with this reason."""
    reason: str


@dataclass
class _Request:
    tokens: list
    matched_chunks: int = 0
    pinned: list = field(default_factory=list)  # per layer: keys pinned by lookup
    keys: list = field(default_factory=list)  # per layer: the prompt's chunk keys
    rows_t: object = None  # the loaded chunks' rows in the caches' row view (see kv_rows)
    block_ids: list = field(default_factory=list)
    loads: list = field(default_factory=list)  # per layer: _Load, _Failed or None (done)
    load_started: bool = False


class DpukvConnector:
    """client: a dpukv.Client opened with model=model_id(model_name) (the agent
    refuses keys of another model: they count as save failures and misses)."""

    def __init__(self, client, model_name: str, chunk_tokens: int = 256,
                 staging_bytes: int = 256 << 20, world_size: int = 1, rank: int = 0,
                 device=None, kv_layout: str = "NHD"):
        """device: a device.py backend (default: TorchCuda for CUDA tensors, host
        staging for CPU tensors), or "host" for host staging always. kv_layout: NHD
        ([2, num_blocks, block_size, kv_heads, head_dim]), HND ([2, num_blocks,
        kv_heads, block_size, head_dim]) or MLA (one latent cache per layer,
        [num_blocks, block_size, head_dim], as DeepSeek's models keep it)."""
        if kv_layout not in ("NHD", "HND", "MLA", "BHNC"):
            raise ValueError(f"kv_layout must be NHD, HND, MLA or BHNC, not {kv_layout!r}")
        self.kv_layout = kv_layout
        for name, v in (("chunk_tokens", chunk_tokens), ("staging_bytes", staging_bytes),
                        ("world_size", world_size)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, not {v!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), not {rank!r}")
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
        # Every layer's keys of a request's tokens, hashed once for a step's saves
        # (by request, token count and salt: a request's tokens only grow); dropped
        # when the step's saves are collected.
        self._step_keys = {}
        self.counters = {"lookup_hit_tokens": 0, "loaded_chunks": 0, "saved_chunks": 0,
                         "save_failures": 0}
        # Host seconds per phase of a load (lookup round trip, waiting for the agent's
        # retrieves, the scatter into the blocks: on a GPU its launch only), for the
        # benchmarks' breakdown of a first token.
        self.phase_s = {"lookup": 0.0, "retrieve_wait": 0.0, "scatter": 0.0}
        self._device = device
        self.dev = None
        self.path = None
        self.path_reason = ""
        self._unpin = None  # gives the host staging's page lock back (host-pinned)

    # ---- worker side -----------------------------------------------------------

    def register_kv_caches(self, kv_caches, layer_ids=None, total_layers=None):
        """kv_caches: per layer a tensor [2, num_blocks, block_size, kv_heads, head_dim]
        (kv_layout HND: [2, num_blocks, kv_heads, block_size, head_dim]; MLA:
        [num_blocks, block_size, head_dim]).

        layer_ids: the model's own index of each cache's layer, and total_layers the
        model's layer count (default: the caches are layers 0..n-1 of n). A pipeline
        stage holds only some of the model's layers: its keys are those of the
        model's layers it holds, so that no two stages share a key."""
        kv_caches = list(kv_caches)
        if not kv_caches:
            raise ValueError("register_kv_caches needs at least one layer's KV cache")
        if layer_ids is None:
            layer_ids = list(range(len(kv_caches)))
        layer_ids = list(layer_ids)
        if total_layers is None:
            total_layers = len(kv_caches)
        if (len(layer_ids) != len(kv_caches) or len(set(layer_ids)) != len(layer_ids) or
                not all(isinstance(i, int) and 0 <= i < total_layers for i in layer_ids)):
            raise ValueError(f"layer_ids {layer_ids} are not {len(kv_caches)} distinct layers "
                             f"of [0, {total_layers})")
        first = kv_caches[0]
        # K and V per block, or one part: MLA's latent, or a block whose content
        # holds both (BHNC).
        self.parts = 1 if self.kv_layout in ("MLA", "BHNC") else 2
        if self.kv_layout == "BHNC":
            if not isinstance(first, torch.Tensor) or first.dim() != 4:
                raise ValueError("BHNC KV caches must be [num_blocks, kv_heads, block_size, "
                                 "content] (vLLM's per-layer view)")
        elif self.parts == 1:
            if not isinstance(first, torch.Tensor) or first.dim() != 3:
                raise ValueError("MLA KV caches must be [num_blocks, block_size, head_dim]")
        elif not isinstance(first, torch.Tensor) or first.dim() != 5 or first.shape[0] != 2:
            raise ValueError("KV caches must be [2, num_blocks, block_size, kv_heads, head_dim]")
        for t in kv_caches:
            if not isinstance(t, torch.Tensor) or t.shape != first.shape or t.dtype != first.dtype:
                raise ValueError("every layer's KV cache must have the same shape and dtype")
            # A block's K (or V, or latent) bytes must be contiguous; the blocks and
            # the layers may be strided (vLLM's cross-layer caches: blocks first).
            inner = t[0, 0] if self.parts == 2 else t[0]
            if not inner.is_contiguous():
                raise ValueError("each block of a KV cache must be contiguous")
        self.kv = kv_caches
        if self.kv_layout == "NHD":
            _, self.num_blocks, self.block_size, heads, dim = first.shape
        elif self.kv_layout == "HND":
            _, self.num_blocks, heads, self.block_size, dim = first.shape
        elif self.kv_layout == "BHNC":
            self.num_blocks, heads, self.block_size, dim = first.shape
        else:
            (self.num_blocks, self.block_size, dim), heads = first.shape, 1
        if self.chunk_tokens % self.block_size:
            raise ValueError("chunk_tokens must be a multiple of the block size")
        self.blocks_per_chunk = self.chunk_tokens // self.block_size
        self.chunk_bytes = self.parts * self.chunk_tokens * heads * dim * first.element_size()
        dtype = str(first.dtype).replace("torch.", "")
        model_layouts = layer_layouts(dtype, total_layers, heads, dim, self.kv_layout)
        self.layer_ids = layer_ids
        self.layouts = [model_layouts[i] for i in layer_ids]
        # Two halves of staging: loads and saves run at the same time. A hit needs
        # one layer's chunks in the load half at a time (layers load in rounds when
        # they do not all fit: max_load_chunks).
        self.slots = self.staging_bytes // self.chunk_bytes // 2
        if self.slots < 1:
            raise ValueError(f"staging_bytes ({self.staging_bytes}) must hold at least two "
                             f"chunks of {self.chunk_bytes} bytes (one to load, one to save)")
        self._open_staging(kv_caches, 2 * self.slots * self.chunk_bytes)
        # Gathers and scatters move whole blocks: every layer's cache seen as rows
        # (row b: K of block b, row num_blocks + b: V of block b) and staging as rows
        # (a chunk: its K blocks, then its V blocks). The rows are viewed as 4- or
        # 2-byte integers: torch moves those with plain copies, and bf16 elementwise,
        # about 6x slower on a CPU.
        row_bytes = self.chunk_bytes // (self.parts * self.blocks_per_chunk)
        self.row_dtype = (torch.int32 if row_bytes % 4 == 0 else
                          torch.int16 if row_bytes % 2 == 0 else torch.uint8)
        # Contiguous caches: one row index per row. Strided ones (cross-layer): a
        # (block, part) view of rows, indexed by two index tensors.
        self.strided = not all(kv.is_contiguous() for kv in kv_caches)
        if self.strided:
            self.kv_rows = [self._rows_view(kv) for kv in kv_caches]
        else:
            self.kv_rows = [kv.view(self.parts * self.num_blocks, -1).view(self.row_dtype)
                            for kv in kv_caches]
        self.staging_rows = self.staging_u8.view(self.row_dtype).view(
            2 * self.slots * self.parts * self.blocks_per_chunk, -1)
        # Per slot: the event after which its bytes were last read on the device
        # (a scatter); the agent may write the slot again only after it.
        self.slot_events = [None] * (2 * self.slots)
        self.save_slot = 0
        self.load_free = [True] * self.slots  # the load half's slots
        self.inflight = deque()  # (request_id, layer) of loads in flight, oldest first
        self._warm_up()

    def _warm_up(self):
        """Pays here what a fresh process's first load and save would: the device's
        gather and scatter kernels (loaded lazily by CUDA), the index and staging
        copies' memory, the side stream's first event. Block 0's rows of layer 0
        are gathered into a save slot and scattered back unchanged (no request runs
        yet: nothing else writes the cache)."""
        kv = self.kv[0]
        n = self.parts * self.blocks_per_chunk
        rows = self._rows([0] * self.blocks_per_chunk, 1, kv.device)
        dst = self.staging_rows[self.slots * n:(self.slots + 1) * n]
        if self.dev is None:
            self._gather(0, rows, 0, n, dst)
            self._scatter(0, rows, n, dst)
            return
        side = self.dev.stream()
        self.dev.compute_done_first(side)
        with self.dev.use(side):
            self._gather(0, rows, 0, n, dst)
            self._scatter(0, rows, n, dst.to(kv.device, non_blocking=True))
            ev = self.dev.record(side)
        self.dev.host_wait(ev)

    def _open_staging(self, kv_caches, nbytes):
        self.dev = None if self._device == "host" else (
            self._device or devices.for_tensors(kv_caches))
        if self.dev is not None:
            got, why = devices.export_staging(self.client, self.dev, nbytes)
            if got is not None:
                self.staging, self.staging_u8 = got
                self.path = "gpu"
                return
            self.path_reason = why
        self.staging = self.client.alloc_staging(nbytes)
        self.staging_u8 = torch.frombuffer(memoryview(self.staging), dtype=torch.uint8)
        self.path = "host-pinned" if self.dev is not None and self.dev.pin(self.staging) else "host"
        if self.dev is not None and self.path == "host":
            self.dev = None  # nothing asynchronous to order: plain host copies
        if self.path == "host-pinned":
            # Also when the connector is collected without close(): a lock left on
            # staging the client unmaps later keeps a later mapping at that address
            # from being pinned (the driver: already registered), and its connector
            # would fall back to unpinned copies.
            self._unpin = weakref.finalize(self, self.dev.unpin, self.staging)

    def close(self):
        """Gives back what register_kv_caches took of the driver (the host staging's
        page lock). Before the client closes: its staging goes with it."""
        if self._unpin is not None:
            self._unpin()

    def _rows_view(self, kv):
        """[num_blocks, parts, row] over a strided layer cache, in row_dtype units."""
        v = kv.view(self.row_dtype)
        row = v[0, 0].numel() if self.parts == 2 else v[0].numel()
        if self.parts == 2:
            return v.as_strided((self.num_blocks, 2, row), (v.stride(1), v.stride(0), 1),
                                v.storage_offset())
        return v.as_strided((self.num_blocks, 1, row), (v.stride(0), row, 1), v.storage_offset())

    def _rows(self, block_ids, chunks, device):
        """The rows of `chunks` chunks in the caches' row view, in staging's order:
        per chunk its K blocks' rows, then its V blocks' rows (MLA: its blocks' rows).
        Strided caches: a (blocks, parts) pair of index tensors."""
        b = torch.tensor(block_ids[:chunks * self.blocks_per_chunk],
                         dtype=torch.int64).view(chunks, self.blocks_per_chunk)
        if self.strided:
            if self.parts == 1:
                return (b.reshape(-1).to(device), torch.zeros(b.numel(), dtype=torch.int64,
                                                              device=device))
            parts = torch.cat([torch.zeros_like(b), torch.ones_like(b)], dim=1)
            return (torch.cat([b, b], dim=1).reshape(-1).to(device), parts.reshape(-1).to(device))
        if self.parts == 1:
            return b.reshape(-1).to(device)
        return torch.cat([b, b + self.num_blocks], dim=1).reshape(-1).to(device)

    def _scatter(self, layer, rows, k, src):
        """Staging rows src into the first k rows of `rows` of a layer's cache."""
        if self.strided:
            self.kv_rows[layer][rows[0][:k], rows[1][:k]] = src
        else:
            self.kv_rows[layer][rows[:k]] = src

    def _gather(self, layer, rows, a, b, dst):
        """Rows [a, b) of `rows` of a layer's cache into staging rows dst."""
        if not self.strided and dst.device == self.kv_rows[layer].device:
            torch.index_select(self.kv_rows[layer], 0, rows[a:b], out=dst)  # one pass
        elif self.strided:
            dst.copy_(self.kv_rows[layer][rows[0][a:b], rows[1][a:b]])
        else:  # host-pinned: gathered on the device, then copied down
            dst.copy_(torch.index_select(self.kv_rows[layer], 0, rows[a:b]))

    def _slots_ready(self, first, n):
        """Before the agent writes slots again: the device reads of them are done."""
        for j in range(first, first + n):
            if self.slot_events[j] is not None:
                self.dev.host_wait(self.slot_events[j])
                self.slot_events[j] = None

    def _check_blocks(self, block_ids, chunks, what):
        """The blocks of the first `chunks` chunks: enough of them, each a block of
        the cache (torch would wrap a negative id onto another block)."""
        need = chunks * self.blocks_per_chunk
        ids = list(block_ids)
        if len(ids) < need:
            raise ValueError(f"{what}: {chunks} chunks need {need} block ids, got {len(ids)}")
        # Plain ints (what engines pass): checked by their range at C speed.
        if ids and all(type(b) is int for b in ids) and 0 <= min(ids) and max(ids) < self.num_blocks:
            return ids
        for i, b in enumerate(ids):
            try:
                ids[i] = operator.index(b)  # ints, numpy and 0-d torch integers
            except TypeError:
                raise ValueError(f"{what}: block id {b!r} is not an integer") from None
            if isinstance(b, bool) or not 0 <= ids[i] < self.num_blocks:
                raise ValueError(f"{what}: block id {b!r} is not in [0, {self.num_blocks})")
        return ids

    def _keys(self, tokens, layer, include_partial=False, salt=0):
        return native.chunk_keys(self.model, list(tokens), self.chunk_tokens, include_partial,
                                 self.world_size, self.rank, self.layouts[layer] ^ salt)

    # ---- scheduler side --------------------------------------------------------

    def get_num_new_matched_tokens(self, request_id, tokens, num_computed_tokens: int) -> int:
        """Tokens beyond num_computed_tokens that dpukv can load, pinned until
        request_finished. A full hit still leaves the last chunk to compute (the
        engine needs at least one token to produce logits)."""
        if self.kv is None:
            raise ValueError("register_kv_caches first")
        req = _Request(tokens=list(tokens))
        req.keys = native.chunk_keys_layers(self.model, req.tokens, self.chunk_tokens, False,
                                            self.world_size, self.rank, self.layouts)
        hits = [0] * len(self.kv)  # a prompt shorter than a chunk has nothing to find
        if req.keys and req.keys[0]:
            t0 = time.perf_counter()
            try:  # every layer's lookup in one round trip
                hits = self.client.lookup_layers(req.keys, pin=True)
            except native.AgentUnavailable:
                pass  # the cache is away: recompute
            self.phase_s["lookup"] += time.perf_counter() - t0
        req.pinned = [keys[:n] for keys, n in zip(req.keys, hits)]
        matched = min(hits)
        matched = matched or 0
        if matched * self.chunk_tokens >= len(tokens):
            matched -= 1
        req.matched_chunks = max(matched, 0)
        self.requests[request_id] = req
        hit = req.matched_chunks * self.chunk_tokens
        self.counters["lookup_hit_tokens"] += hit
        return max(hit - num_computed_tokens, 0)

    def update_state_after_alloc(self, request_id, block_ids, num_external_tokens: int):
        req = self._request(request_id)
        if num_external_tokens < 0:
            raise ValueError(f"num_external_tokens must be >= 0, not {num_external_tokens}")
        req.matched_chunks = min(req.matched_chunks, num_external_tokens // self.chunk_tokens)
        req.block_ids = self._check_blocks(block_ids, req.matched_chunks,
                                           f"request {request_id!r}")

    def request_finished(self, request_id):
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        # Loads still in flight write into their slots: wait before the slots go back.
        for layer, load in enumerate(req.loads):
            if isinstance(load, _Load):
                self._settle(load)
                req.loads[layer] = None
        self.inflight = deque(x for x in self.inflight if x[0] != request_id)
        release_pins(self.client, req.pinned)

    def prepare_load(self, request_id, tokens, block_ids, first: int, end: int, salt: int = 0):
        """A load the caller looked up (and pinned) elsewhere, as a vLLM worker
        gets it from its scheduler: chunks [first, end) of tokens into their blocks
        of block_ids (the request's whole block table). start_load_kv next; the
        pins stay the caller's (request_finished here releases none)."""
        if self.kv is None:
            raise ValueError("register_kv_caches first")
        if not 0 <= first < end:
            raise ValueError(f"chunks [{first}, {end}) is not a range to load")
        block_ids = self._check_blocks(block_ids, end, f"request {request_id!r}")
        if request_id in self.requests:
            raise ValueError(f"request {request_id!r} has a load prepared already")
        req = _Request(tokens=list(tokens))
        keys = native.chunk_keys_layers(self.model, req.tokens, self.chunk_tokens, False,
                                        self.world_size, self.rank,
                                        [l ^ salt for l in self.layouts])
        if len(keys[0]) < end:
            raise ValueError(f"request {request_id!r}: {len(req.tokens)} tokens hold "
                             f"{len(keys[0])} whole chunks, not {end}")
        req.keys = [k[first:end] for k in keys]
        req.block_ids = block_ids[first * self.blocks_per_chunk:end * self.blocks_per_chunk]
        req.matched_chunks = end - first
        self.requests[request_id] = req

    def _request(self, request_id):
        req = self.requests.get(request_id)
        if req is None:
            raise ValueError(f"unknown request {request_id!r}: get_num_new_matched_tokens first")
        return req

    # ---- loads -----------------------------------------------------------------

    @property
    def max_load_chunks(self):
        """The largest hit this connector loads: one layer's chunks fill at most the
        load half of staging (the layers go through it in rounds)."""
        return self.slots

    def start_load_kv(self, request_id):
        """Starts the retrieve of every layer that fits in the load staging now (the
        rest start as earlier layers are scattered); wait_for_layer_load(l) finishes
        layer l (the engine calls it just before the layer's attention). Nothing
        here raises for the agent or the hit's size: an agent that is away, or a hit
        larger than max_load_chunks, makes every layer of the request raise LoadMiss
        when it is waited for."""
        req = self._request(request_id)
        n = req.matched_chunks
        if req.load_started:
            raise ValueError(f"start_load_kv({request_id!r}) was called already")
        req.load_started = True
        req.loads = [None] * len(self.kv)
        if n == 0:
            return
        if n > self.max_load_chunks:
            why = (f"a hit of {n} chunks is larger than the load staging "
                   f"({self.max_load_chunks} chunks of {self.chunk_bytes} bytes); "
                   "raise staging_bytes")
            req.loads = [_Failed(why)] * len(self.kv)
            return
        req.loads = [_Queued()] * len(self.kv)
        # The first layer may finish other requests' loads to find room; later ones
        # take only free slots and otherwise wait for their turn (_pump).
        self._start_layer(request_id, 0, self._take_slots(n, request_id))
        self._pump(request_id)

    def _pump(self, request_id):
        """Starts the request's queued layers, in order, while a run of free slots
        is there for them."""
        req = self.requests.get(request_id)
        if req is None:
            return
        for l, load in enumerate(req.loads):
            if not isinstance(load, _Queued):
                continue
            slot = self._free_run(req.matched_chunks)
            if slot is None:
                return
            self._start_layer(request_id, l, slot)

    def _start_layer(self, request_id, l, slot):
        req = self.requests[request_id]
        n = req.matched_chunks
        self._slots_ready(slot, n)
        keys = req.keys[l][:n]
        offsets = [(slot + c) * self.chunk_bytes for c in range(n)]
        try:
            pending = self.client.submit_retrieve(self.staging, keys, offsets,
                                                  [self.chunk_bytes] * n)
        except (native.AgentUnavailable, RuntimeError) as e:  # away, or refused
            self._give_slots(slot, n)
            for m in range(l, len(self.kv)):
                if isinstance(req.loads[m], (_Queued, type(None))):
                    req.loads[m] = _Failed(f"the load did not start: {e}")
            return
        req.loads[l] = _Load(pending, n, slot)
        self.inflight.append((request_id, l))

    def _free_run(self, n):
        """The first run of n free load slots (taken), or None."""
        run = 0
        for i, free in enumerate(self.load_free):
            run = run + 1 if free else 0
            if run == n:
                first = i - n + 1
                for j in range(first, first + n):
                    self.load_free[j] = False
                return first
        return None

    def _take_slots(self, n, request_id):
        """The first run of n free load slots; finishes the oldest loads in flight
        (other requests' first) until there is one."""
        while True:
            first = self._free_run(n)
            if first is not None:
                return first
            victim = next((x for x in self.inflight if x[0] != request_id), None)
            if victim is None:
                victim = self.inflight[0] if self.inflight else None
            if victim is None:  # cannot happen: n <= max_load_chunks was checked
                raise RuntimeError("load staging exhausted with nothing in flight")
            self._finish(*victim)

    def _give_slots(self, slot, n):
        for j in range(slot, slot + n):
            self.load_free[j] = True

    def _settle(self, load):
        """Waits for a load and gives its slots back; its statuses, or None if the
        agent went away meanwhile."""
        try:
            status = self.client.wait(load.pending)
        except (native.AgentUnavailable, RuntimeError):
            status = None
        self._give_slots(load.slot, load.n)
        return status

    def _finish(self, request_id, layer):
        """Waits for one layer's load and scatters it into the request's blocks;
        records a failure for wait_for_layer_load to raise."""
        req = self.requests[request_id]
        load = req.loads[layer]
        self.inflight.remove((request_id, layer))
        # Scattered before the slots can be taken again (nothing runs in between).
        t0 = time.perf_counter()
        try:
            status = self.client.wait(load.pending)
        except (native.AgentUnavailable, RuntimeError) as e:
            status = [f"{e}"]
        t1 = time.perf_counter()
        self.phase_s["retrieve_wait"] += t1 - t0
        if any(s != "SUCCESS" for s in status):
            self._give_slots(load.slot, load.n)
            req.loads[layer] = _Failed(f"layer {layer}: {status}")
            return
        # One scatter for the layer: its n chunks lie back to back from its first
        # slot, each [2, blocks_per_chunk, block_size, heads, dim].
        n = load.n
        kv = self.kv[layer]
        rows = self.parts * self.blocks_per_chunk  # per chunk
        src = self.staging_rows[load.slot * rows:(load.slot + n) * rows]
        if req.rows_t is None:
            req.rows_t = self._rows(req.block_ids, req.matched_chunks, kv.device)
        if self.dev is None:
            # One row scatter: the bytes move once, staging to blocks.
            self._scatter(layer, req.rows_t, n * rows, src)
        else:
            # On the connector's stream (the host-pinned path's copy to the device
            # first); the compute stream waits for its event, and the slots are
            # written again only after it (_slots_ready).
            side = self.dev.stream()
            with self.dev.use(side):
                src = src.to(kv.device, non_blocking=True)
                self._scatter(layer, req.rows_t, n * rows, src)
                ev = self.dev.record(side)
            self.dev.compute_wait(ev)
            for j in range(load.slot, load.slot + n):
                self.slot_events[j] = ev
        self._give_slots(load.slot, n)
        req.loads[layer] = None
        self.counters["loaded_chunks"] += n
        self.phase_s["scatter"] += time.perf_counter() - t1

    def wait_for_layer_load(self, request_id, layer: int):
        req = self._request(request_id)
        if not 0 <= layer < len(self.kv):
            raise ValueError(f"layer {layer} is not in [0, {len(self.kv)})")
        if req.matched_chunks == 0:
            return
        if not req.load_started:
            raise LoadMiss(f"request {request_id!r}: start_load_kv was not called")
        if isinstance(req.loads[layer], _Queued):  # its turn came before room did
            self._start_layer(request_id, layer, self._take_slots(req.matched_chunks, request_id))
        if isinstance(req.loads[layer], _Load):
            self._finish(request_id, layer)
            self._pump(request_id)  # the slots it gave back: the next layers' turn
        if isinstance(req.loads[layer], _Failed):
            raise LoadMiss(req.loads[layer].reason)

    # ---- saves -----------------------------------------------------------------

    def save_kv_layer(self, request_id, layer: int, tokens, block_ids, skip_chunks: int = 0,
                      salt: int = 0):
        """Saves the whole chunks of layer `layer` of a request after the layer has
        written its KV; returns at once (wait_for_save collects). Chunks below
        skip_chunks (loaded from dpukv) are not stored again."""
        if not 0 <= layer < len(self.kv):
            raise ValueError(f"layer {layer} is not in [0, {len(self.kv)})")
        if skip_chunks < 0:
            raise ValueError(f"skip_chunks must be >= 0, not {skip_chunks}")
        step = (request_id, len(tokens), salt)
        layers_keys = self._step_keys.get(step)
        if layers_keys is None:
            layers_keys = native.chunk_keys_layers(self.model, list(tokens), self.chunk_tokens,
                                                   False, self.world_size, self.rank,
                                                   [lay ^ salt for lay in self.layouts])
            self._step_keys[step] = layers_keys
        all_keys = layers_keys[layer]
        block_ids = self._check_blocks(block_ids, len(all_keys), f"save of {request_id!r}")
        keys = all_keys[skip_chunks:]
        kv = self.kv[layer]
        # Slots of the save half are reused only once their stores have landed.
        for first in range(0, len(keys), self.slots):
            batch = keys[first:first + self.slots]
            if self.saving_chunks + len(batch) > self.slots:
                self.wait_for_save()
            # One row gather for the batch's chunks, straight into consecutive slots
            # (two when the ring of slots wraps).
            c0 = skip_chunks + first
            n = len(batch)
            rows = self.parts * self.blocks_per_chunk
            idx = self._rows(block_ids[c0 * self.blocks_per_chunk:], n, kv.device)
            offsets = []
            if self.dev is not None:
                # The gather reads what the compute stream wrote: after it.
                self.dev.compute_done_first(self.dev.stream())
            with self.dev.use(self.dev.stream()) if self.dev else devices._NoStream():
                done = 0
                while done < n:
                    slot = self.slots + (self.save_slot + done) % self.slots
                    run = min(n - done, 2 * self.slots - slot)
                    dst = self.staging_rows[slot * rows:(slot + run) * rows]
                    self._gather(layer, idx, done * rows, (done + run) * rows, dst)
                    offsets += [(slot + i) * self.chunk_bytes for i in range(run)]
                    done += run
                if self.dev is not None:
                    # The agent reads staging: the gather must have landed.
                    self.dev.host_wait(self.dev.record(self.dev.stream()))
            self.save_slot = (self.save_slot + len(batch)) % self.slots
            self.saving_chunks += len(batch)
            try:
                pending = self.client.submit_store(self.staging, batch, offsets,
                                                   [self.chunk_bytes] * len(batch))
            except native.AgentUnavailable:
                self.counters["save_failures"] += len(batch)  # the cache is away
                self.saving_chunks -= len(batch)  # its slots are free again
                continue
            self.saves.append((pending, len(batch)))

    def collect_saves(self, block: bool = False):
        """Counts the stores that have finished, oldest first; without block, only
        those finished already (an engine's step need not wait for the agent: the
        gathers copied the blocks out). Their save slots go back as they are counted."""
        self._step_keys.clear()  # the step's saves are all submitted
        while self.saves:
            pending, n = self.saves[0]
            try:
                if not block and not self.client.poll(pending):
                    return
                status = self.client.wait(pending)
            except native.AgentUnavailable:
                status = []
            ok = sum(1 for s in status if s == "SUCCESS")
            self.counters["saved_chunks"] += ok
            self.counters["save_failures"] += n - ok
            self.saves.pop(0)
            self.saving_chunks -= n

    def wait_for_save(self):
        self.collect_saves(block=True)
