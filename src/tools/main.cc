// dpukv: one command, one subcommand per area.
#include <CLI/CLI.hpp>

#include <iostream>
#include <string>

#include "protocol/version.h"
#include "runtime/log.h"
#include "tools/agent/agent_cmd.h"
#include "tools/agent/events_cmd.h"
#include "tools/bench/cache.h"
#include "tools/bench/client.h"
#include "tools/bench/cluster.h"
#include "tools/bench/comch.h"
#include "tools/bench/compress.h"
#include "tools/bench/dma.h"
#include "tools/nvme/nvme_cmd.h"
#include "tools/nvme/rpc_cmd.h"
#include "tools/replay/replay.h"

int main(int argc, char** argv) {
  CLI::App app{"dpukv: KV-cache offload and sharing engine for LLM inference"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("dpukv ") + dpukv::kDpukvVersion);
  std::string log_level = "info", lib_log_level = "warning", log_file;
  app.add_option("--log-level", log_level, "Application log level (critical..trace)")
      ->capture_default_str();
  app.add_option("--lib-log-level", lib_log_level, "Library log level (critical..trace)")
      ->capture_default_str();
  app.add_option("--log-file", log_file, "Write logs to this file instead of stderr");
  int exit_code = 0;

  CLI::App* bench =
      app.add_subcommand("bench", "Benchmark an engine against its same-run baseline");
  bench->require_subcommand(1);
  dpukv::add_bench_dma_command(bench, &exit_code);
  dpukv::add_bench_comch_command(bench, &exit_code);
  dpukv::add_bench_compress_command(bench, &exit_code);
  dpukv::add_bench_cache_command(bench, &exit_code);
  dpukv::add_bench_client_command(bench, &exit_code);
  dpukv::add_bench_cluster_command(bench, &exit_code);

  dpukv::add_agent_commands(&app, &exit_code);
  dpukv::add_events_command(&app, &exit_code);
  dpukv::add_replay_command(&app, &exit_code);
  dpukv::add_nvme_commands(&app, &exit_code);
  dpukv::add_rpc_command(&app, &exit_code);

  app.parse_complete_callback([&] {
    dpukv::LogLevel lvl;
    if (!dpukv::log_level_from_string(log_level, &lvl).ok())
      throw CLI::ValidationError("--log-level", "unknown level " + log_level);
    dpukv::log_set_level(dpukv::LogSource::kApp, lvl);
    if (!dpukv::log_level_from_string(lib_log_level, &lvl).ok())
      throw CLI::ValidationError("--lib-log-level", "unknown level " + lib_log_level);
    dpukv::log_set_level(dpukv::LogSource::kLib, lvl);
    if (!log_file.empty() && !dpukv::log_set_file(log_file.c_str()).ok())
      throw CLI::ValidationError("--log-file", "cannot open " + log_file);
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every bad argument exits 2, as the README says.
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  return exit_code;
}
