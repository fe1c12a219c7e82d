"""The worker's staging: memory both the agent and this process reach, cut into
chunk slots, and the device path it lies on.

Path (`path`): "gpu" when the KV caches are CUDA tensors and the agent has a GPU
path: staging is GPU memory exported to the agent, whose CUDA engine copies each
layer's chunks between its arena and that staging (the offload side owning the
copy). "host-pinned": the agent cannot reach this GPU; staging is host shared
memory registered with the driver, so layer l's host-to-device copy runs while the
agent copies layer l+1. "host": CPU tensors (device.HostDevice: nothing
asynchronous).

Two halves: loads and saves run at the same time. The load half's slots are taken
in runs (one layer's chunks lie back to back) and given back when the layer is
scattered; the save half is a ring whose slots are written again only once their
stores landed. Per slot, the event after which its bytes were last read on the
device (a scatter): the agent may write the slot again only after it."""
import weakref

import torch

from .. import device as devices


class Staging:
    def __init__(self, client, device, kv_caches, layout, staging_bytes, slot_bytes=None):
        """device: a device.py backend, "host" for host staging always, or None
        (the caches' own: TorchCuda for CUDA tensors, HostDevice for CPU ones).
        slot_bytes: a slot's size when chunks are stored encoded (codec.py: their
        largest encoding); they then have no rows view here (the codec reads and
        writes the blocks)."""
        self.chunk_bytes = slot_bytes or layout.chunk_bytes
        self.slots = staging_bytes // self.chunk_bytes // 2
        if self.slots < 1:
            raise ValueError(f"staging_bytes ({staging_bytes}) must hold at least two "
                             f"chunks of {self.chunk_bytes} bytes (one to load, one to save)")
        self.path_reason = ""
        self._unpin = None  # gives the host staging's page lock back (host-pinned)
        self._open(client, device, kv_caches, 2 * self.slots * self.chunk_bytes)
        self.rows = layout.staging_rows(self.u8, 2 * self.slots) if slot_bytes is None else None
        self.rows_per_chunk = layout.rows_per_chunk
        self.slot_events = [None] * (2 * self.slots)
        self.load_free = [True] * self.slots  # the load half's slots
        self.save_next = 0  # the save ring's next slot, in [0, slots)

    def _open(self, client, device, kv_caches, nbytes):
        self.dev = devices.HOST if device == "host" else (device or devices.for_tensors(kv_caches))
        if self.dev is not devices.HOST:
            got, why = devices.export_staging(client, self.dev, nbytes)
            if got is not None:
                self.buf, self.u8 = got
                self.path = "gpu"
                return
            self.path_reason = why
        self.buf = client.alloc_staging(nbytes)
        self.u8 = torch.frombuffer(memoryview(self.buf), dtype=torch.uint8)
        if self.dev is not devices.HOST and self.dev.pin(self.buf):
            self.path = "host-pinned"
            # Also when the connector is collected without close(): a lock left on
            # staging the client unmaps later keeps a later mapping at that address
            # from being pinned (the driver: already registered), and its connector
            # would fall back to unpinned copies.
            self._unpin = weakref.finalize(self, self.dev.unpin, self.buf)
        else:
            self.path = "host"
            self.dev = devices.HOST  # nothing asynchronous to order: plain host copies

    def close(self):
        if self._unpin is not None:
            self._unpin()

    def offset(self, slot):
        return slot * self.chunk_bytes

    def slot_rows(self, slot, n):
        """Staging rows of slots [slot, slot + n)."""
        return self.rows[slot * self.rows_per_chunk:(slot + n) * self.rows_per_chunk]

    def ready(self, first, n):
        """Before the agent writes slots again: the device reads of them are done."""
        for j in range(first, first + n):
            if self.slot_events[j] is not None:
                self.dev.host_wait(self.slot_events[j])
                self.slot_events[j] = None

    def read_until(self, first, n, event):
        """The device reads slots [first, first + n) until event."""
        for j in range(first, first + n):
            self.slot_events[j] = event

    # ---- the load half

    def take_run(self, n):
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

    def give_run(self, slot, n):
        for j in range(slot, slot + n):
            self.load_free[j] = True

    # ---- the save half

    def save_runs(self, n):
        """n save slots from the ring's next one: [(slot, run)], two runs when the
        ring wraps. The caller must have waited for the stores that used them."""
        out, done = [], 0
        while done < n:
            slot = self.slots + (self.save_next + done) % self.slots
            run = min(n - done, 2 * self.slots - slot)
            out.append((slot, run))
            done += run
        self.save_next = (self.save_next + n) % self.slots
        return out
