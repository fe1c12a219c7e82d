"""Chunks encoded before they are stored (the connector's kv_codec): "int8" and
"int4" quantize each channel over a block's tokens (a scale and a zero point per
channel and group of tokens, as KIVI does for keys); where the blocks keep each
head's keys and values apart (vLLM's CPU blocks), "int4" quantizes values per token
instead, as KIVI does (on SmolLM2 that lifts its next-token agreement from 91.4 %
to 94.4 % at the same bytes; int8 meets its target without, and per-token values
would cost it 1.5 % more bytes, its groups being 128 tokens). "lossless" splits the 16-bit
values into byte planes and Huffman-codes the high one; "none" stores the blocks'
bytes as they are. The codecs are the agent's own (engines/compress/kv_codec.h),
called through the client library.

Why here and not on the agent's compress engine: a quantizer needs the KV's
geometry (which values are one channel over tokens), which only the engine's side
knows, and a chunk encoded before its store is smaller on every path after it:
the channel to the agent (PCIe on a DPU), the arena, the disk tier and the peers
that read it. CacheGen and LMCache encode on the engine's side for the same reason.
The agent's --compress (lossless, for every chunk of every client) stays for
connectors that do not encode.

The codec is part of a chunk's identity: its name is folded into the layout field
of every key (layout.layer_layouts), so a chunk stored as int8 is a miss for a
reader of another codec, never decoded as one. A load checks each chunk's header
and checksum before its blocks are written: a corrupt chunk is a failed load (the
engine recomputes), its blocks untouched.

Each row of the caches' row view (layout.py) is cut into slabs of [block_size
tokens, channels], the codec's matrices:
  NHD   a row is [block_size, kv_heads, head_dim]:  1 slab of kv_heads * head_dim channels
  HND   a row is [kv_heads, block_size, head_dim]:  kv_heads slabs of head_dim channels
  MLA   a row is [block_size, head_dim]:            1 slab
  BHNC  a row is [kv_heads, block_size, 2 * head_dim], which vLLM's CPU backend keeps
        as [kv_heads, K|V, block_size, head_dim]:   2 * kv_heads slabs of head_dim"""
from .. import _native as native

# The C ABI's codec and dtype numbers (include/dpukv/client.h).
CODECS = {"none": 0, "lossless": 2, "int8": 3, "int4": 4}
_DTYPES = {"bfloat16": 1, "float16": 2}
_ALIGN = 64


def check_codec(name):
    if name not in CODECS:
        raise ValueError(f"kv_codec must be one of {', '.join(CODECS)}, not {name!r}")
    return name


def row_slabs(kv_layout, kv_heads, block_size, content):
    """(slabs, tokens, channels) of one row of the caches' row view."""
    if kv_layout == "NHD":
        return 1, block_size, kv_heads * content
    if kv_layout == "HND":
        return kv_heads, block_size, content
    if kv_layout == "BHNC" and content % 2 == 0:
        return 2 * kv_heads, block_size, content // 2
    return kv_heads, block_size, content  # MLA (one head), or an odd BHNC content


def codec_flags(name, kv_layout, content):
    """The C ABI's encode flags: values per token (DPUKV_KV_VALUES_PER_TOKEN) for int4
    where row_slabs alternates a head's keys and values and a head has at least 64
    channels (a token's scale and zero then cost no more bytes than a channel's per
    64-token group; SmolLM2 and Llama have 64 and 128)."""
    pairs = kv_layout == "BHNC" and content % 2 == 0
    return 1 if name == "int4" and pairs and content // 2 >= 64 else 0


def slot_bytes(name, kv_layout, kv_heads, block_size, content, chunk_bytes, rows_per_chunk):
    """Bytes of a staging slot: a chunk as stored, at its largest."""
    if name == "none":
        return chunk_bytes
    slabs, tokens, channels = row_slabs(kv_layout, kv_heads, block_size, content)
    bound = native.kv_encode_bound(CODECS[name], slabs * rows_per_chunk, tokens, channels,
                                   codec_flags(name, kv_layout, content), chunk_bytes)
    return -(-bound // _ALIGN) * _ALIGN


class ChunkCodec:
    """Encodes a chunk's rows into a slot, decodes a slot into a chunk's rows."""

    def __init__(self, name, layout):
        self.name = check_codec(name)
        self.code = CODECS[name]
        first = layout.kv[0]
        dtype = str(first.dtype).replace("torch.", "")
        if dtype not in _DTYPES:
            raise ValueError(f"kv_codec {name} takes 16-bit KV caches (bfloat16 or float16), "
                             f"not {dtype}")
        if first.device.type != "cpu":
            raise ValueError(f"kv_codec {name} needs the KV caches in host memory: a decode into "
                             "GPU blocks is not built (use kv_codec none there)")
        self.dtype = _DTYPES[dtype]
        self.row_bytes = layout.chunk_bytes // layout.rows_per_chunk
        heads, content = layout.heads, layout.content
        self.slabs, self.tokens, self.channels = row_slabs(layout.kv_layout, heads,
                                                           layout.block_size, content)
        self.flags = codec_flags(name, layout.kv_layout, content)
        self.slot_bytes = slot_bytes(name, layout.kv_layout, heads, layout.block_size, content,
                                     layout.chunk_bytes, layout.rows_per_chunk)

    def encode(self, src, rows, dst, cap):
        """The encoded length of `rows` rows at address src, written at address dst.
        ValueError when they cannot be encoded (NaN or infinity for a quantizer)."""
        return native.kv_encode(self.code, self.dtype, self.slabs * rows, self.tokens,
                                self.channels, self.flags, src, rows * self.row_bytes, dst, cap)

    def decode(self, base, offsets, row_addrs, rows_per_chunk, last_rows):
        """The chunks at base + offsets into the rows whose addresses are the int64
        tensor row_addrs, in order; a status name per chunk."""
        return native.kv_decode_rows(base, offsets, [self.slot_bytes] * len(offsets),
                                     row_addrs.data_ptr(), rows_per_chunk, last_rows,
                                     self.row_bytes)
