"""The Python bindings against a real agent: store tensors' bytes, look them up,
retrieve them, and check them. Usage: test_dpukv.py BUILD_DIR SOCKET"""
import json
import sys

sys.path.insert(0, sys.argv[1])  # the compiled _dpukv
sys.path.insert(0, __import__("os").path.dirname(__file__))  # the dpukv package
import dpukv  # noqa: E402

sock = sys.argv[2]
c = dpukv.Client(sock, model=dpukv.model_id("py-model"))
buf = c.alloc_staging(1 << 20)
mv = memoryview(buf)
tokens = list(range(1000))
keys = dpukv.chunk_keys(dpukv.model_id("py-model"), tokens, 256)
assert len(keys) == 3, keys
for i in range(3):
    mv[i * 4096:(i + 1) * 4096] = bytes([(i * 7 + j) % 256 for j in range(4096)])
st = c.store(buf, keys, [0, 4096, 8192], [4096] * 3)
assert st == ["SUCCESS"] * 3, st
assert c.lookup(keys) == 3
other = dpukv.chunk_keys(dpukv.model_id("py-model"), [5] + tokens[1:], 256)
assert c.lookup(other) == 0  # a different first token changes every key
mv[0:12288] = bytes(12288)
assert c.retrieve(buf, keys, [0, 4096, 8192], [4096] * 3) == ["SUCCESS"] * 3
for i in range(3):
    assert bytes(mv[i * 4096:(i + 1) * 4096]) == bytes([(i * 7 + j) % 256 for j in range(4096)])
assert json.loads(c.stats())["stores"] == 3
try:
    c.store(buf, keys, [0], [4096])
    raise AssertionError("mismatched lists were accepted")
except ValueError:
    pass
# Every client call: contains, prefetch, pins, async forms, remove, clear, close.
assert c.contains(keys + other[:1]) == ["SUCCESS"] * 3 + ["NOT_FOUND"]
assert c.prefetch(keys[:1]) == ["SUCCESS"]
assert c.lookup(keys, pin=True) == 3
c.unpin(keys)
p = c.submit_retrieve(buf, keys, [0, 4096, 8192], [4096] * 3)
assert c.wait(p) == ["SUCCESS"] * 3 and c.poll(p)
more = dpukv.keys_from_block_ids(dpukv.model_id("py-model"), [900, 901])
p = c.submit_store(buf, more, [0, 4096], [4096, 4096])
assert c.wait(p) == ["SUCCESS"] * 2
assert c.remove(more[:1]) == ["SUCCESS"] and c.contains(more[:1]) == ["NOT_FOUND"]
assert c.max_staging_bytes > 0
assert c.clear() == 4  # the three chunks and more[1]
assert c.lookup(keys) == 0
c.close()
try:
    c.lookup(keys)
    raise AssertionError("a closed client answered")
except RuntimeError:
    pass
print("python bindings: ok")
