// `dpukv nvme perf`: an SPDK-perf-like I/O benchmark through dpukv's own NVMe
// initiators (vfio-user driver, NVMe/TCP host), each row next to a same-run
// baseline: the same I/O on an in-process block device (vfio-user), or a raw TCP
// ping-pong of the same message sizes (tcp). `nvme pingpong-server` is the
// baseline's server side.
#pragma once

#include <CLI/CLI.hpp>

namespace dpukv {

void add_nvme_perf_command(CLI::App* nvme, int* exit_code);

}  // namespace dpukv
