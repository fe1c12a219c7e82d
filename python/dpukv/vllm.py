"""dpukv as a vLLM KV connector: `DpukvConnectorV1`, a KVConnectorBase_V1 over the
connector core (connector.py). A vLLM user loads it with

  --kv-transfer-config '{"kv_connector": "DpukvConnectorV1",
      "kv_connector_module_path": "dpukv.vllm", "kv_role": "kv_both",
      "kv_connector_extra_config": {"dpukv.socket": "/run/dpukv/dpukv.sock"}}'

Runs inside vLLM 0.32.0 (its CPU platform): `vllm serve` with the line above
(ctest vllm.serve), vLLM's LLM engine (vllm.engine), and the contract driver on
vLLM's own types (vllm.contract). There every layer's cache comes as a view
[blocks, heads, block_size, content] (kv_layout BHNC: a block's bytes are one row).
Older vLLMs' [2, blocks, ...] caches (KVConnectorBase_V1 at commit
13f4ad0f55b08ca1d37d1459f50ce950feaeb547) are driven by the same contract test on
stand-ins of vLLM's types (tests/vllm_standins/).

How the two sides split the work (they share only the metadata the scheduler
builds each step):
  scheduler  get_num_new_matched_tokens looks every layer (and every TP rank) up
             in one round trip and pins the hit (a lease, released by
             request_finished, by a new lookup of the same request, or by the
             agent's --pin-timeout-ms); update_state_after_alloc records the
             blocks; build_connector_meta says per request what to load (the hit
             chunks beyond what vLLM's own prefix cache computed) and what to save
             (whole prompt chunks computed by the end of this step, never a
             partial one).
  worker     start_load_kv starts every layer's retrieve; wait_for_layer_load
             finishes one layer (a failed or expired load never raises: its
             blocks go to get_block_ids_with_load_errors, and vLLM recomputes
             them with kv_load_failure_policy "recompute", or ends the request
             with finish reason "error" with "fail", its default); save_kv_layer gathers the layer's chunks into staging and
             stores them; wait_for_save waits for the stores.
Loads are synchronous within the step (get_num_new_matched_tokens answers
load_async=False). Saves copy out of the paged blocks during the step (the gather
into staging) and are stored asynchronously: the agent's stores finish while later
steps run, so a step never waits for them, and request_finished holds no blocks
(it answers (False, None); get_finished has nothing to report). A lookup right
after a save may miss what is still being stored: a miss, never wrong bytes.

kv_connector_extra_config: "dpukv.socket" (default: the client's search path),
"dpukv.chunk_tokens" (256; a multiple of the block size), "dpukv.staging_bytes"
(per worker, both directions; default 512 MiB), "dpukv.model" (the name keys are
made from; default the served model), "dpukv.kv_layout" (NHD or HND, for
[2, num_blocks, ...] caches; default NHD; an MLA model's latent cache is taken as
such), "dpukv.save" (all: every prompt's whole chunks; seen_twice: only prefixes
an earlier request's lookup saw too, so one-off prompts stay out),
"dpukv.lease_ms" (0: none; else a hit looked up longer ago than that is not
loaded but recomputed: the agent's --pin-timeout-ms is the lease the cache keeps,
this one bounds how old a hit the engine accepts), "dpukv.cross_layer" (vLLMs
without cross-layer caches, 0.32 among them, ignore it and the worker says so).

vLLM may ask get_num_new_matched_tokens about a request more than once before it
allocates its blocks: the same question gets the first answer (no second lookup,
pin or sighting) while its lease lasts.

KV events: take_events() turns the agent's event feed (SUBSCRIBE, docs/protocols.md)
into vLLM's BlockStored / BlockRemoved with the engine's block hashes, for the
chunks this scheduler saved or found; `dpukv events` prints the same feed for a
router outside the engine.

Cross-layer caches ("dpukv.cross_layer": true makes prefer_cross_layer_blocks true):
register_cross_layers_kv_cache takes vLLM's one tensor (blocks first, every layer
in a block), sees it layer-major through the attention backend's stride order, and
the core moves each layer's part of a block in place; chunks keep their per-layer
keys, so a cross-layer engine and a per-layer one share the cache.
"""
import hashlib
import logging
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from . import _native as native
from .connector import DpukvConnector, LoadMiss, layer_layouts, lookup, release_pins

