"""The adapter's settings: kv_connector_extra_config read and checked (each bad
value refused naming its setting), and what the keys are made of, from vLLM's
model and parallel configuration (the scheduler has no KV cache to read them
from; the worker checks its tensors against them)."""
import re

from .. import _native as native
from ..connector import layer_layouts
from ..connector.codec import check_codec, slot_bytes

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


def _max_load_chunks(staging_bytes, chunk_tokens, kv_heads, head_dim, dtype, kv_layout,
                     kv_codec="none", block_size=1):
    """What DpukvConnector.max_load_chunks will be for caches of this configuration
    (fp8 and other 1-byte caches: 1 byte an element)."""
    parts = 1 if kv_layout in ("MLA", "BHNC") else 2
    item = _ITEM_BYTES.get(str(dtype), 1)
    chunk_bytes = parts * chunk_tokens * kv_heads * head_dim * item
    slot = slot_bytes(kv_codec, kv_layout, kv_heads, block_size, head_dim, chunk_bytes,
                      parts * chunk_tokens // block_size)
    return max(staging_bytes // slot // 2, 0)


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


class Settings:
    """What both sides of the adapter read: the extra config, checked, and what
    the keys are made of. cross_layer_supported: this vLLM hands connectors a
    cross-layer cache (its base class has register_cross_layers_kv_cache)."""

    def __init__(self, vllm_config, tc, cross_layer_supported):
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
        # CPU caches shared with the agent in place, loads in one copy (shared.py).
        self.share_caches = _flag("dpukv.share_caches",
                                  _extra(tc, "dpukv.share_caches", True))
        # vLLM 0.32 (model runner V2) has no cross-layer cache for connectors: its
        # base class lost register_cross_layers_kv_cache and nothing calls it. The
        # setting is then said to be ignored, never silently dropped.
        self.cross_layer_ignored = None
        if self.cross_layer and not cross_layer_supported:
            self.cross_layer = False
            self.cross_layer_ignored = ("this vLLM never hands connectors a cross-layer KV "
                                        "cache (no register_cross_layers_kv_cache): "
                                        "per-layer caches are used")
        self.save_policy = str(_extra(tc, "dpukv.save", "all"))
        if self.save_policy not in ("all", "seen_twice"):
            raise ValueError(f"dpukv.save must be all or seen_twice, not {self.save_policy!r}")
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
        # Chunks encoded before they are stored (connector/codec.py), the codec in their keys.
        self.kv_codec = check_codec(str(_extra(tc, "dpukv.kv_codec", "none")).lower())
        self.layouts = layer_layouts(self.dtype, self.total_layers, self.key_heads, self.key_dim,
                                     self.kv_layout, self.kv_codec)
        self.model = native.model_id(self.model_name)
        self.socket = str(_extra(tc, "dpukv.socket", ""))
        # kv_producer (a prefill engine of a disaggregated pair): each step waits for
        # its stores, so that a prompt's KV is in dpukv before its response leaves
        # and a decode engine asked next finds it.
        self.kv_role = str(getattr(tc, "kv_role", None) or "kv_both")
        # The largest hit a worker's load staging carries (one layer's chunks at a
        # time): the scheduler never reports more.
        self.max_load_chunks = _max_load_chunks(
            self.staging_bytes, self.chunk_tokens, self.key_heads, self.key_dim, self.dtype,
            self.kv_layout, self.kv_codec, self.block_size)
