"""The worker part: a layer's chunks moved between the agent and the paged blocks,
through staging (staging.py), as rows of the caches' layout (layout.py).

Loads of several requests overlap as an engine's batch makes them: each request's
layer gets its own run of slots in the load half of staging, taken in start_load
and given back when the layer is scattered. A request's layers that do not fit at
once wait their turn and start as earlier layers are scattered (a hit needs one
layer's chunks in staging at a time: max_load_chunks). When the slots run out, the
oldest loads of other requests are finished early (waited for and scattered into
their own blocks, which the engine has already allocated to them) until there is
room: a bounded pool with a wait, never shared bytes.

On a GPU the scatter runs on the connector's side stream and the compute stream
waits for its event, never the host; a save's gather waits for the compute
stream first, and the agent reads staging only after the gather landed.

An agent that is away is a miss, never an error the engine has to handle: a load
that cannot start makes every layer of the request raise LoadMiss, a save that
cannot start is counted as a save failure."""
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from .. import _native as native


class LoadMiss(RuntimeError):
    """A chunk reported as a hit could not be loaded (its lease expired, the agent
    dropped it or went away): recompute those tokens."""


@dataclass
class _Load:
    """One layer's retrieve in flight: n chunks into slots [slot, slot + n), or
    (slot None) straight into the layer's blocks (shared.py)."""
    pending: object
    n: int
    slot: object


class _Queued:
    """A layer whose retrieve waits for room in the load staging."""


@dataclass
class _Failed:
    """A layer that will not load; wait_for_layer_load raises with this reason."""
    reason: str


@dataclass
class LoadRequest:
    """A request's load: chunks [0, chunks) of keys (per layer) into block_ids;
    with tail, the last of them is a prompt's partial chunk of `tail` blocks."""
    keys: list  # per layer: the chunk keys to load
    chunks: int
    block_ids: list = field(default_factory=list)
    tail: int = 0
    pinned: list = field(default_factory=list)  # per layer: keys pinned by a lookup here
    rows_t: object = None  # the chunks' rows in the caches' row view (layout.rows)
    loads: list = field(default_factory=list)  # per layer: _Load, _Queued, _Failed or None
    started: bool = False


