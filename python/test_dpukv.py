"""The Python bindings against a real agent: store tensors' bytes, look them up,
retrieve them, and check them. Usage: test_dpukv.py BUILD_DIR SOCKET"""
import json
import sys

sys.path.insert(0, sys.argv[1])
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
print("python bindings: ok")
