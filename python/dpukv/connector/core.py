"""A KV connector for paged KV caches, engine-independent: what an inference
engine's connector (vLLM's KVConnectorBase_V1, LMCache's) needs from dpukv, as
one object over the two parts vLLM's own connectors split into:

  scheduler part (scheduler.py): get_num_new_matched_tokens,
                                 update_state_after_alloc, request_finished
  worker part (worker.py):       register_kv_caches, start_load_kv,
                                 wait_for_layer_load, save_kv_layer, wait_for_save

with the caches' layout (layout.py) and the staging (staging.py) under the worker.
Layers load and save on their own (layer l+1's bytes move while layer l computes),
as LMCache's layerwise mode does. dpukv.vllm's DpukvConnectorV1 runs this in each
worker and the same lookup (scheduler.lookup) in vLLM's scheduler; the tests run
it against a reference model (python/tests/test_connector.py)."""
from .. import _native as native
from .codec import ChunkCodec, check_codec
from .layout import KV_LAYOUTS, KvLayout
from .scheduler import Scheduler
from .shared import share
from .staging import Staging
from .worker import LoadRequest, Worker


class DpukvConnector:
    """client: a dpukv.Client opened with model=model_id(model_name) (the agent
    refuses keys of another model: they count as save failures and misses)."""

    def __init__(self, client, model_name: str, chunk_tokens: int = 256,
                 staging_bytes: int = 256 << 20, world_size: int = 1, rank: int = 0,
                 device=None, kv_layout: str = "NHD", share_caches: bool = True,
                 kv_codec: str = "none"):
        """device: a device.py backend (default: TorchCuda for CUDA tensors, host
        staging for CPU tensors), or "host" for host staging always. kv_layout: NHD
        ([2, num_blocks, block_size, kv_heads, head_dim]), HND ([2, num_blocks,
        kv_heads, block_size, head_dim]), MLA (one latent cache per layer,
        [num_blocks, block_size, head_dim], as DeepSeek's models keep it) or BHNC
        (layout.py). share_caches: CPU caches are shared with the agent in place
        (shared.py), so that loads are one copy; False: through staging always.
        kv_codec: none, lossless, int8 or int4: chunks encoded before they are
        stored (codec.py; host caches), the codec part of their keys."""
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be NHD, HND, MLA or BHNC, not {kv_layout!r}")
        for name, v in (("chunk_tokens", chunk_tokens), ("staging_bytes", staging_bytes),
                        ("world_size", world_size)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, not {v!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), not {rank!r}")
        self.kv_layout = kv_layout
        self.client = client
        self.model = native.model_id(model_name)
        self.chunk_tokens = chunk_tokens
        self.world_size = world_size
        self.rank = rank
        self.staging_bytes = staging_bytes
        self._device = device
        self.share_caches = share_caches
        self.kv_codec = check_codec(kv_codec)
        self.codec = None
        self.shared = None
        self.layout = None
        self.stage = None
        self.worker = None
        # Counted by both parts, read by callers and tests as one live dict.
        self.counters = {"lookup_hit_tokens": 0, "loaded_chunks": 0, "loaded_in_place_chunks": 0,
                         "saved_chunks": 0, "save_failures": 0, "encoded_bytes": 0,
                         "decode_failures": 0}
        # Host seconds per phase of a load (lookup round trip, waiting for the agent's
        # retrieves, the scatter into the blocks: on a GPU its launch only), for the
        # benchmarks' breakdown of a first token.
        self.phase_s = {"lookup": 0.0, "retrieve_wait": 0.0, "scatter": 0.0}
        self.scheduler = Scheduler(client, self._layer_keys, self.counters, self.phase_s)
        # Every layer's keys of a request's tokens, hashed once for a step's saves
        # (by request, token count and salt: a request's tokens only grow); dropped
        # when the step's saves are collected.
        self._step_keys = {}

    def _layer_keys(self, tokens, salt, partial=False):
        """Every layer's keys of tokens' whole chunks; with partial, also of the
        last, partial chunk (its own key: the hash of fewer tokens)."""
        return native.chunk_keys_layers(self.model, tokens, self.chunk_tokens, partial,
                                        self.world_size, self.rank,
                                        [lay ^ salt for lay in self.layout.layouts])

    def keys(self, tokens, layer, salt=0):
        """Layer `layer`'s chunk keys of tokens' whole chunks, as this connector
        stores them (for a caller that asks the client itself)."""
        return native.chunk_keys(self.model, list(tokens), self.chunk_tokens, False,
                                 self.world_size, self.rank, self.layout.layouts[layer] ^ salt)

    # ---- worker side -----------------------------------------------------------

    def register_kv_caches(self, kv_caches, layer_ids=None, total_layers=None):
        """kv_caches: per layer a tensor of the connector's kv_layout (layout.py).
        layer_ids, total_layers: the model's index of each cache's layer and its
        layer count, for a pipeline stage holding some of the model's layers."""
        layout = KvLayout(kv_caches, self.kv_layout, self.chunk_tokens, layer_ids, total_layers,
                          self.kv_codec)
        codec = ChunkCodec(self.kv_codec, layout) if self.kv_codec != "none" else None
        stage = Staging(self.client, "host" if codec else self._device, layout.kv, layout,
                        self.staging_bytes, codec.slot_bytes if codec else None)
        self.layout, self.stage, self.codec = layout, stage, codec
        # Shared before any request runs (nothing may write the caches meanwhile).
        # Encoded chunks are decoded into the blocks here, never copied in by the agent.
        self.shared = (share(self.client, layout)
                       if self.share_caches and stage.path == "host" and codec is None else None)
        self.worker = Worker(self.client, layout, stage, self.counters, self.phase_s,
                             self.shared, codec)
        self.worker.warm_up()
        self.scheduler.attach(layout)

    def close(self):
        """Gives back what register_kv_caches took of the driver (the host staging's
        page lock). Before the client closes: its staging goes with it."""
        if self.stage is not None:
            self.stage.close()

    def _tail(self, tokens, end):
        """Blocks of chunk end-1 when it is the prompt's partial last chunk, else 0."""
        left = tokens - (end - 1) * self.chunk_tokens
        return self.layout.tail_blocks(left) if 0 < left < self.chunk_tokens else 0

    def prepare_load(self, request_id, tokens, block_ids, first: int, end: int, salt: int = 0):
        """A load the caller looked up (and pinned) elsewhere, as a vLLM worker
        gets it from its scheduler: chunks [first, end) of tokens into their blocks
        of block_ids (the request's whole block table); chunk end-1 may be the
        prompt's partial last chunk (stored by save_kv_layer with partial).
        start_load_kv next; the pins stay the caller's (request_finished here
        releases none)."""
        if self.worker is None:
            raise ValueError("register_kv_caches first")
        if not 0 <= first < end:
            raise ValueError(f"chunks [{first}, {end}) is not a range to load")
        tokens = list(tokens)
        tail = self._tail(len(tokens), end)
        block_ids = self.layout.check_blocks(block_ids, end, f"request {request_id!r}", tail)
        keys = self._layer_keys(tokens, salt, partial=True)
        if len(keys[0]) < end:
            raise ValueError(f"request {request_id!r}: {len(tokens)} tokens hold "
                             f"{len(keys[0])} chunks, not {end}")
        bpc = self.layout.blocks_per_chunk
        self.worker.expect(request_id, LoadRequest(
            keys=[k[first:end] for k in keys], chunks=end - first,
            block_ids=block_ids[first * bpc:end * bpc], tail=tail))

    def start_load_kv(self, request_id):
        """Starts the retrieve of every layer that fits in the load staging now;
        wait_for_layer_load(l) finishes layer l (the engine calls it just before the
        layer's attention)."""
        self.worker.start_load(request_id)

    def wait_for_layer_load(self, request_id, layer: int):
        self.worker.wait_for_layer_load(request_id, layer)

    def save_kv_layer(self, request_id, layer: int, tokens, block_ids, skip_chunks: int = 0,
                      salt: int = 0, partial: bool = False):
        """Saves the whole chunks of layer `layer` of a request after the layer has
        written its KV; returns at once (wait_for_save collects). Chunks below
        skip_chunks (loaded from dpukv) are not stored again. With partial, the
        tokens' last, partial chunk too (the whole prompt is computed): a later
        hit then loads all of the prompt but its last token."""
        if not 0 <= layer < len(self.kv):
            raise ValueError(f"layer {layer} is not in [0, {len(self.kv)})")
        if skip_chunks < 0:
            raise ValueError(f"skip_chunks must be >= 0, not {skip_chunks}")
        step = (request_id, len(tokens), salt, partial)
        layers_keys = self._step_keys.get(step)
        if layers_keys is None:
            layers_keys = self._step_keys[step] = self._layer_keys(list(tokens), salt, partial)
        all_keys = layers_keys[layer]
        tail = self._tail(len(tokens), len(all_keys)) if partial else 0
        block_ids = self.layout.check_blocks(block_ids, len(all_keys), f"save of {request_id!r}",
                                             tail)
        if skip_chunks < len(all_keys):
            self.worker.save(request_id, layer, all_keys[skip_chunks:], block_ids, skip_chunks,
                             tail)

    def collect_saves(self, block: bool = False):
        """Counts the stores that have finished (all of them with block); the
        step's saves are all submitted, so its keys are dropped."""
        self._step_keys.clear()
        if self.worker is not None:
            self.worker.collect_saves(block)

    def wait_for_save(self):
        self.collect_saves(block=True)

    @property
    def max_load_chunks(self):
        return self.worker.max_load_chunks

    # ---- scheduler side --------------------------------------------------------

    def get_num_new_matched_tokens(self, request_id, tokens, num_computed_tokens: int) -> int:
        """Tokens beyond num_computed_tokens that dpukv can load, pinned until
        request_finished."""
        return self.scheduler.get_num_new_matched_tokens(request_id, tokens, num_computed_tokens)

    def update_state_after_alloc(self, request_id, block_ids, num_external_tokens: int):
        """The scheduler's plan for the request goes to the worker (vLLM sends it in
        the step's metadata)."""
        plan = self.scheduler.update_state_after_alloc(request_id, block_ids,
                                                       num_external_tokens)
        self.worker.expect(request_id, plan)

    def request_finished(self, request_id):
        # Its loads are waited for before its pins go.
        if self.worker is not None:
            self.worker.forget(request_id)
        self.scheduler.request_finished(request_id)

    # ---- what callers and tests read -------------------------------------------

    @property
    def kv(self):
        return self.layout.kv if self.layout is not None else None

    @property
    def layer_ids(self):
        return self.layout.layer_ids

    @property
    def layouts(self):
        return self.layout.layouts

    @property
    def chunk_bytes(self):
        return self.layout.chunk_bytes

    @property
    def path(self):
        return self.stage.path if self.stage is not None else None

    @property
    def loads_in_place(self):
        """True when loads land in the blocks themselves (shared.py), not staging."""
        return self.shared is not None

    @property
    def path_reason(self):
        return self.stage.path_reason if self.stage is not None else ""

    @property
    def staging(self):
        return self.stage.buf

    @property
    def slots(self):
        return self.stage.slots

    @property
    def load_free(self):
        return self.stage.load_free

    @property
    def saves(self):
        return self.worker.saves

    @property
    def saving_chunks(self):
        return self.worker.saving_chunks

    @property
    def strided(self):
        return self.layout.strided
