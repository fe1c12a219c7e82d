#!/usr/bin/env python3
"""The layers of docs/architecture.md, checked on the sources as an allow-list.

ALLOWED says, for every folder of src/, which other folders its (non-test) sources
may include. Each allowed edge must be backed by the libraries' link graph in
CMakeLists.txt (target_link_libraries, followed transitively), so the
table and the build cannot drift apart, and a folder that is not in the table
fails the test until someone decides where it sits. Also fails on a folder-level
include cycle, and on a source file over MAX_LINES lines (tests and generated files
aside): a file that long holds more than one job. Usage: layering_test.py SRC_DIR
[CMAKELISTS]"""
import os
import re
import sys

# The architecture: who may include whom. "dpukv" is the public include/dpukv.
ALLOWED = {
    "runtime": set(),
    "protocol": set(),
    "engines": {"runtime"},
    "comch": {"runtime"},
    "nvme": {"runtime"},
    "rpc": {"runtime"},
    "cache": {"runtime", "protocol", "engines"},
    "cluster": {"runtime", "protocol", "cache"},
    "agent": {"runtime", "protocol", "engines", "comch", "cache", "cluster"},
    # Of the engines, the client links only the KV codecs (dpukv_kv_codec).
    "client": {"runtime", "protocol", "comch", "engines", "dpukv"},
    "nvmf": {"runtime", "rpc", "nvme", "cache"},
    # main.cc: the way in, routing to the command rooms below.
    "tools": {"runtime", "protocol", "tools/agent", "tools/bench", "tools/nvme", "tools/replay"},
}
# Rooms: sub-folders with a row of their own (a room of a folder is built into that
# folder's library). The cluster's endpoint and directory know nothing of the cache
# or of each other; the node composes them.
# The cache's tiers (where chunk bytes lie: the slab allocator, the disk tier, its
# chunk stores and index log) know nothing of the engine above them.
# The NVMe-oF target's rooms: the controller core (queues, admin commands, the
# fabrics controller and what the target's parts share: core/target_side.h) knows
# no transport; the TCP transport and the vfio-user emulation sit on the core; the
# block devices under them know neither. The target (poll group, RPC, app) composes.
# The dpukv command's rooms, one per command family over common/ (what they share:
# outputs, sizes, network namespaces); main.cc, above them all, routes.
ROOMS = ("cluster/ucx", "cluster/directory", "cache/tier", "nvmf/core", "nvmf/tcp",
         "nvmf/vfio_user", "nvmf/bdev", "tools/common", "tools/agent", "tools/bench",
         "tools/nvme", "tools/replay")
ALLOWED.update({
    "cluster/ucx": {"runtime"},
    "cluster/directory": {"runtime", "protocol"},
    "cache/tier": {"runtime", "protocol", "nvme"},
    "nvmf/bdev": {"runtime", "rpc", "cache"},
    "nvmf/core": {"runtime", "nvme", "nvmf/bdev"},
    "nvmf/tcp": {"runtime", "nvme", "nvmf/core"},
    "nvmf/vfio_user": {"runtime", "nvme", "nvmf/core", "nvmf/bdev"},
})
ALLOWED["nvmf"] |= {"nvmf/core", "nvmf/tcp", "nvmf/vfio_user", "nvmf/bdev"}
ALLOWED["cluster"] |= {"cluster/ucx", "cluster/directory"}
ALLOWED.update({
    "tools/common": {"runtime", "cluster/directory"},
    "tools/agent": {"runtime", "protocol", "agent", "cache", "client", "tools/common"},
    "tools/bench": {"runtime", "engines", "comch", "cache", "client", "cluster/ucx",
                    "cluster/directory", "tools/common"},
    "tools/nvme": {"runtime", "nvme", "rpc", "nvmf", "nvmf/bdev", "nvmf/vfio_user",
                   "tools/common"},
    "tools/replay": {"runtime", "engines", "cache", "client", "tools/common"},
})
ALLOWED["cache"] |= {"cache/tier"}
# Libraries whose sources are not in a folder of their own name.
LIB_FOLDER = {"dpukv_crc32c": "runtime", "dpukv_kv_codec": "engines", "dpukv_client_shared": "client", "dpukv": "tools"}
# Include roots that are not src/ folders: the folder whose library exports them.
EXPORTED = {"dpukv": "client"}

# Parts: inside a folder, its files in layers, lowest first. A listed file may
# include only listed files of its own layer or below (a .cc its own header), so
# an arrow back up (placement calling the request pipeline) fails here.
PARTS = {
    "cache": ["cache_options", "chunk_index", "chunk_table", "eviction_policy", "policy_links",
              "ghost_window", "arc_policy", "eviction_policies", "placement", "request_pipeline",
              "cache_engine"],
    "cluster": ["cluster_options", "peer_wire", "lent_pins", "remote_tier", "peer_links",
                "chunk_reader", "chunk_holder", "cluster_node"],
    "comch": ["wire", "connection", "fast_path", "channel", "server", "client"],
}

