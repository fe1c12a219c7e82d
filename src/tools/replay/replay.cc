#include "tools/replay/replay.h"

#include <sys/types.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "cache/eviction_policies.h"
#include "tools/common/bench_common.h"
#include "tools/replay/agents.h"
#include "tools/replay/clients.h"
#include "tools/replay/codec.h"
#include "tools/replay/report.h"
#include "tools/replay/trace.h"

namespace dpukv {
namespace replay {
namespace {

uint64_t peak_rss(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string k;
  while (f >> k) {
    if (k == "VmHWM:") {
      uint64_t kb;
      f >> kb;
      return kb * 1024;
    }
    std::getline(f, k);
  }
  return 0;
}

int run(const Config& c) {
  const Preset* preset = find_preset(c.model);
  if (preset == nullptr) {
    std::cerr << "dpukv replay: unknown --model " << c.model
              << " (llama-3.1-8b, qwen2.5-7b, llama-3.1-70b, deepseek-v3)\n";
    return 2;
  }
  std::vector<Request> reqs;
  std::string err;
  Status st = load_trace(c.trace, c.max_requests, &reqs, &err);
  if (!st.ok()) {
    std::cerr << "dpukv replay: " << err << "\n";
    return 2;
  }
  if (reqs.empty()) {
    std::cerr << "dpukv replay: the trace has no requests\n";
    return 2;
  }
  uint64_t total_blocks = 0;
  for (const auto& r : reqs) total_blocks += r.ids.size();
  if (total_blocks == 0) {
    std::cerr << "dpukv replay: the trace's requests name no blocks (hash_ids are all empty): "
                 "nothing to cache\n";
    return 2;
  }
  // Block bytes: 512 tokens of the preset, scaled down, rounded to 4 KiB pages.
  const uint64_t raw_block = 512 * preset->bytes_per_token / c.scale;
  const uint64_t block = std::max<uint64_t>(4096, (raw_block + 4095) / 4096 * 4096);
  size_t max_blocks = 0;
  for (const auto& r : reqs) max_blocks = std::max(max_blocks, r.ids.size());
  // With a codec: a block's slot is its largest encoding, and the memory of
  // capacity_blocks unencoded blocks holds capacity_bytes / (mean encoded size)
  // of them (a sample of the trace's first blocks, encoded here).
  uint64_t slot = block, capacity = c.capacity_blocks;
  KvCodec codec{};
  if (kv_codec_from_name(c.kv_codec, &codec)) {
    BlockCodec bc(codec, block);
    slot = bc.slot();
    std::vector<uint8_t> buf(slot);
    uint64_t sum = 0, n = 0;
    for (const auto& r : reqs) {
      for (uint64_t id : r.ids) {
        uint64_t len = 0;
        if (!bc.encode(id, buf.data(), &len).ok()) return 1;
        sum += len, ++n;
        if (n == 64) break;
      }
      if (n == 64) break;
    }
    capacity = c.capacity_blocks * block * n / sum;
  }
  const uint64_t staging_bytes = max_blocks * slot;
  if (staging_bytes > (4ull << 30)) {
    std::cerr << "dpukv replay: the longest request (" << max_blocks << " blocks of "
              << bench::format_size(slot) << ") needs " << bench::format_size(staging_bytes)
              << " of staging per client; raise --scale\n";
    return 2;
  }

  Agents agents;
  // The agent's slab pages are max_chunk_size each, one size class a page: encoded
  // blocks share pages of four unencoded blocks (one a page would waste half of an
  // int4 page).
  const uint64_t max_chunk = slot == block ? block : std::max(slot, 4 * block);
  if (const int rc = agents.start(c, block, max_chunk); rc != 0) return rc;
  const uint32_t nodes = static_cast<uint32_t>(agents.sockets().size());
  const uint32_t nclients = std::max<uint32_t>(nodes, std::max<uint32_t>(1, c.clients));
  Totals t;
  if (const int rc =
          drive_clients(c, reqs, agents, nclients, block, slot, capacity, max_blocks, &t);
      rc != 0)
    return rc;
  const uint64_t rss = agents.own() ? peak_rss(agents.first_pid()) : 0;
  agents.stop();
  return report(c, RunShape{preset, block, nodes, nclients, agents.netns(), rss}, t);
}

}  // namespace
}  // namespace replay

void add_replay_command(CLI::App* app, int* exit_code) {
  auto c = std::make_shared<replay::Config>();
  CLI::App* cmd = app->add_subcommand(
      "replay", "Replay a Mooncake-format trace through real clients and an agent");
  cmd->add_option("trace", c->trace,
                  "Trace file (JSON lines: timestamp, input_length, output_length, hash_ids)")
      ->required();
  cmd->add_option("--agent", c->agent_socket,
                  "Use the agent at this socket instead of starting one");
  cmd->add_option("--model", c->model,
                  "KV size preset: llama-3.1-8b, qwen2.5-7b, llama-3.1-70b, deepseek-v3")
      ->capture_default_str();
  cmd->add_option("--scale", c->scale, "Divide block bytes by this so the run fits the machine")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
  cmd->add_option("--capacity-blocks", c->capacity_blocks, "Memory tier size in blocks")
      ->capture_default_str()
      ->check(CLI::Range(1ull, 100000000ull));
  cmd->add_option("--disk-blocks", c->disk_blocks,
                  "Give the agent it starts a disk tier of this many blocks (reported next to an "
                  "LRU simulation of memory + disk)")
      ->capture_default_str()
      ->check(CLI::Range(0ull, 100000000ull));
  cmd->add_option("--disk-dir", c->disk_dir,
                  "Directory of that disk tier (default: a new one under /var/tmp, removed after)");
  cmd->add_option("--clients", c->clients, "Concurrent clients")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  cmd->add_option("--speedup", c->speedup,
                  "Honour arrival times compressed by this factor (0: as fast as possible)")
      ->capture_default_str()
      ->check([](const std::string& v) {
        double x = 0;
        try {
          x = std::stod(v);
        } catch (...) {
          return std::string("not a number");
        }
        // !(x >= 0) also refuses nan, which every comparison lets through.
        return !(x >= 0) || !std::isfinite(x) ? std::string("must be a finite number >= 0")
                                              : std::string();
      });
  cmd->add_option("--max-requests", c->max_requests, "Replay only the first N requests");
  std::vector<std::string> policies;
  for (const EvictionPolicyInfo& p : eviction_policies()) policies.emplace_back(p.name);
  cmd->add_option("--eviction", c->eviction,
                  "Eviction policy of the agent it starts: " + eviction_policy_names(" or ") +
                      " (the simulation stays LRU)")
      ->capture_default_str()
      ->check(CLI::IsMember(policies));
  cmd->add_option("--nodes", c->nodes,
                  "Start this many agents that share chunks through a Redis directory (started "
                  "too); requests are spread over them, compared with one cache of the combined "
                  "capacity")
      ->capture_default_str()
      ->check(CLI::Range(1u, 16u));
  cmd->add_flag(
      "--no-netns", c->no_netns,
      "With --nodes as root: run the agents on loopback, not each in a network namespace");
  cmd->add_option("--kv-codec", c->kv_codec,
                  "Store blocks as KV-like values encoded by this codec (none, lossless, int8, "
                  "int4), as a connector's kv_codec does; the memory stays --capacity-blocks "
                  "unencoded blocks")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "lossless", "int8", "int4"}));
  cmd->add_flag("--no-verify", c->no_verify, "Do not check retrieved bytes");
  cmd->add_flag("--json", c->json, "Print one JSON object");
  cmd->add_option("--plot", c->plot, "Write a PNG of hit ratio and GB/s over trace time (gnuplot)");
  cmd->callback([c, exit_code] { *exit_code = replay::run(*c); });
}

}  // namespace dpukv
