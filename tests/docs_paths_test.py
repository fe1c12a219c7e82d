#!/usr/bin/env python3
"""Every source path the docs name exists, the README's layout block names existing
folders in the tree's order and leaves none of the top-level or src/ folders out,
and no line of docs/*.md outside code
blocks is longer than MAX_LINE characters (a table row included: a row that long
belongs in the doc it summarizes).

Reads README.md, docs/*.md (and the Python package's sources) and takes each `backticked` word that names a file of
this repository: a path with a folder (`cache/tier/chunk_store.h`,
`scripts/gpu_check.sh`) or a file name with a source extension (`tcp_connection.h`).
A path counts as found under the repository's root, under src/ (the docs name
sources as the code includes them), or, for a file name alone, anywhere in the
tree; brace lists (`nvme_driver.{h,cc}`) name each member. Generated files, build
outputs and paths on other machines are not names of this tree and are skipped.
Usage: docs_paths_test.py REPO_DIR"""
import os
import re
import sys

EXTS = (".h", ".cc", ".c", ".cu", ".py", ".sh", ".md", ".json", ".txt", ".toml", ".in", ".map",
        ".yaml", ".inc")
# Folders of this tree a path may start with (others are elsewhere: /dev, ~/.cache, ...).
ROOTS = ("src/", "python/", "scripts/", "tests/", "docs/", "examples/", ".ci/", "include/")
MAX_LINE = 400
SKIP = re.compile(r"(^|/)(build|\.venv|venv|site-packages)/|^/|^~|\*|<|>|\$|%")


def names(word):
    """The file names a backticked word stands for: braces expanded."""
    m = re.match(r"^(.*)\{([^}]*)\}(.*)$", word)
    if not m:
        return [word]
    return [m.group(1) + part + m.group(3) for part in m.group(2).split(",")]


def python_problems(repo, everything):
    """The Python package's docstrings and comments: every file they name exists (a
    bare name anywhere in the tree, a path from the repository, from src/, from the
    package or from the module's own folder)."""
    out, checked = [], 0
    pkg = os.path.join(repo, "python", "dpukv")
    for d, _, files in os.walk(pkg):
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(d, f)
            for n, line in enumerate(open(path, encoding="utf-8"), 1):
                for name in re.findall(r"[\w./-]+\.(?:py|h|cc|md|sh)\b", line):
                    checked += 1
                    if "/" not in name:
                        found = name in everything
                    else:
                        found = any(os.path.exists(os.path.join(base, name))
                                    for base in (repo, os.path.join(repo, "src"), pkg, d))
                    if not found:
                        out.append(f"{os.path.relpath(path, repo)}:{n}: `{name}`")
    return out, checked


def layout_problems(repo):
    """The README's "## Layout" block: its folders exist, are in sorted order, and
    cover every top-level folder and every folder of src/ (itself or its children)."""
    text = open(os.path.join(repo, "README.md"), encoding="utf-8").read()
    block = text.split("## Layout\n\n", 1)[1].split("\n\n", 1)[0]
    paths = [l.split()[0] for l in block.splitlines()
             if l.startswith("    ") and not l.startswith("     ")]
    out = [f"README.md layout: `{p}` does not exist" for p in paths
           if not os.path.isdir(os.path.join(repo, p))]
    parts = [p.rstrip("/").split("/") for p in paths]
    if parts != sorted(parts):
        out.append("README.md layout: folders not in the tree's (sorted) order")
    named = {p.rstrip("/") for p in paths}
    tops = [d for d in os.listdir(repo) if os.path.isdir(os.path.join(repo, d))
            and not d.startswith(".") and d != "build"]
    wanted = tops + ["src/" + d for d in os.listdir(os.path.join(repo, "src"))
                     if os.path.isdir(os.path.join(repo, "src", d))]
    for w in sorted(wanted):
        if w == "src":
            continue
        if w not in named and not any(n.startswith(w + "/") for n in named):
            out.append(f"README.md layout: `{w}/` is not in it")
    return out


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    everything = set()
    for d, dirs, files in os.walk(repo):
        dirs[:] = [x for x in dirs if not x.startswith(".") or x == ".ci"]
        dirs[:] = [x for x in dirs if x not in ("build", "venv", ".venv", "__pycache__")]
        everything.update(files)
    docs = [os.path.join(repo, "README.md")] + sorted(
        os.path.join(repo, "docs", f) for f in os.listdir(os.path.join(repo, "docs"))
        if f.endswith(".md"))
    missing = []
    long_lines = []
    checked = 0
    for doc in docs:
        in_code = False
        for n, line in enumerate(open(doc, encoding="utf-8"), 1):
            if line.startswith("```"):
                in_code = not in_code
            if (not in_code and len(line.rstrip("\n")) > MAX_LINE and
                    os.path.basename(os.path.dirname(doc)) == "docs"):
                long_lines.append(f"{os.path.relpath(doc, repo)}:{n}: {len(line.rstrip())} "
                                  f"characters (at most {MAX_LINE})")
            for word in re.findall(r"`([^`\s]+)`", line):
                word = word.rstrip(".,:;)").split(":")[0]
                for name in names(word):
                    if not name.endswith(EXTS) or SKIP.search(name):
                        continue
                    if "/" in name:
                        if not name.startswith(ROOTS) and not os.path.exists(
                                os.path.join(repo, "src", name.split("/")[0])):
                            continue  # not a path of this tree (a URL's, another project's)
                        found = (os.path.exists(os.path.join(repo, name)) or
                                 os.path.exists(os.path.join(repo, "src", name)))
                    else:
                        found = name in everything
                    checked += 1
                    if not found:
                        missing.append(f"{os.path.relpath(doc, repo)}:{n}: `{name}`")
    long_lines += layout_problems(repo)
    py_missing, py_checked = python_problems(repo, everything)
    missing += py_missing
    checked += py_checked
    for m in missing + long_lines:
        print(m)
    print(f"docs paths: {checked} checked, {len(missing)} missing; "
          f"{len(long_lines)} docs lines over {MAX_LINE} characters or layout problems")
    return 1 if missing or long_lines else 0


if __name__ == "__main__":
    sys.exit(main())
