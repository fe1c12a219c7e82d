// `dpukv bench compress`: every codec on KV-like data against LZ4, zstd-1 and
// zstd-1 after a byte shuffle on the same bytes.
#pragma once

#include <CLI/CLI.hpp>

namespace dpukv {

void add_bench_compress_command(CLI::App* bench, int* exit_code);

}  // namespace dpukv
