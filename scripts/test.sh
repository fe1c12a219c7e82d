#!/usr/bin/env bash
# The whole test suite: install what is missing (with --test: QEMU, a Debian kernel
# and busybox for the Linux nvme-tcp initiator test), then build and run every
# test in a release build and in an ASan+UBSan build, check formatting, and fuzz
# each parser for a bounded time. Exit status is non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --test
FUZZ_SECONDS=${FUZZ_SECONDS:-12}

echo "== format check"
git ls-files '*.cc' '*.h' | xargs clang-format --dry-run -Werror
# A pid from a failed spawn is -1 or 0, and kill(-1) ends every process of the user:
# children are signalled only through runtime/child_process.h, which refuses those.
if git grep -nE '(^|[^_a-z.])kill\(' -- '*.cc' '*.h' ':!src/runtime/child_process.h' ':!src/runtime/child_process_test.cc'; then
  echo "raw kill() above: use signal_child() from runtime/child_process.h"; exit 1
fi

# SPDK, for the interop test (release only): built once, kept in /tmp/spdk.
echo "== SPDK (interop test)"
spdk_rc=0
spdk_dir=$(scripts/spdk.sh) || spdk_rc=$?
if [ "$spdk_rc" -eq 0 ]; then
  export DPUKV_SPDK_DIR=$spdk_dir
elif [ "$spdk_rc" -ne 3 ]; then
  echo "building SPDK failed"; exit 1
fi

for preset in release asan; do
  echo "== build and test: $preset"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset"
  ctest --preset "$preset" -j2
done

echo "== fuzz (${FUZZ_SECONDS}s per target)"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
for target in build/fuzz/fuzz_*; do
  name=$(basename "$target")
  corpus=fuzz/corpus/${name#fuzz_}
  work=$(mktemp -d)
  seeds=()
  [ -d "$corpus" ] && seeds=("$corpus")
  "$target" -max_total_time="$FUZZ_SECONDS" -print_final_stats=0 "$work" "${seeds[@]}" 2>"$work.log" || {
    tail -40 "$work.log"; echo "fuzz target $name failed"; exit 1; }
  grep -E "^#[0-9]+[[:space:]]+DONE" "$work.log" | sed "s/^/$name: /" || true
  rm -rf "$work" "$work.log"
done
echo "== all tests passed"
