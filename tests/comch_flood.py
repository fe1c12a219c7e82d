#!/usr/bin/env python3
"""A hostile local peer of the agent's socket (issue 45.1-2), for cli_flood_test.sh.

Opens up to --conns connections that never say HELLO (or, with --hello-ms, say HELLO
with that heartbeat and then stay silent), reconnects each one the agent closes, and
stops after --seconds of flooding (the size of the attack, not a wait). Prints one
JSON line: connections made, closed by the agent, refusals seen (by reason), and the
most held open at once.
"""
import argparse
import errno
import json
import selectors
import socket
import struct
import time

MAGIC, VERSION = 0x48434B44, 1
HELLO, HELLO_ACK, REFUSED = 1, 2, 9


def hello(heartbeat_ms):
    return struct.pack("<IHHII", MAGIC, VERSION, HELLO, 16, 0) + struct.pack(
        "<IIQ", 4080, heartbeat_ms, 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("socket")
    ap.add_argument("--conns", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--hello-ms", type=int, default=0, help="say HELLO with this heartbeat")
    a = ap.parse_args()
    sel = selectors.DefaultSelector()
    out = {"made": 0, "closed": 0, "refused": {}, "acked": 0, "max_open": 0, "again": 0}
    open_ = set()

    def connect_one():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.setblocking(False)
        try:
            s.connect(a.socket)
        except OSError as e:
            s.close()
            if e.errno in (errno.EAGAIN, errno.ECONNREFUSED):
                out["again"] += 1
                return False
            raise
        if a.hello_ms:
            try:
                s.send(hello(a.hello_ms))
            except OSError:
                pass
        sel.register(s, selectors.EVENT_READ)
        open_.add(s)
        out["made"] += 1
        out["max_open"] = max(out["max_open"], len(open_))
        return True

    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        # Keep --conns connections: reconnect what the agent closed.
        while len(open_) < a.conns and time.monotonic() < end:
            if not connect_one():
                break
        for key, _ in sel.select(timeout=0.01):
            s = key.fileobj
            try:
                msg = s.recv(256)
            except OSError:
                msg = b""
            if len(msg) >= 16:
                typ = struct.unpack_from("<IHHII", msg)[2]
                if typ == REFUSED and len(msg) >= 32:
                    reason = struct.unpack_from("<I", msg, 16)[0]
                    out["refused"][str(reason)] = out["refused"].get(str(reason), 0) + 1
                elif typ == HELLO_ACK:
                    out["acked"] += 1
                continue  # the close (if any) comes as its own event
            sel.unregister(s)
            open_.discard(s)
            s.close()
            out["closed"] += 1
    out["open_at_end"] = len(open_)
    print(json.dumps(out), flush=True)
    for s in open_:
        s.close()


if __name__ == "__main__":
    main()
