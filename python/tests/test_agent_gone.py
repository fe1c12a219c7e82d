"""The Python client and the connector when the agent goes away and comes back,
against real agent processes this test starts and kills: no call may answer
SUCCESS (or a hit) for an agent that is not there; the client reconnects once an
agent is back; a load whose agent went away between lookup and load raises
LoadMiss on every layer, never leaves blocks unfilled behind a normal return.
Run by pytest (tests/python_test.sh --pytest --own-agent, which exports
DPUKV_PY_PACKAGE_DIR, the folder of the dpukv package, and DPUKV_BIN), or as a
script: test_agent_gone.py PACKAGE_DIR DPUKV_BINARY. Each test starts its own
agents."""
import atexit
import os
import signal
import subprocess
import sys
import tempfile
import time

if __name__ == "__main__":  # a script: PACKAGE_DIR DPUKV_BINARY
    os.environ["DPUKV_PY_PACKAGE_DIR"], os.environ["DPUKV_BIN"] = sys.argv[1:3]
PKG = os.environ["DPUKV_PY_PACKAGE_DIR"]
sys.path.insert(0, PKG)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import dpukv  # noqa: E402
from dpukv.connector import DpukvConnector, LoadMiss  # noqa: E402
from reference_model import LlamaConfig, PagedKVCache  # noqa: E402

BIN = os.environ["DPUKV_BIN"]
tmp = tempfile.mkdtemp()
SOCK = os.path.join(tmp, "agent.sock")
started = []  # every agent, killed at exit however the test ends (a live one holds ctest's pipe)


@atexit.register
def _kill_agents():
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


