"""The client over the C ABI (libdpukv_client.so) with ctypes: what the connector
and the benchmarks use of `_dpukv`, for a Python that module was not built for
(a GPU machine's own Python, which has torch but no Debian packages and no
compiler). `import dpukv` takes it when `_dpukv` is not importable; the library
is found through DPUKV_CLIENT_LIB, else the loader's path (LD_LIBRARY_PATH).

Same names and behaviour as the compiled module for that subset: status names
per entry, AgentUnavailable when the agent did not answer, GpuPathUnavailable
when there is no GPU path."""
import ctypes
import json
import os

__all__ = ["AgentUnavailable", "GpuPathUnavailable", "ChunkKey", "Client", "Staging", "Pending",
           "model_id", "kv_layout_fingerprint", "chunk_keys", "chunk_keys_layers",
           "kv_encode_bound", "kv_encode", "kv_decode_rows"]


class AgentUnavailable(ConnectionError):
    """The agent did not answer (gone, restarting, too slow)."""


class GpuPathUnavailable(RuntimeError):
    """No GPU path (no CUDA driver here, none in the agent, a GPU it does not see)."""


class ChunkKey(ctypes.Structure):
    _fields_ = [("model", ctypes.c_uint64), ("world_size", ctypes.c_uint32),
                ("rank", ctypes.c_uint32), ("layout", ctypes.c_uint64),
                ("prefix_hash", ctypes.c_uint64)]


class _Event(ctypes.Structure):
    _fields_ = [("key", ChunkKey), ("stored", ctypes.c_uint8), ("reserved", ctypes.c_uint8 * 3),
                ("tenant", ctypes.c_uint32)]


_LIB = os.environ.get("DPUKV_CLIENT_LIB", "libdpukv_client.so.0")
try:
    _lib = ctypes.CDLL(_LIB)
except OSError as _e:
    raise ImportError(
        f"dpukv: the client library {_LIB} could not be loaded ({_e}). The package is the "
        "Python side only: install dpukv's client (libdpukv_client.so.0, `cmake --install` "
        "of a build, or the dpukv package of your distribution), or set DPUKV_CLIENT_LIB to "
        "the library's path") from None
