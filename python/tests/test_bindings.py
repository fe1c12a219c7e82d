"""The package's compiled client against a real agent: store bytes, look them up,
retrieve and check them; every call of the client; a closed client refuses."""
import json

import dpukv
import pytest

MODEL = dpukv.model_id("py-model")


def test_the_compiled_client_is_the_one_imported():
    # The build's package carries its extension: the ctypes fallback would hide a
    # broken build behind a working subset.
    assert dpukv.client_kind == "compiled"
    assert dpukv._native.__name__ == "dpukv._dpukv"


def pattern(i):
    return bytes([(i * 7 + j) % 256 for j in range(4096)])


@pytest.fixture
def stored(agent_socket):
    """A client, its staging, and three chunks of a 1000-token prefix stored."""
    c = dpukv.Client(agent_socket, model=MODEL)
    buf = c.alloc_staging(1 << 20)
    mv = memoryview(buf)
    keys = dpukv.chunk_keys(MODEL, list(range(1000)), 256)
    assert len(keys) == 3, keys
    for i in range(3):
        mv[i * 4096:(i + 1) * 4096] = pattern(i)
    assert c.store(buf, keys, [0, 4096, 8192], [4096] * 3) == ["SUCCESS"] * 3
    return c, buf, keys


def test_store_lookup_retrieve_byte_for_byte(stored):
    c, buf, keys = stored
    assert c.lookup(keys) == 3
    other = dpukv.chunk_keys(MODEL, [5] + list(range(1, 1000)), 256)
    assert c.lookup(other) == 0  # a different first token changes every key
    mv = memoryview(buf)
    mv[0:12288] = bytes(12288)
    assert c.retrieve(buf, keys, [0, 4096, 8192], [4096] * 3) == ["SUCCESS"] * 3
    for i in range(3):
        assert bytes(mv[i * 4096:(i + 1) * 4096]) == pattern(i)
    assert json.loads(c.stats())["stores"] == 3


def test_mismatched_lists_are_refused(stored):
    c, buf, keys = stored
    with pytest.raises(ValueError):
        c.store(buf, keys, [0], [4096])


def test_every_call(stored):
    c, buf, keys = stored
    other = dpukv.chunk_keys(MODEL, [5] + list(range(1, 1000)), 256)
    assert c.contains(keys + other[:1]) == ["SUCCESS"] * 3 + ["NOT_FOUND"]
    assert c.prefetch(keys[:1]) == ["SUCCESS"]
    assert c.lookup(keys, pin=True) == 3
    c.unpin(keys)
    p = c.submit_retrieve(buf, keys, [0, 4096, 8192], [4096] * 3)
    assert c.wait(p) == ["SUCCESS"] * 3 and c.poll(p)
    more = dpukv.keys_from_block_ids(MODEL, [900, 901])
    p = c.submit_store(buf, more, [0, 4096], [4096, 4096])
    assert c.wait(p) == ["SUCCESS"] * 2
    assert c.remove(more[:1]) == ["SUCCESS"] and c.contains(more[:1]) == ["NOT_FOUND"]
    assert c.max_staging_bytes > 0
    assert c.clear() == 4  # the three chunks and more[1]
    assert c.lookup(keys) == 0


def test_a_closed_client_refuses(stored):
    c, _, keys = stored
    c.close()
    with pytest.raises(RuntimeError):
        c.lookup(keys)


def test_rows_land_in_memory_shared_in_place(stored):
    """Issue 47: a bytearray this process keeps using, shared in place (its bytes
    kept), gets each chunk in its rows through submit_retrieve_rows; a rows array
    of the wrong size or type is refused before anything is sent."""
    import array
    import ctypes
    c, buf, keys = stored
    assert c.agent_rows
    mem = bytearray(b"\x5a" * (64 << 10))
    addr = ctypes.addressof((ctypes.c_char * len(mem)).from_buffer(mem))
    shared = c.share_memory(addr, len(mem))
    assert bytes(mem) == b"\x5a" * (64 << 10)
    base = addr - shared.data_ptr  # where mem starts against the shared pages (<= 0)
    # Three chunks of 4096 bytes, four rows of 1024 each, scattered backwards.
    rows = array.array("Q", [base + 40000 - 1024 * i for i in range(12)])
    p = c.submit_retrieve_rows(shared, keys, rows, 1024, 4, 4)
    assert c.wait(p) == ["SUCCESS"] * 3
    want = bytearray(b"\x5a" * (64 << 10))
    for i in range(12):
        at = 40000 - 1024 * i
        want[at:at + 1024] = pattern(i // 4)[(i % 4) * 1024:(i % 4 + 1) * 1024]
    assert mem == want  # every row, and nothing else
    with pytest.raises(ValueError):
        c.submit_retrieve_rows(shared, keys, rows[:11], 1024, 4, 4)  # one row short
    with pytest.raises(ValueError):
        c.submit_retrieve_rows(shared, keys, array.array("I", range(12)), 1024, 4, 4)