# The Python package's modules in layers, lowest first (paths under python/dpukv,
# without .py; a package by its folder). A module may import only modules before it:
# the connector's parts never import the vLLM adapter, staging never the worker.
# "_native" is the client the package root picks (compiled, or ctypes).
PY_PARTS = ["_native", "_ctypes_client", "device", "connector/layout", "connector/codec",
            "connector/staging", "connector/shared",
            "connector/worker", "connector/scheduler", "connector/core", "connector",
            "vllm/requests", "vllm/settings", "vllm/scheduler", "vllm/worker", "vllm"]
PY_IMPORT = re.compile(r"^\s*from\s+(\.+)([a-z_.]*)\s+import\s+([A-Za-z0-9_, ]+?)(?:\s+as\s+\w+)?\s*(?:#.*)?$")

INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_/]+)/[^/"]+"')


def unit(path):
    """The row a folder path (relative to src/) belongs to: its room, or its top folder."""
    for room in ROOMS:
        if path == room or path.startswith(room + "/"):
            return room
    return path.split("/")[0]


def include_graph(src):
    deps = {}
    for folder in sorted(os.listdir(src)):
        top = os.path.join(src, folder)
        if not os.path.isdir(top):
            continue
        for root, _, files in os.walk(top):
            me = unit(os.path.relpath(root, src))
            uses = deps.setdefault(me, set())
            for f in files:
                if not f.endswith((".h", ".cc")) or f.endswith("_test.cc"):
                    continue
                with open(os.path.join(root, f), encoding="utf-8") as fh:
                    for line in fh:
                        m = INCLUDE.match(line)
                        if m and unit(m.group(1)) != me:
                            uses.add(unit(m.group(1)))
    return deps


def link_graph(cmakelists):
    """folder -> folders whose libraries it links, directly or through PUBLIC links."""
    text = open(cmakelists, encoding="utf-8").read()
    text = re.sub(r"#[^\n]*", "", text)
    folder_of = dict(LIB_FOLDER)
    for m in re.finditer(r"add_(?:library|executable)\((dpukv\w*)\s", text):
        folder_of.setdefault(m.group(1), m.group(1)[len("dpukv_"):])
    links = {}
    for m in re.finditer(r"target_link_libraries\((dpukv\w*)\s+([^)]*)\)", text):
        target, body = m.group(1), m.group(2).split()
        links.setdefault(target, set()).update(t for t in body if t in folder_of)
    closure = {}
    for target in folder_of:
        seen, todo = set(), list(links.get(target, ()))
        while todo:
            t = todo.pop()
            if t not in seen:
                seen.add(t)
                todo.extend(links.get(t, ()))
        folder = folder_of[target]
        closure.setdefault(folder, set()).update(folder_of[t] for t in seen)
    for folder in closure:
        closure[folder].discard(folder)
    return closure


def part_includes(src):
    """(folder, file stem, included stem) for includes between listed parts."""
    out = []
    for folder, order in PARTS.items():
        top = os.path.join(src, folder)
        for f in sorted(os.listdir(top)):
            stem, ext = os.path.splitext(f)
            if ext not in (".h", ".cc") or stem.endswith("_test") or stem not in order:
                continue
            with open(os.path.join(top, f), encoding="utf-8") as fh:
                for line in fh:
                    m = re.match(r'^\s*#\s*include\s+"' + re.escape(folder) + r'/([a-z_]+)\.h"', line)
                    if m and m.group(1) in order:
                        out.append((folder, stem, m.group(1)))
    return out


def part_problems(edges):
    out = []
    for folder, stem, inc in edges:
        order = PARTS[folder]
        if order.index(inc) > order.index(stem):
            out.append(f"src/{folder}/{stem} includes {inc}.h, a part above it in PARTS")
    return out


def py_module(pkg_dir, path):
    """A module's name in PY_PARTS terms: connector/worker, vllm, connector (its __init__)."""
    rel = os.path.relpath(path, pkg_dir)[:-len(".py")]
    return rel[:-len("/__init__")] if rel.endswith("/__init__") else rel


def py_imports(pkg_dir):
    """(module, imported module) for the package's relative imports."""
    out = []
    for root, _, files in os.walk(pkg_dir):
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(root, f)
            me = py_module(pkg_dir, path)
            if me == "__init__":
                continue  # the package root picks the client; it sits below everything
            # The package a relative import starts from: a module's folder.
            here = os.path.relpath(root, pkg_dir)
            here = [] if here == "." else here.split("/")
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    m = PY_IMPORT.match(line)
                    if not m:
                        continue
                    base = here[:len(here) - (len(m.group(1)) - 1)]
                    if m.group(2):
                        out.append((me, "/".join(base + m.group(2).split("."))))
                    else:  # from . import a, b: modules of that package
                        for name in m.group(3).split(","):
                            out.append((me, "/".join(base + [name.strip()])))
    return out


def py_problems(edges):
    out = []
    for me, dep in edges:
        if me not in PY_PARTS:
            out.append(f"python/dpukv/{me} is not in PY_PARTS: say where it sits")
        elif dep not in PY_PARTS:
            out.append(f"python/dpukv/{me} imports {dep}, which is not in PY_PARTS")
        elif PY_PARTS.index(dep) >= PY_PARTS.index(me):
            out.append(f"python/dpukv/{me} imports {dep}, a module above it in PY_PARTS")
    return out


def problems(deps, linked):
    out = []
    for folder in sorted(deps):
        if folder not in ALLOWED:
            out.append(f"src/{folder} is not in ALLOWED: say which folders it may include")
            continue
        for d in sorted(deps[folder] - ALLOWED[folder]):
            out.append(f"src/{folder} includes src/{d}, which ALLOWED does not let it")
    for folder, allowed in sorted(ALLOWED.items()):
        for d in sorted(allowed):
            lib, dep = folder.split("/")[0], EXPORTED.get(d, d).split("/")[0]
            if dep not in linked.get(lib, set()) | {lib}:
                out.append(f"ALLOWED lets src/{folder} include src/{d}, "
                           f"but its library does not link {d}'s")
    for folder in sorted(deps):
        stack = [(folder, [folder])]
        while stack:
            node, path = stack.pop()
            for nxt in deps.get(node, ()):
                if nxt == folder:
                    out.append("include cycle: " + " -> ".join(path + [folder]))
                    return out
                if nxt not in path:
                    stack.append((nxt, path + [nxt]))
    return out


MAX_LINES = 600


def line_counts(src):
    """Lines of every non-test, non-generated source file under src."""
    out = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith((".cc", ".h")) or f.endswith("_test.cc") or "testing" in root:
                continue
            path = os.path.join(root, f)
            with open(path, encoding="utf-8") as fh:
                out[os.path.relpath(path, src)] = sum(1 for _ in fh)
    return out


def size_problems(counts):
    return [f"src/{p} has {n} lines (at most {MAX_LINES}): cut it by job"
            for p, n in sorted(counts.items()) if n > MAX_LINES]


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "src"
    cmakelists = sys.argv[2] if len(sys.argv) > 2 else os.path.join(src, "..", "CMakeLists.txt")
    deps = include_graph(src)
    linked = link_graph(cmakelists)
    # The checks must be able to fail: an include the table forbids, a folder it
    # does not know, and a cycle are each reported.
    for bad in ({"comch": {"cache"}}, {"newfolder": set()}, {"cluster/ucx": {"cache"}},
                {"cluster/directory": {"cluster/ucx"}}, {"nvmf/core": {"nvmf/tcp"}},
                {"tools/common": {"tools/bench"}}, {"tools/replay": {"tools/nvme"}},
                {"engines": {"runtime"}, "runtime": {"engines"}}):
        assert problems(bad, linked), f"layering check misses {bad}"
    assert part_problems([("cache", "placement", "request_pipeline")]), "parts check misses"
    assert not part_problems([("cache", "request_pipeline", "placement")])
    assert py_problems([("connector/staging", "connector/worker")]), "python check misses"
    assert py_problems([("connector/worker", "vllm")]), "python check misses"
    assert size_problems({"agent/agent.cc": MAX_LINES + 1}), "size check misses"
    assert not size_problems({"agent/agent.cc": MAX_LINES})
    for folder in sorted(deps):
        print(f"{folder:10s} -> {', '.join(sorted(deps[folder])) or '-'}")
    counts = line_counts(src)
    assert counts, "no sources found: the size check reads nothing"
    found = (problems(deps, linked) + part_problems(part_includes(src)) +
             size_problems(counts))
    pkg = os.path.join(src, "..", "python", "dpukv")
    if os.path.isdir(pkg):
        edges = py_imports(pkg)
        assert edges, "no relative imports found in python/dpukv: the parser is broken"
        found += py_problems(edges)
        print(f"python/dpukv: {' < '.join(PY_PARTS)}")
    for folder, order in PARTS.items():
        print(f"{folder} parts: {' < '.join(order)}")
    for p in found:
        print("layering: " + p, file=sys.stderr)
    if found:
        sys.exit(1)
    print("layering: ok")


if __name__ == "__main__":
    main()
