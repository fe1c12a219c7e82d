#!/usr/bin/env bash
# `cmake --install` puts what the systemd unit names where it names it: the
# binary, the agent's config, and the unit (hardened, a user of its own, the socket
# in its RuntimeDirectory); systemd-analyze verifies the unit where it is present.
set -euo pipefail
build=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "install: $*" >&2; exit 1; }
DESTDIR=$tmp cmake --install "$build" >/dev/null
unit=$(find "$tmp" -name dpukv-agent.service)
[ -n "$unit" ] || fail "no unit installed"
exec_line=$(grep '^ExecStart=' "$unit")
binary=$(sed -E 's/^ExecStart=([^ ]+) .*/\1/' <<<"$exec_line")
config=$(sed -E 's/.*--config ([^ ]+).*/\1/' <<<"$exec_line")
[ -x "$tmp$binary" ] || fail "ExecStart names $binary, not installed"
[ -f "$tmp$config" ] || fail "--config names $config, not installed"
"$tmp$binary" --help >/dev/null || fail "the installed binary does not run"
grep -q -- "--socket /run/dpukv/" <<<"$exec_line" || fail "the socket is outside RuntimeDirectory"
for want in "RuntimeDirectory=dpukv" "User=dpukv" "Group=dpukv" "NoNewPrivileges=yes" \
            "ProtectSystem=strict" "StateDirectory=dpukv" "ProtectHome=yes" "PrivateTmp=yes" \
            "RestrictAddressFamilies=" "Wants=network-online.target" "Type=notify" \
            "LimitNOFILE=65536"; do  # room for max_clients (issue 45.2)
  grep -q "^$want" "$unit" || fail "the unit lacks $want"
done
# The installed config is one the agent takes as it is.
"$tmp$binary" --log-level error agent --config "$tmp$config" --socket "$tmp/x.sock" \
  --metrics-port 0 --max-local-cpu-size 64M --max-chunk-size 1M &
agent=$!
until [ -S "$tmp/x.sock" ]; do kill -0 $agent 2>/dev/null || fail "the agent refused the installed config"; sleep 0.05; done
kill -TERM $agent
wait $agent || fail "the agent did not stop cleanly"
if command -v systemd-analyze >/dev/null; then
  out=$(systemd-analyze verify --root="$tmp" "$unit" 2>&1 || true)
  ! grep -qiE "unknown (key|section)|failed to parse|invalid" <<<"$out" || fail "systemd-analyze: $out"
fi
# The Python package with its compiled client, where the Debian interpreter finds it.
ext=$(find "$tmp" -path "*/dist-packages/dpukv/_dpukv*.so" | head -1)
[ -n "$ext" ] || fail "no Python package installed"
preload=""
if ldd "$ext" | grep libasan >/dev/null; then
  preload=$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)
fi
(cd "$tmp" && env ${preload:+LD_PRELOAD=$preload ASAN_OPTIONS=detect_leaks=0} PYTHONDONTWRITEBYTECODE=1 \
  PYTHONPATH="$(dirname "$(dirname "$ext")")" /usr/bin/python3 -c '
import dpukv
assert dpukv.client_kind == "compiled", dpukv.client_kind
assert dpukv.model_id("m") == dpukv.model_id("m") != 0') || fail "the installed Python package does not import"
echo "install: ok"
