"""dpukv as a vLLM KV connector: `DpukvConnectorV1`, a KVConnectorBase_V1 that is a
thin façade over a scheduler part (scheduler.py) and a worker part (worker.py),
laid out as vLLM lays out its own connectors; settings.py reads the extra config,
requests.py holds the per-step metadata and what a request's keys are made of.
The worker part runs dpukv's engine-independent connector (dpukv.connector) and
the scheduler part makes the same lookup (dpukv.connector.lookup). A vLLM user
loads it with

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
without cross-layer caches, 0.32 among them, ignore it and the worker says so),
"dpukv.kv_codec" (none, lossless, int8 or int4: chunks encoded before they are
stored, decoded into the blocks when loaded; host caches; part of the keys).

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
import logging

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
)

from .. import _native as native
from .requests import DpukvConnectorMetadata, ReqMeta, key_tokens, request_salt
from .scheduler import VllmScheduler
from .settings import Settings, _standard_views
from .worker import VllmWorker

__all__ = ["DpukvConnectorMetadata", "DpukvConnectorV1", "ReqMeta", "Settings", "key_tokens",
           "request_salt", "_standard_views"]

logger = logging.getLogger("dpukv.vllm")


class DpukvConnectorV1(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.settings = Settings(vllm_config, self._kv_transfer_config,
                                 hasattr(KVConnectorBase_V1, "register_cross_layers_kv_cache"))
        if self.settings.cross_layer_ignored and role == KVConnectorRole.WORKER:
            logger.warning("dpukv.cross_layer ignored: %s", self.settings.cross_layer_ignored)
        socket = self.settings.socket
        # An agent that is not there yet is a miss, not an engine that fails to
        # start: the client connects when it appears (its calls say
        # AgentUnavailable until then).
        self.client = native.Client(socket, model=self.settings.model, absent_ok=True)
        if not self.client.connected():
            logger.warning("dpukv: no agent at %s yet: every lookup is a miss until one "
                           "starts", socket or "the default socket")
        self.scheduler = self.worker = None
        if role == KVConnectorRole.SCHEDULER:
            self.scheduler = VllmScheduler(self.settings, self.client)
        else:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
            self.worker = VllmWorker(self.settings, self.client, get_tensor_model_parallel_rank())
        # The worker's engine-independent connector (an attribute: every public
        # member the class defines is one of vLLM's base class).
        self.core = self.worker.core if self.worker is not None else None

    def __getattr__(self, name):
        """The settings read as the connector's own (chunk_tokens, layouts, ...)."""
        settings = self.__dict__.get("settings")
        if settings is not None and not name.startswith("__") and hasattr(settings, name):
            return getattr(settings, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def _reqs(self):
        """The scheduler's requests (tests read a lookup's time from them)."""
        return self.scheduler._reqs

    # ---- scheduler side ---------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self.scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return self.scheduler.build_connector_meta(scheduler_output)

    def request_finished(self, request, block_ids):
        return self.scheduler.request_finished(request, block_ids)

    def reset_cache(self):
        """vLLM's reset_prefix_cache(reset_connector=True): see VllmScheduler."""
        return self.scheduler.reset_cache()

    def take_events(self):
        return self.scheduler.take_events()

    # ---- worker side ------------------------------------------------------------

    @property
    def prefer_cross_layer_blocks(self):
        """dpukv.cross_layer true: vLLM gives one cache whose blocks hold every
        layer (register_cross_layers_kv_cache)."""
        return self.settings.cross_layer

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend):
        self.worker.register_cross_layers_kv_cache(kv_cache, attn_backend)

    def register_kv_caches(self, kv_caches):
        self.worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context, **kwargs):
        self.worker.start_load_kv(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name):
        self.worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        self.worker.save_kv_layer(layer_name, self._get_connector_metadata())

    def wait_for_save(self):
        self.worker.wait_for_save()

    def get_block_ids_with_load_errors(self):
        return self.worker.get_block_ids_with_load_errors()

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
        if self.worker is not None:
            self.worker.shutdown()
        close = getattr(self.client, "close", None)
        if close is not None:
            close()
