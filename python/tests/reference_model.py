"""A small Llama-architecture decoder in plain torch, for tests and benchmarks of
the connector: RMSNorm, rotary position embeddings, grouped-query attention,
SwiGLU, and a paged KV cache with block tables laid out as vLLM lays it out:
per layer a tensor [2, num_blocks, block_size, num_kv_heads, head_dim] (vLLM
before mid-2026), or with bhnc=True [num_blocks, num_kv_heads, block_size,
2 * head_dim] (the view vLLM 0.32 hands connectors: K then V in a row).

Weights are deterministic (a seeded generator), so two processes build the same
model. Nothing here is dpukv-specific: it is the inference engine the connector
serves, small enough for CPU tests and shaped like Llama-3.1-8B when asked."""
from dataclasses import dataclass

import torch


@dataclass
class LlamaConfig:
    vocab_size: int = 512
    hidden: int = 128
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 256
    rope_theta: float = 500000.0
    eps: float = 1e-5
    dtype: torch.dtype = torch.float32

    @staticmethod
    def llama_3_1_8b(dtype=torch.bfloat16):
        return LlamaConfig(vocab_size=128256, hidden=4096, layers=32, heads=32, kv_heads=8,
                           head_dim=128, ffn=14336, dtype=dtype)


class PagedKVCache:
    """Per layer one tensor [2, num_blocks, block_size, kv_heads, head_dim], or with
    bhnc [num_blocks, kv_heads, block_size, 2 * head_dim]; a request owns a list of
    block ids (its block table)."""

    def __init__(self, cfg: LlamaConfig, num_blocks: int, block_size: int, device="cpu",
                 bhnc=False):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.bhnc = bhnc
        self.head_dim = cfg.head_dim
        shape = ((num_blocks, cfg.kv_heads, block_size, 2 * cfg.head_dim) if bhnc else
                 (2, num_blocks, block_size, cfg.kv_heads, cfg.head_dim))
        self.layers = [torch.zeros(*shape, dtype=cfg.dtype, device=device)
                       for _ in range(cfg.layers)]
        self.free = list(range(num_blocks - 1, -1, -1))

    def allocate(self, tokens: int):
        n = (tokens + self.block_size - 1) // self.block_size
        if n > len(self.free):
            raise MemoryError("KV cache has no free blocks")
        return [self.free.pop() for _ in range(n)]

    def release(self, blocks):
        self.free.extend(reversed(blocks))

    def slots(self, blocks, start: int, end: int, device):
        """Flat slot indices (block * block_size + offset) of positions [start, end)."""
        pos = torch.arange(start, end, device=device)
        table = torch.tensor(blocks, device=device)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def write(self, layer: int, slots, k, v):
        """K and V [T, kv_heads, head_dim] of T positions into their slots."""
        kv, d = self.layers[layer], self.head_dim
        if self.bhnc:
            b, o = slots // self.block_size, slots % self.block_size
            kv[b, :, o, :d] = k
            kv[b, :, o, d:] = v
        else:
            flat = kv.view(2, -1, *kv.shape[3:])
            flat[0, slots] = k
            flat[1, slots] = v

    def read(self, layer: int, slots):
        """K and V [T, kv_heads, head_dim] of the given slots."""
        kv, d = self.layers[layer], self.head_dim
        if self.bhnc:
            b, o = slots // self.block_size, slots % self.block_size
            return kv[b, :, o, :d], kv[b, :, o, d:]
        flat = kv.view(2, -1, *kv.shape[3:])
        return flat[0, slots], flat[1, slots]

    def get_blocks(self, layer: int, blocks):
        """A copy of the given blocks' KV of one layer (the block dimension of the layout)."""
        kv = self.layers[layer]
        return kv[blocks].clone() if self.bhnc else kv[:, blocks].clone()

    def set_blocks(self, layer: int, blocks, value):
        if self.bhnc:
            self.layers[layer][blocks] = value
        else:
            self.layers[layer][:, blocks] = value