# A client in a process of its own, stopped with SIGSTOP by the starvation test.
CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
from dpukv import _dpukv as d
c = d.Client(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
print(c.connected(), c.lookup([]), flush=True)
"""


def fresh():
    """No agent of an earlier test left (one that failed midway), no socket file."""
    _kill_agents()
    if os.path.exists(SOCK):
        os.unlink(SOCK)


def start_agent():
    p = subprocess.Popen([BIN, "--log-level", "warning", "agent", "--socket", SOCK,
                          "--memory-bytes", "64M", "--max-chunk-size", "1M",
                          "--metrics-port", "0"])
    started.append(p)
    deadline = time.monotonic() + 120  # a busy machine: wait for the socket, not a time
    while not os.path.exists(SOCK):
        assert p.poll() is None, f"the agent exited with {p.returncode}"
        assert time.monotonic() < deadline, "the agent never listened"
        time.sleep(0.02)
    return p


def stop_agent(p):
    p.send_signal(signal.SIGKILL)
    p.wait()
    if os.path.exists(SOCK):
        os.unlink(SOCK)  # a killed agent leaves its socket file


def raises_unavailable(fn, *args):
    try:
        r = fn(*args)
    except dpukv.AgentUnavailable:
        return
    raise AssertionError(f"{fn.__name__} answered {r!r} with no agent")


def eventually(fn, what):
    deadline = time.monotonic() + 60
    while True:
        try:
            return fn()
        except dpukv.AgentUnavailable:
            assert time.monotonic() < deadline, f"{what}: never reconnected"
            time.sleep(0.05)


def test_a_client_whose_agent_died_answers_unavailable_then_reconnects():
    fresh()
    agent = start_agent()
    model = dpukv.model_id("gone-model")
    c = dpukv.Client(SOCK, model=model)
    buf = c.alloc_staging(1 << 20)
    keys = dpukv.chunk_keys(model, list(range(768)), 256)
    assert c.store(buf, keys, [0, 4096, 8192], [4096] * 3) == ["SUCCESS"] * 3
    assert c.contains(keys) == ["SUCCESS"] * 3

    # ---- The agent dies: every call says so; none answers SUCCESS or a hit.
    stop_agent(agent)
    raises_unavailable(c.contains, keys)
    raises_unavailable(c.remove, keys)
    raises_unavailable(c.prefetch, keys)
    raises_unavailable(c.lookup, keys)
    raises_unavailable(c.store, buf, keys, [0, 4096, 8192], [4096] * 3)
    raises_unavailable(c.retrieve, buf, keys, [0, 4096, 8192], [4096] * 3)
    raises_unavailable(c.stats)
    assert not c.connected()

    # ---- A new agent: the same client object reconnects (and exports its staging
    # again), and answers for the new agent's (empty) cache.
    agent = start_agent()
    assert eventually(lambda: c.lookup(keys), "lookup") == 0
    assert c.contains(keys) == ["NOT_FOUND"] * 3
    assert c.store(buf, keys, [0, 4096, 8192], [4096] * 3) == ["SUCCESS"] * 3
    assert c.retrieve(buf, keys, [0, 4096, 8192], [4096] * 3) == ["SUCCESS"] * 3
    assert c.lookup(keys) == 3
    stop_agent(agent)


def test_loads_whose_agent_went_miss_and_never_return_stale_or_unfilled_blocks():
    fresh()
    agent = start_agent()
    # ---- The connector: a hit looked up, then the agent goes before the load.
    torch.manual_seed(1)
    cfg = LlamaConfig(dtype=torch.bfloat16)
    cache = PagedKVCache(cfg, num_blocks=64, block_size=16)
    conn = DpukvConnector(dpukv.Client(SOCK, model=dpukv.model_id("gone-llama")), "gone-llama",
                          chunk_tokens=32, staging_bytes=4 << 20)
    conn.register_kv_caches(cache.layers)
    prompt = torch.randint(0, cfg.vocab_size, (100,)).tolist()
    src = cache.allocate(len(prompt))
    for kv in cache.layers:
        kv[:, src] = torch.randn(kv[:, src].shape).to(kv.dtype)
    for layer in range(cfg.layers):
        conn.save_kv_layer("save", layer, prompt, src)
    conn.wait_for_save()
    assert conn.counters["saved_chunks"] == 3 * cfg.layers, conn.counters
    assert conn.get_num_new_matched_tokens("r", prompt, 0) == 96
    dst = cache.allocate(96)
    conn.update_state_after_alloc("r", dst, 96)
    stop_agent(agent)
    conn.start_load_kv("r")  # does not raise: the failure is the layers' to report
    for layer in range(cfg.layers):
        try:
            conn.wait_for_layer_load("r", layer)
            raise AssertionError(f"layer {layer} loaded with no agent")
        except LoadMiss:
            pass
        try:  # and again: a failed layer never turns into a success
            conn.wait_for_layer_load("r", layer)
            raise AssertionError(f"layer {layer} loaded on the second wait")
        except LoadMiss:
            pass
    conn.request_finished("r")
    assert all(conn.load_free)
    # With no agent: a lookup is a miss, a save a counted failure; nothing raises.
    assert conn.get_num_new_matched_tokens("m", prompt, 0) == 0
    failures = conn.counters["save_failures"]
    conn.save_kv_layer("m", 0, prompt, src)
    conn.wait_for_save()
    assert conn.counters["save_failures"] == failures + 3, conn.counters
    conn.request_finished("m")

    # The agent goes while loads are in flight: whatever the timing, each layer
    # either holds the saved bytes or raises LoadMiss.
    agent = start_agent()
    eventually(lambda: conn.client.lookup(conn.keys(prompt, 0)), "connector lookup")
    for layer in range(cfg.layers):
        conn.save_kv_layer("save2", layer, prompt, src)
    conn.wait_for_save()
    assert conn.get_num_new_matched_tokens("q", prompt, 0) == 96
    dst = cache.allocate(96)
    for kv in cache.layers:
        kv[:, dst] = 0
    conn.update_state_after_alloc("q", dst, 96)
    conn.start_load_kv("q")
    stop_agent(agent)
    for layer in range(cfg.layers):
        try:
            conn.wait_for_layer_load("q", layer)
            assert torch.equal(cache.layers[layer][:, dst], cache.layers[layer][:, src[:6]]), layer
        except LoadMiss:
            pass
    conn.request_finished("q")


def test_saves_refused_by_an_absent_agent_give_their_staging_slots_back():
    # Issue 34.4: a save that could not start kept its slots counted as in use for
    # the connector's life, and every later save waited for stores that never were.
    fresh()
    agent = start_agent()
    torch.manual_seed(2)
    cfg = LlamaConfig(dtype=torch.bfloat16)
    cache = PagedKVCache(cfg, num_blocks=64, block_size=16)
    conn = DpukvConnector(dpukv.Client(SOCK, model=dpukv.model_id("gone-saves")), "gone-saves",
                          chunk_tokens=32, staging_bytes=4 << 20)
    conn.register_kv_caches(cache.layers)
    prompt = torch.randint(0, cfg.vocab_size, (100,)).tolist()
    src = cache.allocate(len(prompt))
    stop_agent(agent)
    for layer in range(cfg.layers):
        conn.save_kv_layer("away", layer, prompt, src)
    conn.wait_for_save()  # a store sent before the client saw the agent go fails here
    assert conn.saving_chunks == 0, conn.saving_chunks
    assert conn.counters["save_failures"] == 3 * cfg.layers, conn.counters
    # The agent is back: saves are stored again, and the step's collect does not
    # have to wait for anything but them.
    agent = start_agent()
    eventually(lambda: conn.client.lookup(conn.keys(prompt, 0)), "connector lookup")
    for layer in range(cfg.layers):
        conn.save_kv_layer("back", layer, prompt, src)
    assert conn.saving_chunks == 3 * cfg.layers
    conn.wait_for_save()
    assert conn.saving_chunks == 0
    assert conn.counters["saved_chunks"] == 3 * cfg.layers, conn.counters
    stop_agent(agent)


def test_a_client_started_before_its_agent_connects_when_the_agent_appears():
    # Issue 34.3: an engine comes up with its agent absent; lookups miss, staging is
    # kept, and once an agent listens the same client stores and loads.
    fresh()
    model = dpukv.model_id("absent-first")
    try:
        dpukv.Client(SOCK, model=model)
        raise AssertionError("a plain client connected to no agent")
    except dpukv.AgentUnavailable:
        pass
    c = dpukv.Client(SOCK, model=model, absent_ok=True)
    assert not c.connected()
    buf = c.alloc_staging(1 << 20)  # kept; exported once the agent is there
    keys = dpukv.chunk_keys(model, list(range(512)), 256)
    raises_unavailable(c.lookup, keys)
    agent = start_agent()
    assert eventually(lambda: c.lookup(keys), "lookup") == 0
    assert c.connected()
    memoryview(buf)[:8192] = bytes(range(256)) * 32
    assert c.store(buf, keys, [0, 4096], [4096] * 2) == ["SUCCESS"] * 2
    memoryview(buf)[:8192] = bytes(8192)
    assert c.retrieve(buf, keys, [0, 4096], [4096] * 2) == ["SUCCESS"] * 2
    assert bytes(memoryview(buf)[:8192]) == bytes(range(256)) * 32
    stop_agent(agent)


def test_a_side_starved_of_cpu_for_5_s_is_slow_not_gone():
    fresh()
    model = dpukv.model_id("gone-model")
    keys = dpukv.chunk_keys(model, list(range(768)), 256)
    # ---- Starvation: an inference host's CPUs are often saturated. A side that gets
    # no CPU for 5 s (here: stopped with SIGSTOP, the extreme of starvation) is slow,
    # not gone: the session survives on both sides, with no reconnection.
    import json  # noqa: E402
    agent = start_agent()
    s = dpukv.Client(SOCK, model=model)
    opened = json.loads(eventually(s.stats, "stats"))["sessions_opened"]
    agent.send_signal(signal.SIGSTOP)
    time.sleep(5)  # the stimulus: 5 s without CPU
    agent.send_signal(signal.SIGCONT)
    assert s.lookup(keys) == 0 and s.connected()
    assert json.loads(s.stats())["sessions_opened"] == opened, "the client reconnected"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, PKG, SOCK], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True)
    started.append(child)
    assert child.stdout.readline().strip() == "ready"
    opened = json.loads(s.stats())["sessions_opened"]
    child.send_signal(signal.SIGSTOP)
    time.sleep(5)
    child.send_signal(signal.SIGCONT)
    out, _ = child.communicate("go\n", timeout=120)
    assert out.strip() == "True 0", out
    stats = json.loads(s.stats())
    assert stats["sessions_opened"] == opened, "the starved client was dropped and reconnected"
    stop_agent(agent)


if __name__ == "__main__":  # every test, in order; a failure ends the run with its traceback
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
    print("agent gone: ok")
