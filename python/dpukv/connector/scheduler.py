"""The scheduler part: what dpukv holds of a prompt, found in one round trip and
pinned so that a hit is still there when it is loaded.

A lookup asks for every layer's keys at once (one message per layer set, one
answer); the hit is the number of leading chunks every layer has. A full hit
still leaves the last chunk to compute (an engine needs at least one token of the
prompt to produce logits). An agent that is away is a miss: the lookup answers 0
and the engine recomputes. Leases: the pins hold until release_pins (the request
finished) or the agent's pin timeout; a pin that expired before the load turns
the load into a miss (LoadMiss), never into stale bytes.

lookup() is the one lookup both the engine-independent connector (core.py) and
vLLM's adapter (dpukv.vllm) make."""
import time

from .. import _native as native
from .worker import LoadRequest


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


class Lookup:
    """A lookup's answer: hits per layer (leading keys found), the keys it pinned
    per layer, `chunks`, the chunks an engine may load, and `tokens`, the prompt
    tokens they give it (never the last one)."""

    def __init__(self, hits, pinned, chunks, tokens):
        self.hits = hits
        self.pinned = pinned
        self.chunks = chunks
        self.tokens = tokens

    @property
    def leading(self):
        """Leading chunks every layer has (before the last-token rule and caps)."""
        return min(self.hits) if self.hits else 0


def lookup(client, keys, prompt_tokens, chunk_tokens, max_chunks=None, on_refused=None,
           partial=False):
    """keys: per layer (and rank) the prompt's chunk keys. max_chunks: the most a
    worker's staging loads (the rest is recomputed). on_refused(error): a refused
    lookup (the agent said no) is a miss after it; without it the error is raised.
    partial: the keys end with the prompt's partial last chunk (if it has one), and
    a hit of every chunk gives the engine all of the prompt but its last token (as
    a prompt of whole chunks does: its last chunk is loaded, one token computed);
    without, the hit is whole chunks short of the prompt's end."""
    hits = [0] * len(keys)  # a prompt shorter than a chunk has nothing to find
    if keys and keys[0]:
        try:  # every layer's lookup in one round trip
            hits = client.lookup_layers(keys, pin=True)
        except native.AgentUnavailable:
            pass  # the cache is away: recompute
        except RuntimeError as e:
            if on_refused is None:
                raise
            on_refused(e)
    pinned = [k[:n] for k, n in zip(keys, hits)]
    chunks = min(hits) if hits else 0
    if max_chunks is not None:
        chunks = min(chunks, max_chunks)
    if chunks * chunk_tokens >= prompt_tokens and not partial:
        chunks -= 1  # the engine computes at least one token of the prompt
    chunks = max(chunks, 0)
    # The engine computes at least one token of the prompt: the last.
    tokens = min(chunks * chunk_tokens, prompt_tokens - 1) if prompt_tokens else 0
    if tokens <= (chunks - 1) * chunk_tokens:  # a last chunk of one token: not worth a load
        chunks -= 1
    return Lookup(hits, pinned, chunks, max(tokens, 0))


class Scheduler:
    """The engine-independent connector's scheduler side. As in vLLM, it shares no
    state with the worker side: it plans each request's load (keys, chunks found and
    pinned, then the blocks allocated) and hands the plan back; the core passes it
    to the worker."""

    def __init__(self, client, keys_of, counters, phase_s):
        """keys_of(tokens, salt): every layer's keys of a prompt. counters, phase_s:
        the connector's dicts this part adds to (lookup_hit_tokens; lookup)."""
        self.client = client
        self._keys_of = keys_of
        self.counters = counters
        self.phase_s = phase_s
        self.layout = None  # the KV caches' layout, once they are registered
        self.plans = {}  # request id -> LoadRequest, until request_finished

    def attach(self, layout):
        """The caches are registered: their layout (chunk size, blocks)."""
        self.layout = layout

    def _layout(self):
        if self.layout is None:
            raise ValueError("register_kv_caches first")
        return self.layout

    def get_num_new_matched_tokens(self, request_id, tokens, num_computed_tokens):
        layout = self._layout()
        tokens = list(tokens)
        keys = self._keys_of(tokens, 0)  # once per request: its loads use them too
        t0 = time.perf_counter()
        found = lookup(self.client, keys, len(tokens), layout.chunk_tokens)
        if keys and keys[0]:
            self.phase_s["lookup"] += time.perf_counter() - t0
        self.plans[request_id] = LoadRequest(keys=keys, chunks=found.chunks, pinned=found.pinned)
        hit = found.chunks * layout.chunk_tokens
        self.counters["lookup_hit_tokens"] += hit
        return max(hit - num_computed_tokens, 0)

    def update_state_after_alloc(self, request_id, block_ids, num_external_tokens):
        """The request's load, its blocks allocated: the plan for the worker."""
        layout = self._layout()
        req = self.plans.get(request_id)
        if req is None:
            raise ValueError(f"unknown request {request_id!r}: get_num_new_matched_tokens first")
        if num_external_tokens < 0:
            raise ValueError(f"num_external_tokens must be >= 0, not {num_external_tokens}")
        req.chunks = min(req.chunks, num_external_tokens // layout.chunk_tokens)
        req.block_ids = layout.check_blocks(block_ids, req.chunks, f"request {request_id!r}")
        return req

    def request_finished(self, request_id):
        """Releases the request's pins (its loads are over: the worker forgot it)."""
        req = self.plans.pop(request_id, None)
        if req is not None:
            release_pins(self.client, req.pinned)