logger = logging.getLogger("dpukv.vllm")


@dataclass
class ReqMeta:
    """One request's work in a step: load chunks [load_from, load_to) into its
    blocks, save chunks [save_from, save_to) out of them."""
    req_id: str
    token_ids: list
    block_ids: list
    load_from: int = 0
    load_to: int = 0
    save_from: int = 0
    save_to: int = 0
    lookup_ns: int = 0  # when the scheduler looked the hit up (CLOCK_MONOTONIC, this host)
    salt: int = 0  # the request's extra keys (LoRA, cache_salt), folded into its keys' layout


@dataclass
class DpukvConnectorMetadata(KVConnectorMetadata):
    requests: list = field(default_factory=list)


@dataclass
class _SchedReq:
    tokens: list
    key_tokens: list = None  # tokens the keys are made of (multimodal items mixed in)
    salt: int = 0
    savable: int = 1 << 62  # leading chunks the save policy lets go to dpukv
    block_hashes: list = field(default_factory=list)  # vLLM's, per full block
    keys0: list = field(default_factory=list)  # layer 0, rank 0: the chunk's event key
    local: int = 0  # tokens vLLM's own prefix cache computed (at the lookup)
    hit_chunks: int = 0
    pinned: list = field(default_factory=list)  # key lists pinned by the lookup
    block_ids: list = field(default_factory=list)
    load_from: int = 0
    load_to: int = 0  # > load_from: a load the next metadata carries
    saved: int = 0  # chunks present in dpukv (loaded or saved)
    lookup_ns: int = 0  # when the hit was looked up (its lease began)
    answer: tuple = None  # what get_num_new_matched_tokens answered, until allocated
    lora: tuple = (None, None)  # the request's LoRA adapter (id, name), for its events


