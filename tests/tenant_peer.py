#!/usr/bin/env python3
"""One client of cli.tenants (tests/cli_tenants_test.sh), run as whatever uid the
test gives it (setpriv): it does one thing to the agent through the project's
client library (the C ABI, over ctypes) and prints what it saw as one JSON line.

Chunks are the keys of a prompt (its tokens drawn from SEED), 4 KiB each, every
byte of chunk i equal to (FILL + i) % 256: a reader can tell whose bytes it got.

    tenant_peer.py PYDIR SOCK store    SEED N FILL
    tenant_peer.py PYDIR SOCK retrieve SEED N      -> the first byte of each, or a status
    tenant_peer.py PYDIR SOCK lookup   SEED N      -> leading hits
    tenant_peer.py PYDIR SOCK remove   SEED N
    tenant_peer.py PYDIR SOCK clear
    tenant_peer.py PYDIR SOCK stats
    tenant_peer.py PYDIR SOCK hold     N           -> staging of N chunks exported and
        held (HOLDING printed) until READY is in the file named by $WATCH_GO
    tenant_peer.py PYDIR SOCK watch    SEED        -> every event until the chunk of
        prompt SEED (1 chunk), which this client stores itself once subscribed and
        once READY is in the file named by $WATCH_GO: what came before it in the
        feed is all the agent sent this tenant (the feed is in order)
"""
import json
import os
import random
import sys
import time

CHUNK = 4096
MODEL = "tenant-test-model"


def main():
    pydir, sock, action = sys.argv[1], sys.argv[2], sys.argv[3]
    args = [int(a) for a in sys.argv[4:]]
    sys.path.insert(0, pydir)
    from dpukv import _ctypes_client as d  # noqa: E402  (the library named by DPUKV_CLIENT_LIB)

    c = d.Client(sock, d.model_id(MODEL))

    def keys(seed, n):
        rng = random.Random(seed)
        tokens = [rng.randrange(1, 50000) for _ in range(256 * n)]
        return d.chunk_keys(d.model_id(MODEL), tokens, 256)

    out = {"action": action, "uid": os.getuid()}
    try:
        act(c, d, keys, action, args, out)
    except Exception as e:  # what the agent refused, as the caller sees it
        out["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out), flush=True)


def wait_go():
    go = os.environ["WATCH_GO"]
    deadline = time.monotonic() + 120
    while not (os.path.exists(go) and open(go).read().strip() == "READY"):
        if time.monotonic() > deadline:
            sys.exit("never told to go on")
        time.sleep(0.02)


def act(c, d, keys, action, args, out):
    if action == "hold":
        st = c.alloc_staging(CHUNK * args[0])
        memoryview(st).cast("B")[:CHUNK] = b"\1" * CHUNK  # touched: exported and mapped
        print("HOLDING", flush=True)
        wait_go()
        out["held"] = CHUNK * args[0]
    elif action in ("store", "retrieve"):
        seed, n = args[0], args[1]
        ks = keys(seed, n)
        st = c.alloc_staging(CHUNK * n)
        view = memoryview(st).cast("B")
        offs, lens = [i * CHUNK for i in range(n)], [CHUNK] * n
        if action == "store":
            for i in range(n):
                view[i * CHUNK:(i + 1) * CHUNK] = bytes([(args[2] + i) % 256]) * CHUNK
            out["status"] = c.store(st, ks, offs, lens)
        else:
            view[:] = b"\0" * (CHUNK * n)
            try:
                status = c.retrieve(st, ks, offs, lens)
            except d.AgentUnavailable as e:  # every chunk missed: the call's own status
                status = [str(e).rsplit(": ", 1)[-1]] * n
            out["status"] = status
            out["first_bytes"] = [view[i * CHUNK] if status[i] == "SUCCESS" else None
                                  for i in range(n)]
            out["uniform"] = all(len(set(view[i * CHUNK:(i + 1) * CHUNK])) == 1
                                 for i in range(n) if status[i] == "SUCCESS")
    elif action == "lookup":
        out["hits"] = c.lookup(keys(args[0], args[1]))
    elif action == "remove":
        out["status"] = c.remove(keys(args[0], args[1]))
    elif action == "clear":
        out["removed"] = c.clear()
    elif action == "stats":
        out["stats"] = json.loads(c.stats())
    elif action == "watch":
        marker = keys(args[0], 1)[0]
        c.subscribe_events()
        print("SUBSCRIBED", flush=True)
        wait_go()
        deadline = time.monotonic() + 120
        st = c.alloc_staging(CHUNK)
        memoryview(st).cast("B")[:] = b"\x77" * CHUNK
        assert c.store(st, [marker], [0], [CHUNK]) == ["SUCCESS"]
        seen = []
        while time.monotonic() < deadline:
            events, lost = c.take_events()
            if lost:
                sys.exit("watch: events were lost")
            for key, stored in events:
                if key.prefix_hash == marker.prefix_hash and stored:
                    out["events_before_marker"] = seen
                    return
                seen.append({"prefix_hash": "%016x" % key.prefix_hash, "stored": stored,
                             "world_size": key.world_size, "rank": key.rank})
            time.sleep(0.01)
        sys.exit("watch: the marker's event never came")
    else:
        sys.exit(f"unknown action {action}")


if __name__ == "__main__":
    main()
