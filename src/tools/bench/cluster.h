// `dpukv bench cluster`: one-sided reads of a peer agent's memory over UCX (the
// peer is a child process) against a raw TCP stream of the same bytes between the
// same processes, and against memcpy, in the same run.
#pragma once

#include <CLI/CLI.hpp>

namespace dpukv {

void add_bench_cluster_command(CLI::App* bench, int* exit_code);

}  // namespace dpukv
