#!/usr/bin/env python3
"""The layers of docs/architecture.md, checked on the sources: which folder of src/
includes which. Fails on a folder-level include cycle and on an include that goes
against the layering (the thin client, the NVMe host side, the cache). Usage:
layering_test.py SRC_DIR"""
import os
import re
import sys

src = sys.argv[1] if len(sys.argv) > 1 else "src"
include = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')
deps = {}
for folder in sorted(os.listdir(src)):
    top = os.path.join(src, folder)
    if not os.path.isdir(top):
        continue
    uses = deps.setdefault(folder, set())
    for root, _, files in os.walk(top):
        for f in files:
            if not f.endswith((".h", ".cc")) or f.endswith("_test.cc"):
                continue
            with open(os.path.join(root, f), encoding="utf-8") as fh:
                for line in fh:
                    m = include.match(line)
                    if m and m.group(1) != folder:
                        uses.add(m.group(1))

# What must never be included from where (the thin client; host side below the
# cache; the cache below the target).
forbidden = {
    "client": {"agent", "cache", "engines", "nvme", "nvmf", "rpc"},
    "protocol": {"agent", "cache", "client", "comch", "engines", "nvme", "nvmf"},
    "runtime": set(deps) - {"runtime"},
    "nvme": {"cache", "nvmf", "agent", "client"},
    "cache": {"nvmf", "agent", "client", "cluster"},
}
problems = []
for folder, bad in forbidden.items():
    for d in sorted(deps.get(folder, set()) & bad):
        problems.append(f"src/{folder} includes src/{d}")


def cycle_from(start):
    stack = [(start, [start])]
    while stack:
        node, path = stack.pop()
        for nxt in deps.get(node, ()):
            if nxt == start:
                return path + [start]
            if nxt not in path:
                stack.append((nxt, path + [nxt]))
    return None


for folder in sorted(deps):
    c = cycle_from(folder)
    if c:
        problems.append("include cycle: " + " -> ".join(c))
        break

for folder in sorted(deps):
    print(f"{folder:10s} -> {', '.join(sorted(deps[folder])) or '-'}")
if problems:
    for p in problems:
        print("layering: " + p, file=sys.stderr)
    sys.exit(1)
print("layering: ok")