class LlamaModel:
    def __init__(self, cfg: LlamaConfig, device="cpu", seed=1234):
        self.cfg = cfg
        self.device = device
        self.sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
        self.attention = "sdpa" if self.sdpa else "einsum"
        # Drawn where they live: 8B parameters drawn on one CPU thread take minutes.
        g = torch.Generator(device=device).manual_seed(seed)

        def w(*shape, scale=None):
            scale = scale if scale is not None else shape[-1] ** -0.5
            return (torch.randn(*shape, generator=g, device=device) * scale).to(cfg.dtype)

        c = cfg
        self.embed = w(c.vocab_size, c.hidden, scale=1.0)
        self.blocks = []
        for _ in range(c.layers):
            self.blocks.append({
                "attn_norm": torch.ones(c.hidden, dtype=c.dtype, device=device),
                "wq": w(c.heads * c.head_dim, c.hidden),
                "wk": w(c.kv_heads * c.head_dim, c.hidden),
                "wv": w(c.kv_heads * c.head_dim, c.hidden),
                "wo": w(c.hidden, c.heads * c.head_dim),
                "ffn_norm": torch.ones(c.hidden, dtype=c.dtype, device=device),
                "w1": w(c.ffn, c.hidden),
                "w3": w(c.ffn, c.hidden),
                "w2": w(c.hidden, c.ffn),
            })
        self.norm = torch.ones(c.hidden, dtype=c.dtype, device=device)
        self.lm_head = w(c.vocab_size, c.hidden)
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
        self.inv_freq = inv.to(device)

    def _attention(self, q, keys, vals, mask):
        """q [T, H, D], keys and vals [S, H, D], mask [T, S] (None: causal from 0).
        Through torch's fused attention where it has one (torch >= 2.0), as a
        serving engine's prefill runs: the explicit [H, T, S] scores are 138 GB at
        a 32k prefill. Else (Debian's torch 1.13) explicitly, in float32."""
        c = self.cfg
        if self.sdpa:
            q4, k4, v4 = (x.transpose(0, 1)[None] for x in (q, keys, vals))
            if mask is None:
                out = self.sdpa(q4, k4, v4, is_causal=True)
            else:
                out = self.sdpa(q4, k4, v4, attn_mask=mask[None, None])
            return out[0].transpose(0, 1)
        scores = torch.einsum("thd,shd->hts", q.float(), keys.float()) * c.head_dim ** -0.5
        scores = scores.masked_fill(~mask[None], float("-inf"))
        return torch.einsum("hts,shd->thd", scores.softmax(-1), vals.float()).to(c.dtype)

    def _rms(self, x, weight):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.eps)
        return xf.to(x.dtype) * weight

    def _rope(self, x, positions):
        # x: [T, H, D]; rotate pairs (first half, second half) as Llama does.
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        cos = freqs.cos()[:, None, :]
        sin = freqs.sin()[:, None, :]
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    @torch.no_grad()
    def forward(self, tokens, start: int, cache: PagedKVCache, blocks, layer_hook=None,
                layer_done=None):
        """Computes positions [start, start + len(tokens)) of a request whose KV for
        positions [0, start) is already in its blocks; writes the new KV there and
        returns the logits of the last position. layer_hook(l) runs before layer l
        reads the cache (a connector waits for that layer's load there);
        layer_done(l) runs once layer l has written its KV (a connector saves it)."""
        return self.forward_batch([(tokens, start, blocks)], cache, layer_hook, layer_done)[0]

    @torch.no_grad()
    def forward_batch(self, batch, cache: PagedKVCache, layer_hook=None, layer_done=None):
        """forward() for a batch of requests [(tokens, start, blocks), ...], layer by
        layer as an engine runs a batch: layer_hook(l) once before layer l of every
        request, layer_done(l) once after layer l wrote every request's KV. Each
        request's numbers are those forward() gives it alone. Returns their logits."""
        c = self.cfg
        group = c.heads // c.kv_heads
        reqs = []
        for tokens, start, blocks in batch:
            t = torch.as_tensor(tokens, device=self.device)
            end = start + t.numel()
            positions = torch.arange(start, end, device=self.device)
            reqs.append({
                "positions": positions,
                "slots": cache.slots(blocks, start, end, self.device),
                "all_slots": cache.slots(blocks, 0, end, self.device),
                "x": self.embed[t],
                # Causal mask over [T, end]: query i (position start + i) sees keys <= it.
                # A full prefill through SDPA needs none ([T, T] is 1 GB at 32k).
                "mask": None if (self.sdpa and start == 0) else
                        torch.arange(end, device=self.device)[None, :] <= positions[:, None],
            })
        for l, b in enumerate(self.blocks):
            if layer_hook is not None:
                layer_hook(l)
            for r in reqs:
                h = self._rms(r["x"], b["attn_norm"])
                q = (h @ b["wq"].T).view(-1, c.heads, c.head_dim)
                k = (h @ b["wk"].T).view(-1, c.kv_heads, c.head_dim)
                v = (h @ b["wv"].T).view(-1, c.kv_heads, c.head_dim)
                r["q"] = self._rope(q, r["positions"])
                cache.write(l, r["slots"], self._rope(k, r["positions"]), v)
            if layer_done is not None:
                layer_done(l)
            for r in reqs:
                keys, vals = cache.read(l, r["all_slots"])
                keys = keys.repeat_interleave(group, dim=1)  # [end, H, D]
                vals = vals.repeat_interleave(group, dim=1)
                attn = self._attention(r["q"], keys, vals, r["mask"])
                x = r["x"] + attn.reshape(-1, c.heads * c.head_dim) @ b["wo"].T
                h = self._rms(x, b["ffn_norm"])
                gate = torch.nn.functional.silu(h @ b["w1"].T) * (h @ b["w3"].T)
                r["x"] = x + gate @ b["w2"].T
        out = []
        for r in reqs:
            x = self._rms(r["x"][-1:], self.norm)
            out.append((x @ self.lm_head.T)[0].float())
        return out
