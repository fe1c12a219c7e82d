"""What a set of paged KV caches is, and how its blocks move as rows.

Per layer the engine keeps a paged KV tensor; a prompt is cut into chunks of
`chunk_tokens` tokens (a multiple of the block size), and chunk i of layer l is
stored under dpukv's chunk key of the prompt's first (i+1)*chunk_tokens tokens,
with the layer folded into the key's layout fingerprint (layer_layouts).

Shapes (kv_layout):
  NHD   [2, num_blocks, block_size, kv_heads, head_dim]  (vLLM's classic layout)
  HND   [2, num_blocks, kv_heads, block_size, head_dim]
  MLA   [num_blocks, block_size, head_dim]               (one latent per layer)
  BHNC  [num_blocks, kv_heads, block_size, content]      (vLLM 0.32's per-layer view:
                                                           K and V in the content)

Gathers and scatters move whole blocks: every layer's cache seen as rows (row b:
K of block b, row num_blocks + b: V of block b; one part: row b) and staging as
rows (a chunk: its K blocks, then its V blocks). The rows are viewed as 4- or
2-byte integers: torch moves those with plain copies, and bf16 elementwise, about
6x slower on a CPU. Caches whose blocks or layers are strided (vLLM's cross-layer
cache: blocks first) are seen as [num_blocks, parts, row] and indexed with two
index tensors."""
import operator

import torch

from .. import _native as native

_GOLDEN = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
KV_LAYOUTS = ("NHD", "HND", "MLA", "BHNC")


def layer_layouts(dtype: str, layers: int, kv_heads: int, head_dim: int, kv_layout="NHD",
                  kv_codec="none"):
    """The layout field of each layer's chunk keys: the cache's dtype, shape and
    layout (the bytes of an HND block are not those of an NHD block), the codec its
    chunks are stored with (codec.py), and the layer."""
    name = dtype if kv_layout == "NHD" else f"{dtype}:{kv_layout}"
    if kv_codec != "none":
        name += f":{kv_codec}"
    base = native.kv_layout_fingerprint(name, layers, kv_heads, head_dim)
    return [base ^ ((l + 1) * _GOLDEN & _MASK) for l in range(layers)]


