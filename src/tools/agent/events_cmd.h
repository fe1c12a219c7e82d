// `dpukv events`: the agent's event feed (chunks stored and removed) printed as it
// comes, the example consumer of the feed a router outside the engine reads.
#pragma once

#include <CLI/CLI.hpp>

namespace dpukv {

void add_events_command(CLI::App* app, int* exit_code);

}  // namespace dpukv
