"""The adapter's scheduler side: one lookup of every layer and TP rank per
request, pinned (a lease, released by request_finished, by a new lookup of the
same request, or by the agent's pin timeout); the blocks vLLM allocates; per step,
the metadata saying what each worker loads (the hit chunks beyond what vLLM's own
prefix cache computed: a full hit is the whole prompt but its last token, the
prompt's partial last chunk stored under a key of its own) and saves (whole
prompt chunks computed by the end of the step, and the partial last chunk once
the whole prompt is); KV events from the agent's feed with the engine's
block hashes; the seen-twice save policy; a reset of the model's chunks."""
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from .. import _native as native
from ..connector import lookup, release_pins
from .requests import DpukvConnectorMetadata, ReqMeta, _lora, key_tokens, request_salt

logger = logging.getLogger("dpukv.vllm")


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


class VllmScheduler:
    def __init__(self, settings, client):
        s = settings
        self.client = client
        self.chunk_tokens, self.block_size = s.chunk_tokens, s.block_size
        self.world_size, self.model, self.model_name = s.world_size, s.model, s.model_name
        self.layouts, self.save_policy, self.lease_ns = s.layouts, s.save_policy, s.lease_ns
        self.max_load_chunks = s.max_load_chunks
        self._reqs = {}
        # KV events: the agent reports chunk keys; a chunk's layer-0, rank-0 key
        # stands for it, mapped to the engine's block hashes of the chunk.
        self._chunk_blocks = OrderedDict()  # prefix hash -> (hashes, parent, tokens, lora)
        self._subscribed = False
        # Layer 0's layouts a chunk's event key may have (one per extra-key salt).
        self._event_layouts = {self.layouts[0]}
        self._subscribe()  # now, so that the first step's saves are heard
        self._seen = OrderedDict()  # seen_twice: prefix hash -> lookups that saw it

    def _keys_all_ranks(self, tokens, salt=0):
        """Every layer's and rank's keys of the prompt, its partial last chunk's too."""
        layouts = [l ^ salt for l in self.layouts]
        out = []
        for rank in range(self.world_size):
            out += native.chunk_keys_layers(self.model, tokens, self.chunk_tokens, True,
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
                           request.request_id, e), partial=True)
        st.pinned = found.pinned
        st.hit_chunks = found.chunks
        self._remember(st, 0, found.leading)  # present: removals name them
        new = found.tokens - num_computed_tokens
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
            # The last chunk loaded may be the prompt's partial one, or hold the
            # prompt's last token (computed again by vLLM, over the same bytes).
            st.load_from = st.local // self.chunk_tokens
            st.load_to = -(-(st.local + num_external_tokens) // self.chunk_tokens)
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
        # Save the prompt's whole chunks computed by the end of this step, and its
        # partial last chunk once all of it is (with seen_twice, only a prefix an
        # earlier request's lookup saw too).
        done = -(-min(computed_after_step, len(st.tokens)) // self.chunk_tokens)
        if computed_after_step < len(st.tokens):
            done = computed_after_step // self.chunk_tokens
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
        # Chunks with vLLM block hashes: whole ones (a partial chunk's last block
        # has none); none at all in an engine without prefix caching.
        end = min(end, len(st.block_hashes) // bpc)
        if not st.keys0:
            return
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