class KvLayout:
    """The registered caches of one worker: checked once, then read by the loads
    and saves (worker.py) and the staging (staging.py)."""

    def __init__(self, kv_caches, kv_layout, chunk_tokens, layer_ids=None, total_layers=None,
                 kv_codec="none"):
        """layer_ids: the model's own index of each cache's layer, and total_layers
        the model's layer count (default: the caches are layers 0..n-1 of n). A
        pipeline stage holds only some of the model's layers: its keys are those of
        the model's layers it holds, so that no two stages share a key. kv_codec:
        what the chunks are stored as (codec.py), part of their keys."""
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be NHD, HND, MLA or BHNC, not {kv_layout!r}")
        kv_caches = list(kv_caches)
        if not kv_caches:
            raise ValueError("register_kv_caches needs at least one layer's KV cache")
        layer_ids = list(range(len(kv_caches)) if layer_ids is None else layer_ids)
        if total_layers is None:
            total_layers = len(kv_caches)
        if (len(layer_ids) != len(kv_caches) or len(set(layer_ids)) != len(layer_ids) or
                not all(isinstance(i, int) and 0 <= i < total_layers for i in layer_ids)):
            raise ValueError(f"layer_ids {layer_ids} are not {len(kv_caches)} distinct layers "
                             f"of [0, {total_layers})")
        first = kv_caches[0]
        # K and V per block, or one part: MLA's latent, or a block whose content
        # holds both (BHNC).
        self.parts = 1 if kv_layout in ("MLA", "BHNC") else 2
        if kv_layout == "BHNC":
            if not isinstance(first, torch.Tensor) or first.dim() != 4:
                raise ValueError("BHNC KV caches must be [num_blocks, kv_heads, block_size, "
                                 "content] (vLLM's per-layer view)")
        elif self.parts == 1:
            if not isinstance(first, torch.Tensor) or first.dim() != 3:
                raise ValueError("MLA KV caches must be [num_blocks, block_size, head_dim]")
        elif not isinstance(first, torch.Tensor) or first.dim() != 5 or first.shape[0] != 2:
            raise ValueError("KV caches must be [2, num_blocks, block_size, kv_heads, head_dim]")
        for t in kv_caches:
            if not isinstance(t, torch.Tensor) or t.shape != first.shape or t.dtype != first.dtype:
                raise ValueError("every layer's KV cache must have the same shape and dtype")
            # A block's K (or V, or latent) bytes must be contiguous; the blocks and
            # the layers may be strided (vLLM's cross-layer caches: blocks first).
            inner = t[0, 0] if self.parts == 2 else t[0]
            if not inner.is_contiguous():
                raise ValueError("each block of a KV cache must be contiguous")
        self.kv = kv_caches
        self.kv_layout = kv_layout
        if kv_layout == "NHD":
            _, self.num_blocks, self.block_size, heads, dim = first.shape
        elif kv_layout == "HND":
            _, self.num_blocks, heads, self.block_size, dim = first.shape
        elif kv_layout == "BHNC":
            self.num_blocks, heads, self.block_size, dim = first.shape
        else:
            (self.num_blocks, self.block_size, dim), heads = first.shape, 1
        self.heads, self.content = heads, dim
        if chunk_tokens % self.block_size:
            raise ValueError("chunk_tokens must be a multiple of the block size")
        self.chunk_tokens = chunk_tokens
        self.blocks_per_chunk = chunk_tokens // self.block_size
        self.rows_per_chunk = self.parts * self.blocks_per_chunk
        self.chunk_bytes = self.parts * chunk_tokens * heads * dim * first.element_size()
        dtype = str(first.dtype).replace("torch.", "")
        model_layouts = layer_layouts(dtype, total_layers, heads, dim, kv_layout, kv_codec)
        self.layer_ids = layer_ids
        self.layouts = [model_layouts[i] for i in layer_ids]
        row_bytes = self.chunk_bytes // self.rows_per_chunk
        self.row_dtype = (torch.int32 if row_bytes % 4 == 0 else
                          torch.int16 if row_bytes % 2 == 0 else torch.uint8)
        self.strided = not all(kv.is_contiguous() for kv in kv_caches)
        if self.strided:
            self.kv_rows = [self._rows_view(kv) for kv in kv_caches]
        else:
            self.kv_rows = [kv.view(self.parts * self.num_blocks, -1).view(self.row_dtype)
                            for kv in kv_caches]

    @property
    def layers(self):
        return len(self.kv)

    def staging_rows(self, staging_u8, chunks):
        """Staging bytes as rows of this layout: `chunks` chunks of rows_per_chunk."""
        return staging_u8.view(self.row_dtype).view(chunks * self.rows_per_chunk, -1)

    def _rows_view(self, kv):
        """[num_blocks, parts, row] over a strided layer cache, in row_dtype units."""
        v = kv.view(self.row_dtype)
        row = v[0, 0].numel() if self.parts == 2 else v[0].numel()
        if self.parts == 2:
            return v.as_strided((self.num_blocks, 2, row), (v.stride(1), v.stride(0), 1),
                                v.storage_offset())
        return v.as_strided((self.num_blocks, 1, row), (v.stride(0), row, 1), v.storage_offset())

    def tail_blocks(self, tokens):
        """Blocks of a prompt's last, partial chunk of `tokens` tokens (0: none)."""
        return -(-tokens // self.block_size)

    def chunk_rows(self, tail=0):
        """Rows of a chunk: a whole one (tail 0), or a partial one of `tail` blocks."""
        return self.parts * (tail or self.blocks_per_chunk)

    def stored_bytes(self, tail=0):
        """Bytes of a chunk as stored: a whole one, or a partial one of `tail` blocks
        (its blocks only: the last may hold slots past the prompt, as written)."""
        return self.chunk_bytes // self.rows_per_chunk * self.chunk_rows(tail)

    def rows(self, block_ids, chunks, device, tail=0):
        """The rows of `chunks` chunks in the caches' row view, in staging's order:
        per chunk its K blocks' rows, then its V blocks' rows (one part: its blocks'
        rows); with tail, the last of them is a partial chunk of `tail` blocks.
        Strided caches: a (blocks, parts) pair of index tensors."""
        whole = chunks - (1 if tail else 0)
        bpc = self.blocks_per_chunk
        groups = [torch.tensor(block_ids[:whole * bpc], dtype=torch.int64).view(whole, bpc)]
        if tail:
            groups.append(torch.tensor(block_ids[whole * bpc:whole * bpc + tail],
                                       dtype=torch.int64).view(1, tail))
        if self.strided:
            blocks, parts = [], []
            for b in groups:
                if self.parts == 1:
                    blocks.append(b.reshape(-1))
                    parts.append(torch.zeros(b.numel(), dtype=torch.int64))
                else:
                    blocks.append(torch.cat([b, b], dim=1).reshape(-1))
                    parts.append(torch.cat([torch.zeros_like(b), torch.ones_like(b)],
                                           dim=1).reshape(-1))
            return torch.cat(blocks).to(device), torch.cat(parts).to(device)
        if self.parts == 1:
            return torch.cat([b.reshape(-1) for b in groups]).to(device)
        return torch.cat([torch.cat([b, b + self.num_blocks], dim=1).reshape(-1)
                          for b in groups]).to(device)

    def row_addresses(self, layer, rows):
        """The addresses of `rows` (as rows() gives them) in a layer's cache, in
        order: a contiguous int64 tensor (host caches)."""
        v = self.kv_rows[layer]
        item = v.element_size()
        if self.strided:
            return (v.data_ptr() + rows[0] * (v.stride(0) * item) +
                    rows[1] * (v.stride(1) * item)).contiguous()
        return (v.data_ptr() + rows * (v.stride(0) * item)).contiguous()

    def scatter(self, layer, rows, k, src):
        """Staging rows src into the first k rows of `rows` of a layer's cache."""
        if self.strided:
            self.kv_rows[layer][rows[0][:k], rows[1][:k]] = src
        else:
            self.kv_rows[layer][rows[:k]] = src

    def gather(self, layer, rows, a, b, dst):
        """Rows [a, b) of `rows` of a layer's cache into staging rows dst."""
        if not self.strided and dst.device == self.kv_rows[layer].device:
            torch.index_select(self.kv_rows[layer], 0, rows[a:b], out=dst)  # one pass
        elif self.strided:
            dst.copy_(self.kv_rows[layer][rows[0][a:b], rows[1][a:b]])
        else:  # host-pinned: gathered on the device, then copied down
            dst.copy_(torch.index_select(self.kv_rows[layer], 0, rows[a:b]))

    def check_blocks(self, block_ids, chunks, what, tail=0):
        """The blocks of the first `chunks` chunks (the last a partial one of `tail`
        blocks, if tail): enough of them, each a block of the cache (torch would
        wrap a negative id onto another block)."""
        need = chunks * self.blocks_per_chunk - (self.blocks_per_chunk - tail if tail else 0)
        ids = list(block_ids)
        if len(ids) < need:
            raise ValueError(f"{what}: {chunks} chunks need {need} block ids, got {len(ids)}")
        # Plain ints (what engines pass): checked by their range at C speed.
        if ids and all(type(b) is int for b in ids) and 0 <= min(ids) and max(ids) < self.num_blocks:
            return ids
        for i, b in enumerate(ids):
            try:
                ids[i] = operator.index(b)  # ints, numpy and 0-d torch integers
            except TypeError:
                raise ValueError(f"{what}: block id {b!r} is not an integer") from None
            if isinstance(b, bool) or not 0 <= ids[i] < self.num_blocks:
                raise ValueError(f"{what}: block id {b!r} is not in [0, {self.num_blocks})")
        return ids
