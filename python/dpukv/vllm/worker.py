"""The adapter's worker side: vLLM's layer names to the connector's layers, the
per-layer or cross-layer caches registered (and checked against the model
configuration the scheduler keys with), each step's loads started and finished
layer by layer (a failed or expired load never raises: its blocks go to
get_block_ids_with_load_errors and vLLM recomputes them), saves gathered during
the step and stored while later steps run."""
import logging
import re
import time

from ..connector import DpukvConnector, LoadMiss

logger = logging.getLogger("dpukv.vllm")


def _layer_number(name):
    m = re.search(r"layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


class VllmWorker:
    def __init__(self, settings, client, rank):
        s = settings
        self.client = client
        self.chunk_tokens, self.block_size, self.lease_ns = s.chunk_tokens, s.block_size, s.lease_ns
        self.cross_layer, self.layouts = s.cross_layer, s.layouts
        self.stage_layers, self.total_layers = s.stage_layers, s.total_layers
        self.kv_heads, self.head_dim, self.dtype = s.kv_heads, s.head_dim, s.dtype
        self.rank = rank
        self.producer = s.kv_role == "kv_producer"
        self.core = DpukvConnector(
            client, s.model_name, chunk_tokens=s.chunk_tokens, staging_bytes=s.staging_bytes,
            world_size=s.world_size, rank=rank, kv_layout=s.kv_layout,
            share_caches=s.share_caches, kv_codec=s.kv_codec)
        self.layer_index = {}
        self._loading = []  # ReqMeta of this step's loads
        self._load_errors = set()

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
        logger.info("dpukv: %s registered, %s path%s%s", what, self.core.path,
                    (": " + self.core.path_reason) if self.core.path_reason else "",
                    ", loads in place" if self.core.loads_in_place else "")

    def _load_blocks(self, rm):
        """The blocks a load writes: its chunks', the last partial chunk's own only."""
        bpc = self.chunk_tokens // self.block_size
        end = min(rm.load_to * bpc, -(-len(rm.token_ids) // self.block_size))
        return rm.block_ids[rm.load_from * bpc:end]

    def start_load_kv(self, meta):
        self._loading = []
        now = time.monotonic_ns()
        for rm in meta.requests:
            if rm.load_to <= rm.load_from:
                continue
            # dpukv.lease_ms: a hit looked up longer ago than that is not loaded; its
            # blocks are reported and vLLM recomputes them.
            if self.lease_ns > 0 and now - rm.lookup_ns > self.lease_ns:
                self._load_errors.update(self._load_blocks(rm))
                continue
            try:
                self.core.prepare_load(rm.req_id, rm.token_ids, rm.block_ids, rm.load_from,
                                       rm.load_to, salt=rm.salt)
                self.core.start_load_kv(rm.req_id)
            except (ValueError, RuntimeError) as e:
                # Never an exception out of the step: the blocks are recomputed.
                logger.warning("dpukv: load of request %s not started (%s)", rm.req_id, e)
                self._load_errors.update(self._load_blocks(rm))
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
                failed = self._load_blocks(rm)
                if failed[0] not in self._load_errors:
                    logger.warning("dpukv: load of request %s failed (%s); %d blocks to "
                                   "recompute", rm.req_id, e, len(failed))
                self._load_errors.update(failed)

    def save_kv_layer(self, layer_name, meta):
        layer = self._layer(layer_name)
        if layer is None:
            return
        for rm in meta.requests:
            if rm.save_to > rm.save_from:
                tokens = rm.token_ids[:rm.save_to * self.chunk_tokens]
                # Fewer tokens than whole chunks: the last is the prompt's partial one.
                self.core.save_kv_layer(rm.req_id, layer, tokens, rm.block_ids,
                                        skip_chunks=rm.save_from, salt=rm.salt,
                                        partial=len(tokens) % self.chunk_tokens != 0)

    def wait_for_save(self):
        # The step's gathers copied its blocks into staging already: the stores
        # finish while the next steps run (collected here as they do, and waited
        # for when their staging slots are needed or at shutdown). A producer's
        # step waits for them: a decode engine asks for the prompt's KV next.
        self.core.collect_saves(block=self.producer)
        for rm in self._loading:  # the step's loads are over: their slots go back
            self.core.request_finished(rm.req_id)
        self._loading = []

    def get_block_ids_with_load_errors(self):
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self):
        if self.core.kv is not None:
            self.core.wait_for_save()  # the last stores land before the client goes
            self.core.close()
