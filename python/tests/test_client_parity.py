"""The two Python clients are one surface (issue 36): the compiled module
(dpukv._dpukv) and the ctypes client over the C ABI (dpukv._ctypes_client, what a
GPU machine's own interpreter loads) have the same public functions, classes and
Client members, and behave alike against a real agent: asynchronous calls polled
(never blocking) and waited for, contains, prefetch, the staging limit, keys from
block ids. The ctypes client once lacked poll, so the connector waited for every
step's saves on GPU machines.

Run by pytest (tests/python_test.sh --pytest), with DPUKV_CLIENT_LIB naming
libdpukv_client.so for the ctypes client; the agent's socket in DPUKV_TEST_SOCKET."""
import importlib
import inspect
import json
import os
import sys
import time

sys.path.insert(0, os.environ["DPUKV_PY_PACKAGE_DIR"])
import dpukv  # noqa: E402,F401  (the package; its two clients below)

compiled = importlib.import_module("dpukv._dpukv")
ctypes_client = importlib.import_module("dpukv._ctypes_client")
SOCKET = os.environ["DPUKV_TEST_SOCKET"]


def surface(mod):
    """A client module's public functions and classes (not what it imports)."""
    out = set()
    for name, obj in vars(mod).items():
        if name.startswith("_") or inspect.ismodule(obj):
            continue
        if inspect.isclass(obj) or callable(obj):
            if getattr(obj, "__module__", mod.__name__) in (mod.__name__, "dpukv._dpukv",
                                                             "builtins"):
                out.add(name)
    return out


def members(cls):
    return {n for n in dir(cls) if not n.startswith("_")}


def test_both_clients_have_the_same_surface():
    assert surface(compiled) - surface(ctypes_client) == set(), "missing from the ctypes client"
    assert surface(ctypes_client) - surface(compiled) == set(), "missing from the compiled client"
    assert members(compiled.Client) == members(ctypes_client.Client)


def pybind_params(fn):
    """Parameter names of a compiled function from pybind11's signature line
    ("name(a: int, b: list[int] = 256) -> ..."), self left out; None when it has no
    single signature (an overload set, a property)."""
    doc = (getattr(fn, "__doc__", None) or "").split("\n", 1)[0]
    name = getattr(fn, "__name__", "")
    if not doc.startswith(name + "(") or "Overloaded" in doc:
        return None
    inside, depth, cur, out = doc[len(name) + 1:], 0, "", []
    for ch in inside:  # split the argument list at top-level commas
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    names = [a.split(":")[0].split("=")[0].strip() for a in out]
    return [n for n in names if n and n != "self" and not n.startswith("*")]


def python_params(fn):
    try:
        return [n for n in inspect.signature(fn).parameters if n != "self"]
    except (TypeError, ValueError):
        return None


def test_both_clients_take_the_same_arguments():
    """Same names in the same order, for every function and Client method whose
    compiled signature is one line (overloads and properties are left out)."""
    pairs = [(n, getattr(compiled, n), getattr(ctypes_client, n))
             for n in surface(compiled) & surface(ctypes_client)
             if not inspect.isclass(getattr(compiled, n))]
    pairs += [("Client." + n, getattr(compiled.Client, n), getattr(ctypes_client.Client, n))
              for n in members(compiled.Client) & members(ctypes_client.Client)]
    compared, differ = 0, []
    for name, a, b in sorted(pairs, key=lambda p: p[0]):
        pa, pb = pybind_params(a), python_params(b)
        if pa is None or pb is None:
            continue
        compared += 1
        if pa != pb:
            differ.append(f"{name}: compiled {pa}, ctypes {pb}")
    assert compared >= 10, f"only {compared} signatures could be read"
    assert not differ, "\n".join(differ)


def roundtrip(mod, tag):
    """Store two chunks asynchronously, poll until done (never blocking), retrieve
    one; contains, prefetch, the staging limit. Returns what the client answered."""
    model = mod.model_id("parity-" + tag)
    c = mod.Client(SOCKET, model=model)
    s = c.alloc_staging(1 << 20)
    assert {"size", "gpu", "device_ptr"} <= set(dir(s)) and (s.size, s.gpu) == (1 << 20, False)
    mv = memoryview(s).cast("B")
    mv[:8192] = bytes(range(256)) * 32
    keys = mod.chunk_keys(model, list(range(3 * 32)), 32)
    p = c.submit_store(s, keys[:2], [0, 4096], [4096, 4096])
    deadline = time.monotonic() + 60
    polls = 0
    while not c.poll(p):  # never blocks: a busy machine just polls longer
        polls += 1
        assert time.monotonic() < deadline, "the store never finished"
        time.sleep(0.001)
    assert c.poll(p) is True  # finished stays finished
    stored = c.wait(p)  # at once: the statuses poll collected
    contains = c.contains(keys)
    prefetch = c.prefetch(keys[:2])
    mv[:4096] = bytes(4096)
    got = c.retrieve(s, keys[:1], [0], [4096])
    same = bytes(mv[:4096]) == bytes(range(256)) * 16
    limit = c.max_staging_bytes
    ids = [k.prefix_hash for k in mod.keys_from_block_ids(model, [11, 22, 33])]
    stats = json.loads(c.stats())
    c.close()
    return {"stored": stored, "contains": contains, "prefetch": prefetch, "retrieved": got,
            "same": same, "limit": limit, "ids": ids, "stores": stats["stores"] > 0}


def test_both_clients_behave_alike_against_an_agent():
    a = roundtrip(compiled, "compiled")
    b = roundtrip(ctypes_client, "ctypes")
    assert a["stored"] == ["SUCCESS", "SUCCESS"] and a["contains"] == [
        "SUCCESS", "SUCCESS", "NOT_FOUND"], a
    assert a["same"] and a["retrieved"] == ["SUCCESS"] and a["limit"] > 0, a
    assert len(set(a["ids"])) == 3, a
    # The same answers from both, but for the ids (another model, other keys).
    for k in ("stored", "contains", "prefetch", "retrieved", "same", "limit", "stores"):
        assert a[k] == b[k], (k, a[k], b[k])
    m = compiled.model_id("ids")
    assert ([k.prefix_hash for k in compiled.keys_from_block_ids(m, [1, 2])] ==
            [k.prefix_hash for k in ctypes_client.keys_from_block_ids(m, [1, 2])])


def test_a_ticket_polled_to_the_end_is_spent_in_both():
    for mod in (compiled, ctypes_client):
        model = mod.model_id("spent")
        c = mod.Client(SOCKET, model=model)
        s = c.alloc_staging(1 << 20)
        keys = mod.chunk_keys(model, list(range(32)), 32)
        p = c.submit_store(s, keys, [0], [4096])
        while not c.poll(p):
            time.sleep(0.001)
        assert c.wait(p) == ["SUCCESS"] and c.wait(p) == ["SUCCESS"], mod.__name__
        c.close()
