// `dpukv bench dma`: the doca_bench of the DMA engine.
#pragma once

#include <CLI/CLI.hpp>

namespace dpukv {

// Adds `dma` (and the hidden `dma-peer` child) under the `bench` command.
void add_bench_dma_command(CLI::App* bench, int* exit_code);

}  // namespace dpukv
