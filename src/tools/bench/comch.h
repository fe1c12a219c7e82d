// `dpukv bench comch`: control-path and fast-path round trips, one-way rates and
// fast-path bulk bandwidth, each against a same-run baseline.
#pragma once

#include <CLI/CLI.hpp>

namespace dpukv {

void add_bench_comch_command(CLI::App* bench, int* exit_code);

}  // namespace dpukv
