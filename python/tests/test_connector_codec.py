"""The connector's kv_codec against a real agent (issue 48): chunks encoded before
they are stored, decoded into the blocks when loaded.

- Each codec loads back what was saved: lossless bit for bit, int8 and int4 within
  their quantization error, in fewer bytes (on vLLM's CPU layout, 128-token blocks:
  int8 >= 1.9x, int4 >= 3.5x).
- The codec is part of the chunk's identity: a chunk stored as int8 is a miss for a
  reader of none or int4, a hit for another int8 reader.
- A chunk whose bytes were changed after encoding is never decoded into the blocks:
  the layer's load fails (the engine recomputes), its blocks keep what they held.
- A prefix hit through the reference model: lossless gives the logits of an
  uncompressed hit, int8 the same next token.

Run by pytest through tests/python_test.sh (a real agent, DPUKV_TEST_SOCKET)."""
import os
import sys

sys.path.insert(0, os.environ["DPUKV_PY_PACKAGE_DIR"])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytest  # noqa: E402
import torch  # noqa: E402

import dpukv  # noqa: E402
from dpukv.connector import DpukvConnector, LoadMiss  # noqa: E402
from reference_model import LlamaConfig, LlamaModel, PagedKVCache  # noqa: E402

SOCKET = os.environ["DPUKV_TEST_SOCKET"]
CFG = LlamaConfig(dtype=torch.bfloat16)
torch.manual_seed(0)
MODEL = LlamaModel(CFG)


def connector(name, codec, cache, chunk_tokens, **kw):
    client = dpukv.Client(SOCKET, model=dpukv.model_id(name))
    c = DpukvConnector(client, name, chunk_tokens=chunk_tokens, staging_bytes=8 << 20,
                       kv_layout="BHNC" if cache.bhnc else "NHD", kv_codec=codec, **kw)
    c.register_kv_caches(cache.layers)
    return c


def kv_like(shape):
    """KV-like values: channels of their own scale, a few large outliers."""
    x = torch.randn(shape) * (0.2 + torch.rand(shape[-1]) * 2)
    x.view(-1)[::997] *= 8
    return x.to(torch.bfloat16)


def save(c, cache, req, tokens):
    blocks = cache.allocate(len(tokens))
    for kv in cache.layers:
        kv[blocks] = kv_like(kv[blocks].shape)
    for layer in range(CFG.layers):
        c.save_kv_layer(req, layer, tokens, blocks)
    c.wait_for_save()
    c.request_finished(req)
    return blocks


def load(c, req, tokens, blocks):
    hit = c.get_num_new_matched_tokens(req, tokens, 0)
    c.update_state_after_alloc(req, blocks, hit)
    c.start_load_kv(req)
    failed = []
    for layer in range(CFG.layers):
        try:
            c.wait_for_layer_load(req, layer)
        except LoadMiss:
            failed.append(layer)
    c.request_finished(req)
    return hit, failed


def prompt(n):
    return torch.randint(0, CFG.vocab_size, (n,)).tolist()


@pytest.mark.parametrize("codec,max_err,min_ratio,head_dim",
                         [("lossless", 0.0, 1.0, 16), ("int8", 0.01, 1.9, 16),
                          ("int4", 0.12, 3.5, 16), ("int4", 0.12, 3.5, 64)])
def test_each_codec_loads_back_what_was_saved_in_fewer_bytes(codec, max_err, min_ratio, head_dim):
    # vLLM's CPU layout and block size: [blocks, kv_heads, 128, K|V]. At 64 channels a
    # head, int4 quantizes values per token (SmolLM2's and Llama's heads).
    cfg = LlamaConfig(dtype=torch.bfloat16, head_dim=head_dim)
    cache = PagedKVCache(cfg, num_blocks=16, block_size=128, bhnc=True)
    c = connector(f"codec-{codec}-{head_dim}", codec, cache, chunk_tokens=256)
    assert c.codec.flags == (1 if codec == "int4" and head_dim >= 64 else 0)
    tokens = prompt(3 * 256 + 10)  # 3 whole chunks stored
    blocks = save(c, cache, "s", tokens)
    assert c.counters["saved_chunks"] == 3 * CFG.layers, c.counters
    saved = [kv[blocks[:6]].float() for kv in cache.layers]
    ratio = 3 * CFG.layers * c.chunk_bytes / c.counters["encoded_bytes"]
    assert ratio >= min_ratio, (codec, ratio)

    dst = cache.allocate(len(tokens))
    for kv in cache.layers:
        kv[dst] = 0
    hit, failed = load(c, "l", tokens, dst)
    assert hit == 3 * 256, hit
    assert failed == [] and c.counters["loaded_chunks"] == 3 * CFG.layers, c.counters
    assert not c.loads_in_place  # decoded into the blocks here, not copied by the agent
    for kv, want in zip(cache.layers, saved):
        got = kv[dst[:6]].float()
        err = ((got - want).norm() / want.norm()).item()
        assert err <= max_err, (codec, err)
        if codec == "lossless":
            assert torch.equal(got, want)