_u64, _u32, _int, _p = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p
_KEYS = ctypes.POINTER(ChunkKey)
_U64S = ctypes.POINTER(_u64)
_INTS = ctypes.POINTER(_int)
for name, res, args in [
    ("dpukv_connect", _int, [ctypes.c_char_p, _u64, ctypes.POINTER(_p)]),
    ("dpukv_connect_absent_ok", _int, [ctypes.c_char_p, _u64, ctypes.POINTER(_p)]),
    ("dpukv_connected", _int, [_p]),
    ("dpukv_last_connect_error", ctypes.c_char_p, []),
    ("dpukv_close", None, [_p]),
    ("dpukv_status_name", ctypes.c_char_p, [_int]),
    ("dpukv_alloc_staging", _int, [_p, ctypes.c_size_t, ctypes.POINTER(_p), _U64S]),
    ("dpukv_export_gpu", _int, [_p, _u64, ctypes.c_size_t, _int, _U64S]),
    ("dpukv_agent_gpu", _int, [_p]),
    ("dpukv_share_memory", _int, [_p, _p, ctypes.c_size_t, ctypes.POINTER(_p), _U64S, _U64S]),
    ("dpukv_agent_rows", _int, [_p]),
    ("dpukv_submit_retrieve_rows", _int, [_p, _u64, _KEYS, _u32, _U64S, _u32, _u32, _u32, _INTS,
                                          _U64S]),
    ("dpukv_release_gpu", _int, [_p, _u64]),
    ("dpukv_lookup_status", _int, [_p, _KEYS, _u32, _int, ctypes.POINTER(_u32)]),
    ("dpukv_lookup_layers", _int, [_p, _KEYS, _u32, _u32, _int, ctypes.POINTER(_u32)]),
    ("dpukv_unpin", _int, [_p, _KEYS, _u32]),
    ("dpukv_remove", _int, [_p, _KEYS, _u32, _INTS]),
    ("dpukv_clear", _int, [_p, _U64S]),
    ("dpukv_stats_json", _int, [_p, ctypes.c_char_p, ctypes.c_size_t,
                                ctypes.POINTER(ctypes.c_size_t)]),
    ("dpukv_store", _int, [_p, _u64, _KEYS, _U64S, _U64S, _u32, _INTS]),
    ("dpukv_retrieve", _int, [_p, _u64, _KEYS, _U64S, _U64S, _u32, _INTS]),
    ("dpukv_submit_store", _int, [_p, _u64, _KEYS, _U64S, _U64S, _u32, _INTS, _U64S]),
    ("dpukv_submit_retrieve", _int, [_p, _u64, _KEYS, _U64S, _U64S, _u32, _INTS, _U64S]),
    ("dpukv_wait", _int, [_p, _u64]),
    ("dpukv_poll", _int, [_p, _u64, ctypes.POINTER(_int)]),
    ("dpukv_contains", _int, [_p, _KEYS, _u32, _INTS]),
    ("dpukv_prefetch", _int, [_p, _KEYS, _u32, _INTS]),
    ("dpukv_max_staging_bytes", _u64, [_p]),
    ("dpukv_keys_from_block_ids", _u32, [_u64, _U64S, _u32, _KEYS]),
    ("dpukv_subscribe_events", _int, [_p]),
    ("dpukv_take_events", _int, [_p, ctypes.POINTER(_Event), _u32, ctypes.POINTER(_u32),
                                 ctypes.POINTER(_int)]),
    ("dpukv_chunk_keys", _u32, [_u64, _u32, _u32, _u64, ctypes.POINTER(ctypes.c_int32),
                                ctypes.c_size_t, _u32, _int, _KEYS, _u32]),
    ("dpukv_chunk_keys_layers", _u32, [_u64, _u32, _u32, ctypes.POINTER(_u64), _u32,
                                       ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t, _u32,
                                       _int, _KEYS, _u32]),
    ("dpukv_model_id", _u64, [ctypes.c_char_p]),
    ("dpukv_kv_layout_fingerprint", _u64, [ctypes.c_char_p, _u32, _u32, _u32]),
    ("dpukv_kv_encode_bound", ctypes.c_size_t, [_int, _u32, _u32, _u32, _u32, ctypes.c_size_t]),
    ("dpukv_kv_encode", _int, [_int, _int, _u32, _u32, _u32, _u32, _p, ctypes.c_size_t, _p,
                               ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    ("dpukv_kv_decode_rows", _int, [_p, _U64S, _U64S, _u32, _p, _u32, _u32, _u64, _INTS]),
]:
    f = getattr(_lib, name)
    f.restype, f.argtypes = res, args


def _name(rc):
    return _lib.dpukv_status_name(rc).decode()


_UNAVAILABLE = {"CONNECTION_RESET", "TIMEOUT", "NOT_FOUND", "SHUTDOWN"}


def _check(rc, what):
    if rc == 0:
        return
    name = _name(rc)
    if name in _UNAVAILABLE:
        raise AgentUnavailable(f"{what}: {name}")
    raise RuntimeError(f"{what}: {name}")


def model_id(name):
    return _lib.dpukv_model_id(name.encode())


def kv_layout_fingerprint(dtype, layers, kv_heads, head_dim):
    return _lib.dpukv_kv_layout_fingerprint(dtype.encode(), layers, kv_heads, head_dim)


def chunk_keys(model, tokens, chunk_tokens=256, include_partial=False, world_size=1, rank=0,
               layout=0):
    toks = (ctypes.c_int32 * len(tokens))(*tokens)
    cap = len(tokens) // max(chunk_tokens, 1) + 1
    out = (ChunkKey * cap)()
    n = _lib.dpukv_chunk_keys(model, world_size, rank, layout, toks, len(tokens), chunk_tokens,
                              int(include_partial), out, cap)
    return [out[i] for i in range(n)]


def chunk_keys_layers(model, tokens, chunk_tokens, include_partial, world_size, rank, layouts):
    if not layouts:
        return []
    toks = (ctypes.c_int32 * len(tokens))(*tokens)
    cap = len(tokens) // max(chunk_tokens, 1) + 1
    lays = (ctypes.c_uint64 * len(layouts))(*layouts)
    out = (ChunkKey * (cap * len(layouts)))()
    n = _lib.dpukv_chunk_keys_layers(model, world_size, rank, lays, len(layouts), toks,
                                     len(tokens), chunk_tokens, int(include_partial), out, cap)
    return [[out[l * cap + i] for i in range(n)] for l in range(len(layouts))]


def kv_encode_bound(codec, slabs, tokens, channels, flags, nbytes):
    """The largest encoding of nbytes (0 for an unknown codec or flags)."""
    return _lib.dpukv_kv_encode_bound(codec, slabs, tokens, channels, flags, nbytes)


def kv_encode(codec, dtype, slabs, tokens, channels, flags, src, nbytes, dst, cap):
    """Encodes nbytes at address src into dst (cap bytes); returns the encoded length.
    flags: 1 (values per token) when the slabs alternate keys and values."""
    out = ctypes.c_size_t()
    rc = _lib.dpukv_kv_encode(codec, dtype, slabs, tokens, channels, flags, src, nbytes, dst,
                              cap, ctypes.byref(out))
    if rc != 0:
        raise ValueError(f"kv_encode: {_name(rc)}")
    return out.value


def kv_decode_rows(base, offsets, caps, rows, rows_per_chunk, last_rows, row_bytes):
    """Decodes the chunks at base + offsets (slots of caps bytes) into rows (the address
    of an array of row addresses); a status name per chunk."""
    if len(offsets) != len(caps):
        raise ValueError("kv_decode_rows: offsets and caps differ in length")
    n = len(offsets)
    per = (_int * max(n, 1))()
    _lib.dpukv_kv_decode_rows(base, (_u64 * max(n, 1))(*offsets), (_u64 * max(n, 1))(*caps), n,
                              rows, rows_per_chunk, last_rows, row_bytes, per)
    return [_name(per[i]) for i in range(n)]


def keys_from_block_ids(model, ids):
    """Keys from prefix-chained block ids (vLLM block hashes, trace ids)."""
    out = (ChunkKey * len(ids))()
    _lib.dpukv_keys_from_block_ids(model, (_u64 * len(ids))(*ids), len(ids), out)
    return list(out)


def _keys(keys):
    return (ChunkKey * len(keys))(*keys)


class Staging:
    """GPU memory exported to the agent (host staging is _host_staging's)."""

    def __init__(self, sid, size, device_ptr):
        self.id, self.size, self.device_ptr, self.gpu = sid, size, device_ptr, True


def _host_staging(sid, addr, size):
    """Host staging: a ctypes array over the shared memory (memoryview() takes it,
    as it takes the compiled module's Staging), with the same attributes."""
    cls = type("HostStaging", (ctypes.c_uint8 * size,), {})
    s = cls.from_address(addr)
    s.id, s.size, s.device_ptr, s.gpu, s.data_ptr = sid, size, 0, False, addr
    return s


class Pending:
    def __init__(self, ticket, st, n):
        self.ticket, self.st, self.n, self.result = ticket, st, n, None


class Client:
    def __init__(self, socket="", model=0, connect_timeout_ms=2000, absent_ok=False):
        del connect_timeout_ms  # the C ABI uses the library's default
        self._c = ctypes.c_void_p()
        fn = _lib.dpukv_connect_absent_ok if absent_ok else _lib.dpukv_connect
        rc = fn(socket.encode() if socket else None, model, ctypes.byref(self._c))
        if rc != 0:
            why = "connect: " + (_lib.dpukv_last_connect_error() or b"").decode()
            if _name(rc) == "FULL":  # a full agent is away for this client: recompute
                raise AgentUnavailable(f"{why}: FULL")
            _check(rc, why)

    def connected(self):
        return bool(self._c) and _lib.dpukv_connected(self._c) == 1

    def close(self):
        if self._c:
            _lib.dpukv_close(self._c)
            self._c = ctypes.c_void_p()

    def __del__(self):
        self.close()

    def alloc_staging(self, nbytes):
        data, sid = ctypes.c_void_p(), _u64()
        _check(_lib.dpukv_alloc_staging(self._c, nbytes, ctypes.byref(data), ctypes.byref(sid)),
               "alloc_staging")
        return _host_staging(sid.value, data.value, nbytes)

    def export_gpu(self, device_ptr, nbytes, device=0):
        sid = _u64()
        rc = _lib.dpukv_export_gpu(self._c, device_ptr, nbytes, device, ctypes.byref(sid))
        if rc != 0 and _name(rc) in ("NOT_SUPPORTED", "NOT_PERMITTED"):
            raise GpuPathUnavailable(f"export_gpu: {_name(rc)}")
        if rc != 0 and _name(rc) == "INVALID_VALUE":
            raise ValueError("export_gpu: INVALID_VALUE (not exportable device memory)")
        _check(rc, "export_gpu")
        return Staging(sid.value, nbytes, device_ptr)

    def release_gpu(self, staging):
        _check(_lib.dpukv_release_gpu(self._c, staging.id), "release_gpu")

    @property
    def agent_gpu(self):
        return bool(_lib.dpukv_agent_gpu(self._c))

    def share_memory(self, addr, nbytes):
        data, size, sid = ctypes.c_void_p(), _u64(), _u64()
        _check(_lib.dpukv_share_memory(self._c, addr, nbytes, ctypes.byref(data),
                                       ctypes.byref(size), ctypes.byref(sid)), "share_memory")
        return _host_staging(sid.value, data.value, size.value)

    @property
    def agent_rows(self):
        return bool(_lib.dpukv_agent_rows(self._c))

    def submit_retrieve_rows(self, staging, keys, row_offsets, row_bytes, rows_per_chunk,
                             last_rows):
        m = memoryview(row_offsets)
        n = len(keys)
        if m.itemsize != 8 or m.ndim != 1 or not m.c_contiguous:
            raise ValueError("row_offsets must be a contiguous array of 64-bit offsets")
        if n == 0 or len(m) != (n - 1) * rows_per_chunk + last_rows:
            raise ValueError("row_offsets must hold (len(keys) - 1) * rows_per_chunk + "
                             "last_rows offsets")
        rows = (_u64 * len(m)).from_buffer_copy(m.cast("B"))
        st, ticket = (_int * n)(), _u64()
        _check(_lib.dpukv_submit_retrieve_rows(self._c, staging.id, _keys(keys), n, rows,
                                               row_bytes, rows_per_chunk, last_rows, st,
                                               ctypes.byref(ticket)), "submit_retrieve_rows")
        return Pending(ticket.value, st, n)

    def lookup(self, keys, pin=False):
        hits = _u32()
        _check(_lib.dpukv_lookup_status(self._c, _keys(keys), len(keys), int(pin), ctypes.byref(hits)),
               "lookup")
        return hits.value

    def subscribe_events(self):
        _check(_lib.dpukv_subscribe_events(self._c), "subscribe_events")

    def take_events(self):
        out, lost_any = [], False
        buf = (_Event * 1024)()
        while True:
            n, lost = _u32(), _int()
            rc = _lib.dpukv_take_events(self._c, buf, len(buf), ctypes.byref(n), ctypes.byref(lost))
            if rc != 0 and _name(rc) == "BAD_STATE":
                raise RuntimeError("take_events: subscribe first")
            _check(rc, "take_events")
            lost_any = lost_any or bool(lost.value)
            out += [(ChunkKey.from_buffer_copy(buf[i].key), bool(buf[i].stored))
                    for i in range(n.value)]
            if n.value < len(buf):
                return out, lost_any

    def lookup_layers(self, layers, pin=False):
        per = len(layers[0]) if layers else 0
        if any(len(l) != per for l in layers):
            raise ValueError("layers differ in key count")
        if not layers:
            return []
        hits = (_u32 * len(layers))()
        flat = [k for l in layers for k in l]
        _check(_lib.dpukv_lookup_layers(self._c, _keys(flat), per, len(layers), int(pin), hits),
               "lookup_layers")
        return list(hits)

    def unpin(self, keys):
        _check(_lib.dpukv_unpin(self._c, _keys(keys), len(keys)), "unpin")

    def _per_key(self, fn, keys, what):
        st = (_int * len(keys))()
        rc = fn(self._c, _keys(keys), len(keys), st)
        if rc != 0 and _name(rc) in _UNAVAILABLE:
            _check(rc, what)
        return [_name(x) for x in st]

    def remove(self, keys):
        """Drops chunks (BAD_STATE for one in use); a status name per key."""
        return self._per_key(_lib.dpukv_remove, keys, "remove")

    def contains(self, keys):
        """SUCCESS or NOT_FOUND per key."""
        return self._per_key(_lib.dpukv_contains, keys, "contains")

    def prefetch(self, keys):
        """Brings disk-only chunks into memory ahead of a retrieve."""
        return self._per_key(_lib.dpukv_prefetch, keys, "prefetch")

    @property
    def max_staging_bytes(self):
        return _lib.dpukv_max_staging_bytes(self._c)

    def clear(self):
        n = _u64()
        _check(_lib.dpukv_clear(self._c, ctypes.byref(n)), "clear")
        return n.value

    def stats(self):
        need = ctypes.c_size_t()
        buf = ctypes.create_string_buffer(1 << 16)
        rc = _lib.dpukv_stats_json(self._c, buf, len(buf), ctypes.byref(need))
        if rc != 0 and _name(rc) == "TOO_BIG":
            buf = ctypes.create_string_buffer(need.value + 1)
            rc = _lib.dpukv_stats_json(self._c, buf, len(buf), ctypes.byref(need))
        _check(rc, "stats")
        json.loads(buf.value)  # what the compiled module returns: the text, checked
        return buf.value.decode()

    def _io(self, fn, staging, keys, offsets, lengths, what):
        n = len(keys)
        if len(offsets) != n or len(lengths) != n:
            raise ValueError("keys, offsets and lengths differ in length")
        st = (_int * n)()
        rc = fn(self._c, staging.id, _keys(keys), (_u64 * n)(*offsets), (_u64 * n)(*lengths), n,
                st)
        if rc != 0 and _name(rc) in _UNAVAILABLE:
            _check(rc, what)
        return [_name(x) for x in st]

    def store(self, staging, keys, offsets, lengths):
        return self._io(_lib.dpukv_store, staging, keys, offsets, lengths, "store")

    def retrieve(self, staging, keys, offsets, lengths):
        return self._io(_lib.dpukv_retrieve, staging, keys, offsets, lengths, "retrieve")

    def _submit(self, fn, staging, keys, offsets, lengths, what):
        n = len(keys)
        if len(offsets) != n or len(lengths) != n:
            raise ValueError("keys, offsets and lengths differ in length")
        st, ticket = (_int * n)(), _u64()
        _check(fn(self._c, staging.id, _keys(keys), (_u64 * n)(*offsets), (_u64 * n)(*lengths),
                  n, st, ctypes.byref(ticket)), what)
        return Pending(ticket.value, st, n)

    def submit_store(self, staging, keys, offsets, lengths):
        return self._submit(_lib.dpukv_submit_store, staging, keys, offsets, lengths,
                            "submit_store")

    def submit_retrieve(self, staging, keys, offsets, lengths):
        return self._submit(_lib.dpukv_submit_retrieve, staging, keys, offsets, lengths,
                            "submit_retrieve")

    def poll(self, pending):
        """True once the operation has finished (never blocks); wait() then returns
        its statuses at once."""
        if pending.result is not None:
            return True
        done = _int()
        rc = _lib.dpukv_poll(self._c, pending.ticket, ctypes.byref(done))
        if not done.value:
            if _name(rc) not in ("IN_PROGRESS", "SUCCESS"):
                _check(rc, "poll")
            return False
        pending.result = [_name(x) for x in pending.st]
        return True

    def wait(self, pending):
        if pending.result is None:
            rc = _lib.dpukv_wait(self._c, pending.ticket)
            pending.result = [_name(x) for x in pending.st]
            if rc != 0 and _name(rc) in ("TIMEOUT", "CONNECTION_RESET"):
                _check(rc, "wait")
        return pending.result
