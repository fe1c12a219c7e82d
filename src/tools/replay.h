// `dpukv replay TRACE`: real serving traffic (Mooncake JSONL traces) through real
// clients against a real agent, with an LRU simulation of the same capacity.
#pragma once

#include <CLI/CLI.hpp>

namespace dpukv {

void add_replay_command(CLI::App* app, int* exit_code);

}  // namespace dpukv
