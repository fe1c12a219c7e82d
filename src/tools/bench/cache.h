// `dpukv bench cache`: the cache engine in-process against memcpy, an
// unordered_set and raw io_uring on the same bytes and files.
#pragma once

#include <CLI/CLI.hpp>

namespace dpukv {

void add_bench_cache_command(CLI::App* bench, int* exit_code);

}  // namespace dpukv