def test_the_codec_is_part_of_the_chunks_identity():
    cache = PagedKVCache(CFG, num_blocks=16, block_size=128, bhnc=True)
    int8 = connector("codec-key", "int8", cache, chunk_tokens=256)
    tokens = prompt(2 * 256 + 7)
    save(int8, cache, "s", tokens)
    assert int8.counters["saved_chunks"] == 2 * CFG.layers
    for other in ("none", "int4", "lossless"):
        reader = connector("codec-key", other, cache, chunk_tokens=256, share_caches=False)
        assert reader.get_num_new_matched_tokens(f"r-{other}", tokens, 0) == 0, other
        reader.request_finished(f"r-{other}")
    again = connector("codec-key", "int8", cache, chunk_tokens=256)
    assert again.get_num_new_matched_tokens("r-int8", tokens, 0) == 2 * 256
    again.request_finished("r-int8")


@pytest.mark.parametrize("codec", ["int8", "lossless"])
def test_a_chunk_changed_after_encoding_is_never_decoded_into_the_blocks(codec):
    cache = PagedKVCache(CFG, num_blocks=16, block_size=128, bhnc=True)
    c = connector(f"codec-bad-{codec}", codec, cache, chunk_tokens=256)
    tokens = prompt(2 * 256 + 5)
    save(c, cache, "s", tokens)
    # Layer 2's second chunk replaced by its own bytes with one bit flipped in the
    # payload, stored under its key: the agent's checksum is of these bytes, so
    # only the codec's own checksum can tell.
    key = c.keys(tokens, 2)[1]
    st = c.client.alloc_staging(c.stage.chunk_bytes)
    u8 = torch.frombuffer(memoryview(st), dtype=torch.uint8)
    assert c.client.retrieve(st, [key], [0], [st.size]) == ["SUCCESS"]
    length = 64 + int.from_bytes(u8[32:40].numpy().tobytes(), "little")  # header's payload_len
    assert 64 < length <= st.size
    u8[64 + (length - 64) // 2] ^= 0x08
    assert c.client.remove([key]) == ["SUCCESS"]
    assert c.client.store(st, [key], [0], [length]) == ["SUCCESS"]

    dst = cache.allocate(len(tokens))
    for kv in cache.layers:
        kv[dst] = 7
    hit, failed = load(c, "l", tokens, dst)
    assert hit == 2 * 256, hit
    assert failed == [2], failed
    assert c.counters["decode_failures"] == 1, c.counters
    # The corrupt chunk's blocks keep what they held (its first chunk decoded).
    assert bool((cache.layers[2][dst[2:4]] == 7).all())
    assert not bool((cache.layers[2][dst[:2]] == 7).all())


def forward_with_hit(codec, name):
    """A prompt saved through a connector of codec, then a second prompt sharing
    its first 256 tokens prefilled from the loaded chunks: its logits."""
    cache = PagedKVCache(CFG, num_blocks=32, block_size=128, bhnc=True)
    c = connector(name, codec, cache, chunk_tokens=256)
    torch.manual_seed(5)
    a = prompt(300)
    blocks_a = cache.allocate(len(a))
    MODEL.forward(a, 0, cache, blocks_a,
                  layer_done=lambda l: c.save_kv_layer("a", l, a, blocks_a))
    c.wait_for_save()
    c.request_finished("a")
    b = a[:256] + prompt(40)
    blocks_b = cache.allocate(len(b))
    hit = c.get_num_new_matched_tokens("b", b, 0)
    assert hit == 256, hit
    c.update_state_after_alloc("b", blocks_b, hit)
    c.start_load_kv("b")
    logits = MODEL.forward(b[hit:], hit, cache, blocks_b,
                           layer_hook=lambda l: c.wait_for_layer_load("b", l))
    c.request_finished("b")
    return logits


def test_a_prefix_hit_through_the_model():
    plain = forward_with_hit("none", "codec-model-none")
    assert torch.equal(forward_with_hit("lossless", "codec-model-lossless"), plain)
    int8 = forward_with_hit("int8", "codec-model-int8")
    assert int8.argmax(-1).tolist() == plain.argmax(-1).tolist()
    diff = (int8.float() - plain.float()).abs().max().item()
    assert 0 < diff <= 0.05 * plain.float().abs().max().item(), diff


def test_a_codec_refuses_what_it_cannot_encode():
    cache = PagedKVCache(LlamaConfig(dtype=torch.float32), num_blocks=4, block_size=16)
    with pytest.raises(ValueError, match="16-bit"):
        connector("codec-f32", "int8", cache, chunk_tokens=32)
    with pytest.raises(ValueError, match="kv_codec must be one of"):
        DpukvConnector(None, "x", kv_codec="int3")
