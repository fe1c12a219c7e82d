#!/usr/bin/env python3
"""Every eviction policy against the offline optimum: `dpukv replay --json` for each
trace, memory capacity and policy, printed as one Markdown table (docs/cache_policy.md
is made with it). Usage: scripts/policy_table.py [--dpukv BIN] [--capacities 1000,3000]
[--policies lru,arc] TRACE..."""
import argparse
import json
import os
import subprocess
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--dpukv", default="build/release/dpukv")
    ap.add_argument("--capacities", default="1000,3000,10000")
    ap.add_argument("--policies", default="lru,s3fifo,arc")
    a = ap.parse_args()
    caps = [int(x) for x in a.capacities.split(",")]
    pols = a.policies.split(",")
    print("| trace | capacity (blocks) | optimum | " +
          " | ".join(f"{p} (× optimum)" for p in pols) + " | LRU simulation |")
    print("|---|---:|---:|" + "---:|" * len(pols) + "---:|")
    for t in a.traces:
        for c in caps:
            cells, opt, lru = [], None, None
            for p in pols:
                r = subprocess.run([a.dpukv, "replay", t, "--capacity-blocks", str(c),
                                    "--eviction", p, "--json"], capture_output=True, text=True)
                if r.returncode != 0:
                    print(f"dpukv replay {t} {c} {p} failed:\n{r.stderr}", file=sys.stderr)
                    return 1
                j = json.loads(r.stdout)
                if j["verify_failures"] or j["errors"]:
                    print(f"{t} {c} {p}: {j['verify_failures']} bad bytes, {j['errors']} errors",
                          file=sys.stderr)
                    return 1
                opt, lru = j["optimum_block_hit_ratio"], j["lru_sim_block_hit_ratio"]
                cells.append(f"{100 * j['block_hit_ratio']:.2f} % ({j['ratio_to_optimum']:.2f})")
                print(f"  {os.path.basename(t)} {c} {p}: {cells[-1]}", file=sys.stderr)
            print(f"| {os.path.basename(t)} | {c:,} | {100 * opt:.2f} % | " + " | ".join(cells) +
                  f" | {100 * lru:.2f} % ({lru / opt:.2f}) |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
