# Sourced by the scripts and tests that run SPDK's tools (bash).
# Hugepage files of SPDK processes that died without cleaning up (SIGKILL) keep
# their pages taken: those of pids no longer alive are dropped.
drop_stale_spdk_hugepages() {
  local f p
  for f in /dev/hugepages/spdk_pid*; do
    [ -e "$f" ] || continue
    p=${f#/dev/hugepages/spdk_pid}
    p=${p%%map_*}
    kill -0 "$p" 2>/dev/null || rm -f "$f"
  done
}