class Worker:
    def __init__(self, client, layout, staging, counters, phase_s, shared=None, codec=None):
        """counters, phase_s: the connector's dicts this part adds to
        (loaded_chunks, saved_chunks, save_failures; retrieve_wait, scatter).
        shared: shared.SharedCaches when loads may go into the blocks in place.
        codec: codec.ChunkCodec when chunks are stored encoded: a save gathers
        into private rows and encodes into its slots, a load decodes its slots
        into the blocks."""
        self.client = client
        self.shared = shared
        self.codec = codec
        self.plain_rows = None
        if codec is not None:
            plain = torch.empty(staging.slots * layout.chunk_bytes, dtype=torch.uint8)
            self.plain_rows = layout.staging_rows(plain, staging.slots)
        self.layout = layout
        self.staging = staging
        self.dev = staging.dev
        self.requests = {}  # request id -> LoadRequest
        self.inflight = deque()  # (request_id, layer) of loads in flight, oldest first
        self.saves = []  # (Pending, chunks) of stores not yet waited for
        self.saving_chunks = 0
        self.counters = counters
        self.phase_s = phase_s

    def warm_up(self):
        """Pays here what a fresh process's first load and save would: the device's
        gather and scatter kernels (loaded lazily by CUDA), the index and staging
        copies' memory, the side stream's first event. Block 0's rows of layer 0
        are gathered into a save slot and scattered back unchanged (no request runs
        yet: nothing else writes the cache)."""
        lay, st = self.layout, self.staging
        kv = lay.kv[0]
        n = lay.rows_per_chunk
        rows = lay.rows([0] * lay.blocks_per_chunk, 1, kv.device)
        if self.codec is not None:  # host memory only: the gather's pages
            lay.gather(0, rows, 0, n, self.plain_rows[:n])
            return
        dst = st.slot_rows(st.slots, 1)
        side = self.dev.stream()
        self.dev.compute_done_first(side)
        with self.dev.use(side):
            lay.gather(0, rows, 0, n, dst)
            lay.scatter(0, rows, n, dst.to(kv.device, non_blocking=True))
            ev = self.dev.record(side)
        self.dev.host_wait(ev)

    # ---- loads -----------------------------------------------------------------

    @property
    def max_load_chunks(self):
        """The largest hit this worker loads: one layer's chunks fill at most the
        load half of staging (the layers go through it in rounds)."""
        return self.staging.slots

    def expect(self, request_id, plan):
        """A load planned on the scheduler side (a LoadRequest: keys, chunks, blocks);
        start_load starts it."""
        if request_id in self.requests:
            raise ValueError(f"request {request_id!r} has a load prepared already")
        self.requests[request_id] = plan

    def request(self, request_id):
        req = self.requests.get(request_id)
        if req is None:
            raise ValueError(f"unknown request {request_id!r}: no load planned "
                             "(update_state_after_alloc or prepare_load first)")
        return req

    def forget(self, request_id):
        """The request is over: loads still in flight write into their slots, so
        they are waited for before the slots go back. Its LoadRequest, or None."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        for layer, load in enumerate(req.loads):
            if isinstance(load, _Load):
                self._settle(load)
                req.loads[layer] = None
        self.inflight = deque(x for x in self.inflight if x[0] != request_id)
        return req

    def start_load(self, request_id):
        """Starts the retrieve of every layer that fits in the load staging now (the
        rest start as earlier layers are scattered). Nothing here raises for the
        agent or the hit's size: an agent that is away, or a hit larger than
        max_load_chunks, makes every layer raise LoadMiss when it is waited for."""
        req = self.request(request_id)
        n = req.chunks
        if req.started:
            raise ValueError(f"start_load_kv({request_id!r}) was called already")
        req.started = True
        layers = self.layout.layers
        req.loads = [None] * layers
        if n == 0:
            return
        if n > self.max_load_chunks:
            why = (f"a hit of {n} chunks is larger than the load staging "
                   f"({self.max_load_chunks} chunks of {self.layout.chunk_bytes} bytes); "
                   "raise staging_bytes")
            req.loads = [_Failed(why)] * layers
            return
        req.loads = [_Queued()] * layers
        if self.shared is not None and self._start_in_place(req):
            return
        # The first layer may finish other requests' loads to find room; later ones
        # take only free slots and otherwise wait for their turn (_pump).
        self._start_layer(request_id, 0, self._take_slots(n, request_id))
        self._pump(request_id)

    def _start_in_place(self, req):
        """Every layer's retrieve straight into its blocks, none waiting for staging;
        False (nothing started) when a row lies outside the shared pages."""
        lay = self.layout
        req.rows_t = lay.rows(req.block_ids, req.chunks, lay.kv[0].device, req.tail)
        offsets = [self.shared.offsets(l, req.rows_t) for l in range(lay.layers)]
        if any(o is None for o in offsets):
            return False
        rows = lay.rows_per_chunk
        last = lay.chunk_rows(req.tail)
        for l in range(lay.layers):
            try:
                pending = self.client.submit_retrieve_rows(
                    self.shared.layer_export[l], req.keys[l][:req.chunks], offsets[l],
                    self.shared.row_bytes, rows, last)
            except (native.AgentUnavailable, RuntimeError, ValueError) as e:
                for m in range(l, lay.layers):
                    req.loads[m] = _Failed(f"the load did not start: {e}")
                return True
            req.loads[l] = _Load(pending, req.chunks, None)
        return True

    def _pump(self, request_id):
        """Starts the request's queued layers, in order, while a run of free slots
        is there for them."""
        req = self.requests.get(request_id)
        if req is None:
            return
        for l, load in enumerate(req.loads):
            if not isinstance(load, _Queued):
                continue
            slot = self.staging.take_run(req.chunks)
            if slot is None:
                return
            self._start_layer(request_id, l, slot)

    def _start_layer(self, request_id, l, slot):
        req = self.requests[request_id]
        n = req.chunks
        st = self.staging
        st.ready(slot, n)
        offsets = [st.offset(slot + c) for c in range(n)]
        lengths = [st.chunk_bytes] * n  # encoded: room for the chunk, its header says its size
        if req.tail and self.codec is None:
            lengths[-1] = self.layout.stored_bytes(req.tail)
        try:
            pending = self.client.submit_retrieve(st.buf, req.keys[l][:n], offsets, lengths)
        except (native.AgentUnavailable, RuntimeError) as e:  # away, or refused
            st.give_run(slot, n)
            for m in range(l, self.layout.layers):
                if isinstance(req.loads[m], (_Queued, type(None))):
                    req.loads[m] = _Failed(f"the load did not start: {e}")
            return
        req.loads[l] = _Load(pending, n, slot)
        self.inflight.append((request_id, l))

    def _take_slots(self, n, request_id):
        """The first run of n free load slots; finishes the oldest loads in flight
        (other requests' first) until there is one."""
        while True:
            first = self.staging.take_run(n)
            if first is not None:
                return first
            victim = next((x for x in self.inflight if x[0] != request_id), None)
            if victim is None:
                victim = self.inflight[0] if self.inflight else None
            if victim is None:  # cannot happen: n <= max_load_chunks was checked
                raise RuntimeError("load staging exhausted with nothing in flight")
            self._finish(*victim)

    def _settle(self, load):
        """Waits for a load and gives its slots back; its statuses, or None if the
        agent went away meanwhile."""
        try:
            status = self.client.wait(load.pending)
        except (native.AgentUnavailable, RuntimeError):
            status = None
        if load.slot is not None:
            self.staging.give_run(load.slot, load.n)
        return status

    def _finish(self, request_id, layer):
        """Waits for one layer's load and scatters it into the request's blocks;
        records a failure for wait_for_layer_load to raise."""
        req = self.requests[request_id]
        load = req.loads[layer]
        st = self.staging
        if load.slot is not None:
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
            if load.slot is not None:
                st.give_run(load.slot, load.n)
            req.loads[layer] = _Failed(f"layer {layer}: {status}")
            return
        if load.slot is None:  # the agent wrote the blocks themselves
            req.loads[layer] = None
            self.counters["loaded_chunks"] += load.n
            self.counters["loaded_in_place_chunks"] += load.n
            return
        # One scatter for the layer: its n chunks lie back to back from its first slot.
        n = load.n
        kv = self.layout.kv[layer]
        if req.rows_t is None:
            req.rows_t = self.layout.rows(req.block_ids, req.chunks, kv.device, req.tail)
        if self.codec is not None:
            self._decode(req, layer, load, t1)
            return
        # A partial last chunk's rows are the first of its slot.
        k = (n - 1) * self.layout.rows_per_chunk + self.layout.chunk_rows(req.tail)
        # On the connector's stream (the host-pinned path's copy to the device
        # first); the compute stream waits for its event, and the slots are written
        # again only after it (Staging.ready). On the host: one row scatter, the
        # bytes moving once, staging to blocks.
        side = self.dev.stream()
        with self.dev.use(side):
            src = st.slot_rows(load.slot, n)[:k].to(kv.device, non_blocking=True)
            self.layout.scatter(layer, req.rows_t, k, src)
            ev = self.dev.record(side)
        self.dev.compute_wait(ev)
        st.read_until(load.slot, n, ev)
        st.give_run(load.slot, n)
        req.loads[layer] = None
        self.counters["loaded_chunks"] += n
        self.phase_s["scatter"] += time.perf_counter() - t1

    def _decode(self, req, layer, load, t1):
        """The layer's encoded chunks, from their slots into the request's blocks
        (host memory: the slots are free again once this returns)."""
        lay, st = self.layout, self.staging
        status = self.codec.decode(st.buf.data_ptr, [st.offset(load.slot + c) for c in range(load.n)],
                                   lay.row_addresses(layer, req.rows_t), lay.rows_per_chunk,
                                   lay.chunk_rows(req.tail))
        st.give_run(load.slot, load.n)
        bad = [i for i, s in enumerate(status) if s != "SUCCESS"]
        if bad:
            req.loads[layer] = _Failed(f"layer {layer}: chunk {bad[0]} does not decode "
                                       f"({status[bad[0]]}): recomputed")
            self.counters["decode_failures"] += len(bad)
        else:
            req.loads[layer] = None
            self.counters["loaded_chunks"] += load.n
        self.phase_s["scatter"] += time.perf_counter() - t1

    def wait_for_layer_load(self, request_id, layer: int):
        req = self.request(request_id)
        if not 0 <= layer < self.layout.layers:
            raise ValueError(f"layer {layer} is not in [0, {self.layout.layers})")
        if req.chunks == 0:
            return
        if not req.started:
            raise LoadMiss(f"request {request_id!r}: start_load_kv was not called")
        if isinstance(req.loads[layer], _Queued):  # its turn came before room did
            self._start_layer(request_id, layer, self._take_slots(req.chunks, request_id))
        if isinstance(req.loads[layer], _Load):
            self._finish(request_id, layer)
            self._pump(request_id)  # the slots it gave back: the next layers' turn
        if isinstance(req.loads[layer], _Failed):
            raise LoadMiss(req.loads[layer].reason)

    # ---- saves -----------------------------------------------------------------

    def save(self, request_id, layer, keys, block_ids, first_chunk, tail=0):
        """Stores `keys`, the chunks from first_chunk on of a layer whose blocks are
        block_ids (the request's whole table, checked); with tail, the last key is
        a prompt's partial chunk of `tail` blocks. Returns at once."""
        lay, st = self.layout, self.staging
        kv = lay.kv[layer]
        rows = lay.rows_per_chunk
        # Slots of the save half are reused only once their stores have landed.
        for first in range(0, len(keys), st.slots):
            batch = keys[first:first + st.slots]
            if self.saving_chunks + len(batch) > st.slots:
                self.wait_for_save()
            # One row gather for the batch's chunks, straight into consecutive slots
            # (two runs when the ring of slots wraps); a partial chunk fills the
            # first rows of its slot.
            c0 = first_chunk + first
            n = len(batch)
            t = tail if first + n == len(keys) else 0
            idx = lay.rows(block_ids[c0 * lay.blocks_per_chunk:], n, kv.device, t)
            total = (n - 1) * rows + lay.chunk_rows(t)
            if self.codec is not None:
                # n stays the slots the batch took: a chunk that did not encode is
                # a failure when the batch is collected.
                batch, offsets, lengths = self._encode(layer, idx, total, batch, t)
                if not batch:
                    self.counters["save_failures"] += n
                    continue
            else:
                offsets = []
                side = self.dev.stream()
                self.dev.compute_done_first(side)  # the gather reads what compute wrote
                with self.dev.use(side):
                    done = 0
                    for slot, run in st.save_runs(n):
                        a, b = done * rows, min((done + run) * rows, total)
                        lay.gather(layer, idx, a, b, st.slot_rows(slot, run)[:b - a])
                        offsets += [st.offset(slot + i) for i in range(run)]
                        done += run
                    # The agent reads staging: the gather must have landed.
                    self.dev.host_wait(self.dev.record(side))
                lengths = [st.chunk_bytes] * n
                if t:
                    lengths[-1] = lay.stored_bytes(t)
            self.saving_chunks += n
            try:
                pending = self.client.submit_store(st.buf, batch, offsets, lengths)
            except native.AgentUnavailable:
                self.counters["save_failures"] += n  # the cache is away
                self.saving_chunks -= n  # its slots are free again
                continue
            self.saves.append((pending, n))

    def _encode(self, layer, idx, total, keys, tail):
        """A batch's rows gathered (host memory, one pass), then each chunk encoded
        into its save slot: the keys, offsets and lengths to store. A chunk that
        does not encode (NaN or infinity in its KV) is left out."""
        lay, st, codec = self.layout, self.staging, self.codec
        rows = lay.rows_per_chunk
        plain = self.plain_rows[:total]
        lay.gather(layer, idx, 0, total, plain)
        base = plain.data_ptr()
        out_keys, offsets, lengths = [], [], []
        slots = [slot + i for slot, run in st.save_runs(len(keys)) for i in range(run)]
        for c, key in enumerate(keys):
            r = lay.chunk_rows(tail) if c + 1 == len(keys) else rows
            off = st.offset(slots[c])
            try:
                length = codec.encode(base + c * rows * codec.row_bytes, r,
                                      st.buf.data_ptr + off, st.chunk_bytes)
            except ValueError:
                continue
            out_keys.append(key)
            offsets.append(off)
            lengths.append(length)
        self.counters["encoded_bytes"] += sum(lengths)
        return out_keys, offsets, lengths

    def collect_saves(self, block: bool = False):
        """Counts the stores that have finished, oldest first; without block, only
        those finished already (an engine's step need not wait for the agent: the
        gathers copied the blocks out). Their save slots go back as they are counted."""
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
