#!/usr/bin/env bash
# The KV quality bench (python/benchmarks/bench_kv_quality.py) on a small slice, in
# the vLLM venv (transformers) on SmolLM2: lossless exact; int8 within its byte and
# perplexity targets, its agreement within a slice's error of the 99 % target (256
# predictions: two of them more or less move it by 0.8 points; the full run, 6,400
# predictions, is in docs/kv_codecs.md); int4 within its byte and perplexity targets
# and moving some tokens:
# kv_quality_test.sh PKGDIR. Skipped (77) without the venv or the model.
set -euo pipefail
pkgdir=$(realpath "$1")
src=$(dirname "$(realpath "$0")")/..
source "$src/tests/vllm_venv_common.sh"
vllm_python "$pkgdir"
if ! "$src/scripts/smollm2_model.sh" --find >/dev/null; then
  echo "SKIP: no SmolLM2 model here (scripts/deps.sh --test makes it)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$vllm_py" "$src/python/benchmarks/bench_kv_quality.py" "$pkgdir" --prompts 16 --gen 16 \
  --ppl-tokens 1024 --codecs none,lossless,int8,int4 --check lossless --json > "$tmp/q.json"
"$vllm_py" - "$tmp/q.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = {r["codec"]: r for r in d["results"]}
assert d["bench"] == "kv_quality" and set(rows) == {"none", "lossless", "int8", "int4"}, d
for r in rows.values():
    assert len(r["samples"]["agreement"]) == 16 and r["ppl_tokens"] == 1024, r
    print(f"kv_quality: {r['codec']}: {r['compression']:.2f}x, agreement "
          f"{100 * r['agreement']:.2f}%, perplexity {r['perplexity']:.3f} "
          f"({100 * (r['perplexity_ratio'] - 1):+.2f}%)")
assert rows["lossless"]["agreement"] == 1 and rows["lossless"]["perplexity_ratio"] == 1, rows
int8 = rows["int8"]
assert int8["compression"] >= 1.9 and int8["perplexity_ratio"] <= 1.01, int8
assert int8["agreement"] >= 0.98, int8
# int4 (values per token on SmolLM2's 64-channel heads): its byte and perplexity
# targets; its agreement misses 95 % on the full run (94.4 %), so on this slice the
# check is only that it can fail: int4 moves the model's tokens.
int4 = rows["int4"]
assert int4["compression"] >= 3.5 and int4["perplexity_ratio"] <= 1.05, int4
assert int4["agreement"] < 1, int4
PY