def _layer_number(name):
    m = re.search(r"layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def _lora(request):
    """A request's LoRA adapter as vLLM's KV events name it: (id, name), or Nones."""
    lora = getattr(request, "lora_request", None)
    if lora is None:
        return None, None
    return getattr(lora, "lora_int_id", None), getattr(lora, "lora_name", None)


def request_salt(request):
    """What a request's KV depends on besides its tokens and the model, for the
    whole prompt: its LoRA adapter and its cache_salt (vLLM's per-tenant isolation),
    as 64 bits folded into every key's layout (0: neither). A keyed hash
    (BLAKE2b): a tenant cannot choose a salt that lands on another's keys."""
    parts = []
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        parts.append(f"lora\0{getattr(lora, 'lora_name', '')}\0{getattr(lora, 'lora_int_id', '')}")
    salt = getattr(request, "cache_salt", None)
    if salt:
        parts.append(f"salt\0{salt}")
    if not parts:
        return 0
    digest = hashlib.blake2b("\0\0".join(parts).encode(), digest_size=8,
                             person=b"dpukv-extra").digest()
    return int.from_bytes(digest, "little") or 1


def key_tokens(request):
    """The token ids a request's keys are made of: its prompt, with each multimodal
    item's placeholder tokens (the same for every image) replaced by ids drawn
    from the item's own hash, negative so that no prompt has them. The chunk
    holding an item and every chunk after it get keys of their own, as vLLM's
    block hashes do; the chunks before it stay shared."""
    tokens = list(getattr(request, "prompt_token_ids", None) or [])
    for f in getattr(request, "mm_features", None) or []:
        pos, ident = getattr(f, "mm_position", None), getattr(f, "identifier", None)
        if pos is None or ident is None:
            continue
        first, n = int(pos.offset), int(pos.length)
        stream = hashlib.shake_256(b"dpukv-mm\0" + str(ident).encode()).digest(4 * max(n, 0))
        for i in range(max(0, first), min(len(tokens), first + n)):
            v = int.from_bytes(stream[4 * (i - first):4 * (i - first) + 4], "little")
            tokens[i] = -1 - (v & 0x7FFFFFFF)
    return tokens


def _standard_views():
    """Whether this vLLM hands connectors standardized per-layer views [B, H, N, C]
    (its KVCacheLayout, mid-2026 on) rather than [2, B, N, H, D] tensors."""
    try:
        import vllm.v1.kv_cache_layout  # noqa: F401
    except ImportError:
        return False
    return True


def _total_layers(mc, pc):
    """The model's layer count, over every pipeline stage."""
    get = getattr(mc, "get_total_num_hidden_layers", None)
    if get is not None:
        return int(get())
    for cfg in (getattr(mc, "hf_text_config", None), getattr(mc, "hf_config", None)):
        n = getattr(cfg, "num_hidden_layers", None)
        if isinstance(n, int) and n > 0:
            return n
    if int(getattr(pc, "pipeline_parallel_size", 1) or 1) > 1:
        raise ValueError("dpukv: the model's layer count over all pipeline stages is unknown")
    return int(mc.get_num_layers(pc))


def _stage_layers(mc, pc, total):
    """[first, end): the model's layers this process's pipeline stage holds."""
    get = getattr(mc, "get_layers_start_end_indices", None)
    if get is not None and int(getattr(pc, "pipeline_parallel_size", 1) or 1) > 1:
        first, end = get(pc)
        return int(first), int(end)
    return 0, total


_ITEM_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


def _max_load_chunks(staging_bytes, chunk_tokens, kv_heads, head_dim, dtype, kv_layout):
    """What DpukvConnector.max_load_chunks will be for caches of this configuration
    (fp8 and other 1-byte caches: 1 byte an element)."""
    parts = 1 if kv_layout in ("MLA", "BHNC") else 2
    item = _ITEM_BYTES.get(str(dtype), 1)
    chunk_bytes = parts * chunk_tokens * kv_heads * head_dim * item
    return max(staging_bytes // chunk_bytes // 2, 0)


_SIZE_UNITS = {"": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
               "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _count(name, v):
    """A positive whole number (an int, or text of one); anything else is refused
    naming the setting (16.5 is not truncated to 16)."""
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        if not (isinstance(v, float) and v.is_integer()):
            raise ValueError(f"{name} must be a positive whole number, not {v!r}")
    try:
        n = int(v) if not isinstance(v, str) else int(v.strip(), 10)
    except ValueError:
        raise ValueError(f"{name} must be a positive whole number, not {v!r}") from None
    if n <= 0:
        raise ValueError(f"{name} must be a positive whole number, not {v!r}")
    return n


def _size(name, v):
    """Bytes: a whole number, or text with a unit (512M, 1GiB, 64K)."""
    if isinstance(v, str):
        m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", v)
        if m and m.group(2).upper() in _SIZE_UNITS:
            n = int(m.group(1)) * _SIZE_UNITS[m.group(2).upper()]
            if n > 0:
                return n
        raise ValueError(f"{name} must be a size in bytes (a number, or with K, M or G), "
                         f"not {v!r}")
    return _count(name, v)


def _millis(name, v):
    """Milliseconds, 0 or more and finite ("inf" would overflow the lease)."""
    try:
        f = float(v) if not isinstance(v, bool) else float("nan")
    except (TypeError, ValueError):
        f = float("nan")
    if not (f >= 0 and f < 1e12):  # also nan and inf
        raise ValueError(f"{name} must be a number of milliseconds, 0 or more and finite, "
                         f"not {v!r}")
    return f


def _flag(name, v):
    """true/false, 1/0, yes/no, on/off (or a bool); anything else is refused."""
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise ValueError(f"{name} must be true or false (1/0, yes/no, on/off), not {v!r}")


def _extra(config, name, default):
    get = getattr(config, "get_from_extra_config", None)
    if get is not None:
        return get(name, default)
    return (getattr(config, "kv_connector_extra_config", None) or {}).get(name, default)


class DpukvConnectorV1(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        tc = self._kv_transfer_config
        mc, pc = vllm_config.model_config, vllm_config.parallel_config
        self.block_size = vllm_config.cache_config.block_size
        self.chunk_tokens = _count("dpukv.chunk_tokens", _extra(tc, "dpukv.chunk_tokens", 256))
        if self.chunk_tokens <= 0 or self.chunk_tokens % self.block_size:
            raise ValueError(f"dpukv.chunk_tokens ({self.chunk_tokens}) must be a positive "
                             f"multiple of the block size ({self.block_size})")
        self.model_name = str(_extra(tc, "dpukv.model", mc.model))
        self.world_size = int(pc.tensor_parallel_size)
        self.kv_layout = str(_extra(tc, "dpukv.kv_layout", "NHD")).upper()
        if self.kv_layout not in ("NHD", "HND"):
            raise ValueError(f"dpukv.kv_layout must be NHD or HND, not {self.kv_layout!r}")
        if getattr(mc, "use_mla", False):
            self.kv_layout = "MLA"  # one latent cache per layer: [num_blocks, block_size, dim]
        if _standard_views():
            # vLLM hands every layer's cache as one view [blocks, heads, block_size,
            # content] (K and V in the content; MLA: one head), whatever the
            # backend's memory order: dpukv moves a block's bytes as one row.
            self.kv_layout = "BHNC"
        self.staging_bytes = _size("dpukv.staging_bytes",
                                   _extra(tc, "dpukv.staging_bytes", 512 << 20))
        self.lease_ns = int(_millis("dpukv.lease_ms", _extra(tc, "dpukv.lease_ms", 0)) * 1e6)
        self.cross_layer = _flag("dpukv.cross_layer", _extra(tc, "dpukv.cross_layer", False))
        # vLLM 0.32 (model runner V2) has no cross-layer cache for connectors: its
        # base class lost register_cross_layers_kv_cache and nothing calls it. The
        # setting is then said to be ignored, never silently dropped.
        self.cross_layer_ignored = None
        if self.cross_layer and not hasattr(KVConnectorBase_V1,
                                            "register_cross_layers_kv_cache"):
            self.cross_layer = False
            self.cross_layer_ignored = ("this vLLM never hands connectors a cross-layer KV "
                                        "cache (no register_cross_layers_kv_cache): "
                                        "per-layer caches are used")
            if role == KVConnectorRole.WORKER:
                logger.warning("dpukv.cross_layer ignored: %s", self.cross_layer_ignored)
        self.save_policy = str(_extra(tc, "dpukv.save", "all"))
        if self.save_policy not in ("all", "seen_twice"):
            raise ValueError(f"dpukv.save must be all or seen_twice, not {self.save_policy!r}")
        # What the keys are made of, from the configuration: the scheduler has no
        # KV cache to read it from, and the worker checks its tensors against it.
        # Pipeline parallelism: a stage holds some of the model's layers, and each
        # layer's keys carry its index in the model (never its index in the stage:
        # stage 1's first layer is not stage 0's). The scheduler looks every layer
        # of every stage up.
        self.total_layers = _total_layers(mc, pc)
        self.stage_layers = _stage_layers(mc, pc, self.total_layers)
        self.kv_heads = mc.get_num_kv_heads(pc)  # per rank
        self.head_dim = mc.get_head_size()
        dtype = vllm_config.cache_config.cache_dtype
        if dtype in (None, "auto"):
            dtype = str(mc.dtype).replace("torch.", "")
        self.dtype = dtype
        self.key_heads, self.key_dim = self.kv_heads, self.head_dim
        if self.kv_layout == "BHNC":
            mla = getattr(mc, "use_mla", False)
            self.key_heads, self.key_dim = (1, self.head_dim) if mla else (
                self.kv_heads, 2 * self.head_dim)
        self.layouts = layer_layouts(self.dtype, self.total_layers, self.key_heads, self.key_dim,
                                     self.kv_layout)
        self.model = native.model_id(self.model_name)
        socket = str(_extra(tc, "dpukv.socket", ""))
        # An agent that is not there yet is a miss, not an engine that fails to
        # start: the client connects when it appears (its calls say
        # AgentUnavailable until then).
        self.client = native.Client(socket, model=self.model, absent_ok=True)
        if not self.client.connected():
            logger.warning("dpukv: no agent at %s yet: every lookup is a miss until one "
                           "starts", socket or "the default socket")
        # The largest hit a worker's load staging carries (one layer's chunks at a
        # time): the scheduler never reports more.
        self.max_load_chunks = _max_load_chunks(
            self.staging_bytes, self.chunk_tokens, self.key_heads, self.key_dim, self.dtype,
            self.kv_layout)
        if role == KVConnectorRole.SCHEDULER:
            self._reqs = {}
            # KV events: the agent reports chunk keys; a chunk's layer-0, rank-0 key
            # stands for it, mapped to the engine's block hashes of the chunk.
            self._chunk_blocks = OrderedDict()  # prefix hash -> (hashes, parent, tokens)
            self._subscribed = False
            # Layer 0's layouts a chunk's event key may have (one per extra-key salt).
            self._event_layouts = {self.layouts[0]}
            self._subscribe()  # now, so that the first step's saves are heard
            self._seen = OrderedDict()  # seen_twice: prefix hash -> lookups that saw it
        else:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
            self.rank = get_tensor_model_parallel_rank()
            self.core = DpukvConnector(
                self.client, self.model_name, chunk_tokens=self.chunk_tokens,
                staging_bytes=self.staging_bytes,
                world_size=self.world_size, rank=self.rank, kv_layout=self.kv_layout)
            self.layer_index = {}
            self._loading = []  # ReqMeta of this step's loads
            self._load_errors = set()

    # ---- scheduler side ---------------------------------------------------------

    def _keys_all_ranks(self, tokens, salt=0):
        layouts = [l ^ salt for l in self.layouts]
        out = []
        for rank in range(self.world_size):
            out += native.chunk_keys_layers(self.model, tokens, self.chunk_tokens, False,
                                            self.world_size, rank, layouts)
        return out

    def _unpin(self, st):
        release_pins(self.client, st.pinned)
        st.pinned = []

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        tokens = list(request.prompt_token_ids or [])
        old = self._reqs.get(request.request_id)
        # vLLM may ask more than once before it allocates (a step without room for
        # the request asks again the next step) and calls this free of side effects:
        # the same question gets the first answer, with no second lookup, no second
        # pin and no second sighting, while its lease lasts.
        if (old is not None and old.answer is not None and old.local == num_computed_tokens
                and old.tokens == tokens and not self._lease_over(old)):
            return old.answer
        self._reqs.pop(request.request_id, None)
        if old is not None:  # a preempted request, back; or an expired answer
            self._unpin(old)
        st = _SchedReq(tokens=tokens, local=num_computed_tokens,
                       block_hashes=list(getattr(request, "block_hashes", None) or []),
                       lookup_ns=time.monotonic_ns())
        st.key_tokens, st.salt = key_tokens(request), request_salt(request)
        st.lora = _lora(request)
        self._reqs[request.request_id] = st
        keys = self._keys_all_ranks(st.key_tokens, st.salt)
        if st.salt:
            self._event_layouts.add(self.layouts[0] ^ st.salt)
        st.keys0 = keys[0]
        if self.save_policy == "seen_twice":
            # Asked again about the same request: it is not seen a second time.
            st.savable = old.savable if old is not None else self._count_seen(st.keys0)
        # No more than a worker's load staging carries: the rest is recomputed. A
        # refused lookup is a miss, never an engine that stops.
        found = lookup(self.client, keys, len(tokens), self.chunk_tokens, self.max_load_chunks,
                       on_refused=lambda e: logger.warning(
                           "dpukv: lookup of request %s refused (%s): a miss",
                           request.request_id, e))
        st.pinned = found.pinned
        st.hit_chunks = found.chunks
        self._remember(st, 0, found.leading)  # present: removals name them
        new = st.hit_chunks * self.chunk_tokens - num_computed_tokens
        if new <= 0:  # vLLM's own prefix cache has it all
            self._unpin(st)
            st.hit_chunks = 0
            new = 0
        st.answer = (new, False)
        return st.answer

    def _lease_over(self, st):
        return self.lease_ns > 0 and time.monotonic_ns() - st.lookup_ns > self.lease_ns

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        st = self._reqs.get(request.request_id)
        if st is None:
            st = self._reqs[request.request_id] = _SchedReq(
                tokens=list(request.prompt_token_ids or []), key_tokens=key_tokens(request),
                salt=request_salt(request), lora=_lora(request))
        st.block_ids = list(blocks.get_block_ids()[0])
        st.answer = None  # allocated: a later question is a new lookup (a preemption)
        if num_external_tokens > 0:
            # Whole chunks from the one holding vLLM's first uncomputed token (its
            # computed head, if any, is written again with the same bytes).
            # vLLM sets request.num_computed_tokens only after this call: the local
            # hit is the one get_num_new_matched_tokens was told.
            st.load_from = st.local // self.chunk_tokens
            st.load_to = (st.local + num_external_tokens) // self.chunk_tokens
            st.saved = max(st.saved, st.load_to)

    def build_connector_meta(self, scheduler_output):
        meta = DpukvConnectorMetadata()
        steps = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            st = self._reqs.get(new.req_id)
            if st is None:
                continue
            st.block_ids = list(new.block_ids[0])
            self._plan(meta, new.req_id, st, new.num_computed_tokens + steps.get(new.req_id, 0))
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            st = self._reqs.get(req_id)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:  # after a preemption: all of its blocks
                st.block_ids = list(new_ids[0]) if new_ids is not None else []
            elif new_ids is not None:
                st.block_ids += list(new_ids[0])
            self._plan(meta, req_id, st, cached.num_computed_tokens[i] + steps.get(req_id, 0))
        return meta

    def _plan(self, meta, req_id, st, computed_after_step):
        # Save the prompt's whole chunks computed by the end of this step (with
        # seen_twice, only a prefix an earlier request's lookup saw too).
        done = min(computed_after_step, len(st.tokens)) // self.chunk_tokens
        done = min(done, st.savable)
        rm = ReqMeta(req_id, st.key_tokens if st.key_tokens is not None else st.tokens,
                     list(st.block_ids), salt=st.salt)
        if st.load_to > st.load_from:
            rm.load_from, rm.load_to = st.load_from, st.load_to
            st.load_from = st.load_to = 0
            rm.lookup_ns = st.lookup_ns
        if done > st.saved:
            rm.save_from, rm.save_to = st.saved, done
            self._remember(st, st.saved, done)
            st.saved = done
        if rm.load_to > rm.load_from or rm.save_to > rm.save_from:
            meta.requests.append(rm)

    def _count_seen(self, keys0):
        """Counts this lookup of each chunk; returns how many leading chunks have
        now been looked up at least twice (a prefix seen before is worth keeping:
        one-off prompts stay out of the cache)."""
        twice = None
        for i, k in enumerate(keys0):
            n = self._seen.pop(k.prefix_hash, 0) + 1
            self._seen[k.prefix_hash] = n
            if n < 2 and twice is None:
                twice = i
        while len(self._seen) > self.max_event_chunks:
            self._seen.popitem(last=False)
        return len(keys0) if twice is None else twice

    def reset_cache(self):
        """vLLM's reset_prefix_cache(reset_connector=True), as after a weight update:
        the KV dpukv holds for this model came from the old weights, and the keys
        (tokens and the model's name) would find it again. The pins this scheduler
        holds go, then every chunk of the model not being read. False (vLLM says the
        reset failed) where the agent did not answer. Across engines, a new version
        of the weights under its own dpukv.model keeps them apart for good."""
        # A load already planned stays planned: its chunks gone, it fails and is
        # reported for recompute, never skipped.
        for st in self._reqs.values():
            self._unpin(st)
            st.answer = None
        try:
            removed = self.client.clear()
        except (native.AgentUnavailable, RuntimeError) as e:
            logger.warning("dpukv: the cache of %s was not reset (%s)", self.model_name, e)
            return False
        logger.info("dpukv: cache of %s reset: %d chunks removed", self.model_name, removed)
        return True

    def request_finished(self, request, block_ids):
        st = self._reqs.pop(request.request_id, None)
        if st is not None:
            self._unpin(st)
        return False, None

    def _remember(self, st, first, end):
        """The engine's block hashes of chunks [first, end), for their events."""
        bpc = self.chunk_tokens // self.block_size
        if not st.keys0 or len(st.block_hashes) < end * bpc:
            return  # no block hashes (an engine without prefix caching): no events
        for c in range(first, min(end, len(st.keys0))):
            hashes = st.block_hashes[c * bpc:(c + 1) * bpc]
            parent = st.block_hashes[c * bpc - 1] if c else None
            tokens = st.tokens[c * self.chunk_tokens:(c + 1) * self.chunk_tokens]
            self._chunk_blocks[st.keys0[c].prefix_hash] = (hashes, parent, tokens, st.lora)
            self._chunk_blocks.move_to_end(st.keys0[c].prefix_hash)
        while len(self._chunk_blocks) > self.max_event_chunks:
            self._chunk_blocks.popitem(last=False)

    max_event_chunks = 1 << 20  # chunks whose block hashes are remembered for events

    def _subscribe(self):
        if not self._subscribed:
            try:
                self.client.subscribe_events()
                self._subscribed = True
            except (native.AgentUnavailable, AttributeError):
                pass  # away (tried again at the next take_events), or no feed
        return self._subscribed

    def take_events(self):
        """KV events from the agent's feed: BlockStored when a chunk this engine
        saved or found is present in dpukv, BlockRemoved when it left every tier
        (medium "CPU": dpukv's tiers), with the engine's block hashes. A chunk is
        its layer-0, rank-0 key: the other layers and ranks go with it."""
        if not self._subscribe():
            return ()
        try:
            events, lost = self.client.take_events()
        except (native.AgentUnavailable, AttributeError):
            return ()  # the agent is away, or a client without the feed
        if lost:
            logger.warning("dpukv: KV events were lost (a reconnect, or too slow a reader)")
        from vllm.distributed.kv_events import BlockRemoved, BlockStored
        try:  # bytes, or 64-bit integers under VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
            from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash as external
        except ImportError:
            def external(h):
                return h
        out = []
        for key, stored in events:
            if key.rank != 0 or key.layout not in self._event_layouts:
                continue
            info = self._chunk_blocks.get(key.prefix_hash)
            if info is None:
                continue
            hashes, parent, tokens, (lora_id, lora_name) = info
            hashes = [external(h) for h in hashes]  # the engine's own events' form
            parent = external(parent) if parent is not None else None
            # group_idx 0: the KV cache group of the model's attention layers.
            if stored:
                out.append(BlockStored(block_hashes=hashes, parent_block_hash=parent,
                                       token_ids=list(tokens), block_size=self.block_size,
                                       lora_id=lora_id, medium="CPU", lora_name=lora_name,
                                       group_idx=0))
            else:
                out.append(BlockRemoved(block_hashes=hashes, medium="CPU", group_idx=0))
        return out

    # ---- worker side ------------------------------------------------------------

    @property
    def prefer_cross_layer_blocks(self):
        """dpukv.cross_layer true: vLLM gives one cache whose blocks hold every
        layer (register_cross_layers_kv_cache)."""
        return self.cross_layer

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend):
        """One tensor for every layer, in the attention backend's physical order
        (blocks first): seen layer-major through the backend's stride order, each
        layer a strided view whose blocks the core gathers and scatters in place."""
        view = kv_cache
        order = getattr(attn_backend, "get_kv_cache_stride_order", None)
        if order is not None:
            try:
                stride_order = order(include_num_layers_dimension=True)
                view = kv_cache.permute(*[stride_order.index(i) for i in range(len(stride_order))])
            except (NotImplementedError, TypeError):
                view = kv_cache
        first, end = self.stage_layers
        if view.shape[0] != end - first:
            raise ValueError(f"a cross-layer KV cache of shape {tuple(kv_cache.shape)} does not "
                             f"lead with this stage's {end - first} layers")
        self.layer_index = {}  # by the number in the names vLLM calls with (_layer)
        self._register([view[l] for l in range(end - first)], list(range(first, end)),
                       f"{end - first} layers in one")

    def _layer(self, name):
        """The index in this worker's caches of the layer vLLM names."""
        layer = self.layer_index.get(name)
        if layer is None and self.core.kv is not None:
            g = _layer_number(name)
            if g is not None and g in self.core.layer_ids:
                layer = self.layer_index[name] = self.core.layer_ids.index(g)
        return layer

    def register_kv_caches(self, kv_caches):
        """kv_caches: layer name -> [2, num_blocks, block_size, kv_heads, head_dim]
        (NHD; HND: [2, num_blocks, kv_heads, block_size, head_dim]). Layers are
        ordered by the number in their name (model.layers.N...), else as given."""
        names = list(kv_caches)
        numbers = [_layer_number(n) for n in names]
        first, end = self.stage_layers
        if None in numbers:
            # Names without a layer number: this stage's layers, in the order given.
            if len(names) != end - first:
                raise ValueError(f"{len(names)} KV caches named without layer numbers for "
                                 f"this stage's {end - first} layers")
            ids = list(range(first, end))
        else:
            order = sorted(range(len(names)), key=lambda i: numbers[i])
            names = [names[i] for i in order]
            ids = [numbers[i] for i in order]
        self.layer_index = {n: i for i, n in enumerate(names)}
        self._register([kv_caches[n] for n in names], ids, f"{len(names)} layers")

    def _register(self, caches, layer_ids, what):
        bad = [g for g in layer_ids if not self.stage_layers[0] <= g < self.stage_layers[1]]
        if bad:
            raise ValueError(f"KV caches of layers {bad} are not this pipeline stage's layers "
                             f"[{self.stage_layers[0]}, {self.stage_layers[1]}) of "
                             f"{self.total_layers}")
        self.core.register_kv_caches(caches, layer_ids=layer_ids, total_layers=self.total_layers)
        if self.core.layouts != [self.layouts[g] for g in layer_ids]:
            raise ValueError(
                "the KV caches do not match the model configuration the scheduler uses "
                f"({len(caches)} layers of {tuple(caches[0].shape)} {caches[0].dtype}; "
                f"config: {self.total_layers} layers, {self.kv_heads} KV heads of {self.head_dim}, "
                f"{self.dtype})")
        logger.info("dpukv: %s registered, %s path%s", what, self.core.path,
                    (": " + self.core.path_reason) if self.core.path_reason else "")

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        self._loading = []
        bpc = self.chunk_tokens // self.block_size
        now = time.monotonic_ns()
        for rm in meta.requests:
            if rm.load_to <= rm.load_from:
                continue
            # dpukv.lease_ms: a hit looked up longer ago than that is not loaded; its
            # blocks are reported and vLLM recomputes them.
            if self.lease_ns > 0 and now - rm.lookup_ns > self.lease_ns:
                self._load_errors.update(rm.block_ids[rm.load_from * bpc:rm.load_to * bpc])
                continue
            try:
                self.core.prepare_load(rm.req_id, rm.token_ids, rm.block_ids, rm.load_from,
                                       rm.load_to, salt=rm.salt)
                self.core.start_load_kv(rm.req_id)
            except (ValueError, RuntimeError) as e:
                # Never an exception out of the step: the blocks are recomputed.
                logger.warning("dpukv: load of request %s not started (%s)", rm.req_id, e)
                self._load_errors.update(rm.block_ids[rm.load_from * bpc:rm.load_to * bpc])
                self.core.request_finished(rm.req_id)
                continue
            self._loading.append(rm)

    def wait_for_layer_load(self, layer_name):
        layer = self._layer(layer_name)
        if layer is None:
            return  # not a layer with a KV cache registered here
        for rm in self._loading:
            try:
                self.core.wait_for_layer_load(rm.req_id, layer)
            except LoadMiss as e:
                # Never a crash of the step: vLLM recomputes these blocks.
                bpc = self.chunk_tokens // self.block_size
                failed = rm.block_ids[rm.load_from * bpc:rm.load_to * bpc]
                if failed[0] not in self._load_errors:
                    logger.warning("dpukv: load of request %s failed (%s); %d blocks to "
                                   "recompute", rm.req_id, e, len(failed))
                self._load_errors.update(failed)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        layer = self._layer(layer_name)
        if layer is None:
            return
        meta = self._get_connector_metadata()
        for rm in meta.requests:
            if rm.save_to > rm.save_from:
                self.core.save_kv_layer(rm.req_id, layer,
                                        rm.token_ids[:rm.save_to * self.chunk_tokens],
                                        rm.block_ids, skip_chunks=rm.save_from, salt=rm.salt)

    def wait_for_save(self):
        # The step's gathers copied its blocks into staging already: the stores
        # finish while the next steps run (collected here as they do, and waited
        # for when their staging slots are needed or at shutdown).
        self.core.collect_saves()
        for rm in self._loading:  # the step's loads are over: their slots go back
            self.core.request_finished(rm.req_id)
        self._loading = []

    def get_block_ids_with_load_errors(self):
        errors, self._load_errors = self._load_errors, set()
        return errors

    def get_finished(self, finished_req_ids):
        return None, None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        """True: a loaded chunk is scattered into its blocks in wait_for_layer_load,
        and saves gather in save_kv_layer; a full CUDA graph replays without those
        hooks (a hit leaving one prompt token in a decode-only batch would never be
        scattered), so vLLM must capture piecewise graphs around the attention."""
        return True

    def handle_preemptions(self, kv_connector_metadata):
        """Nothing to hold back: a step's loads finish within it (wait_for_save
        gives their slots back) and its saves copied the blocks out in
        save_kv_layer, so a preempted request's blocks may be reused at once."""
        return None

    def shutdown(self):
        if self._role != KVConnectorRole.SCHEDULER and self.core.kv is not None:
            self.core.wait_for_save()  # the last stores land before the client goes
            self.core.close()
        close = getattr(self.client, "close", None)
        if close is not None:
            close()
