#include "tools/agent_cmd.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "agent/agent.h"
#include "client/client.h"
#include "runtime/log.h"
#include "tools/bench_common.h"

namespace dpukv {
namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) {
  g_stop.store(true);
}

// Settings with LMCache's names where the concept is the same. Sizes in GB are
// floats, as LMCache takes them.
struct AgentSettings {
  std::string socket;
  uint32_t chunk_size = 256;       // tokens per chunk (reported; keys are the client's)
  double max_local_cpu_size = 0;   // GB of memory tier; 0: from available RAM
  std::string local_disk;          // disk tier directory; empty: off
  double max_local_disk_size = 0;  // GB of disk tier
  std::string nvme_tier;           // ADDR:PORT of an NVMe/TCP target for the disk tier's data
  std::string nvme_tier_nqn = "nqn.2026-11.io.dpukv:cnode1";
  std::string max_chunk = "64M";  // largest chunk
  std::string memory_bytes;       // exact memory tier size (K/M/G); overrides the GB setting
  uint32_t max_chunks = 0;        // index entries; 0: memory tier / 16 KiB + disk tier / 16 KiB
  uint32_t dma_threads =
      1;                  // software DMA queues (engine threads); 2 helps large chunks on 2 cores
  bool compress = false;  // lossless KV codec on store (compress engine)
  std::string eviction = "lru";  // lru | s3fifo
  int metrics_port = 9464;
  bool write_through = false;
  uint32_t disk_admit_hits = 0;
  std::string config;
};

uint64_t available_ram() {
  std::ifstream f("/proc/meminfo");
  std::string k;
  uint64_t v;
  std::string unit;
  while (f >> k >> v >> unit)
    if (k == "MemAvailable:") return v * 1024;
  return 4ull << 30;
}

// A config file of "name: value" lines (YAML's simple form, as LMCache's files use).
bool apply_config(const std::string& path, AgentSettings* s) {
  std::ifstream f(path);
  if (!f) {
    std::cerr << "dpukv agent: cannot read config " << path << "\n";
    return false;
  }
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    ++n;
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    const size_t colon = line.find(':');
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (colon == std::string::npos) {
      std::cerr << path << ":" << n << ": expected 'name: value'\n";
      return false;
    }
    auto trim = [](std::string x) {
      x.erase(0, x.find_first_not_of(" \t\"'"));
      x.erase(x.find_last_not_of(" \t\"'\r") + 1);
      return x;
    };
    const std::string k = trim(line.substr(0, colon)), v = trim(line.substr(colon + 1));
    try {
      if (k == "chunk_size")
        s->chunk_size = static_cast<uint32_t>(std::stoul(v));
      else if (k == "max_local_cpu_size")
        s->max_local_cpu_size = std::stod(v);
      else if (k == "local_disk")
        s->local_disk = v.rfind("file://", 0) == 0 ? v.substr(7) : v;
      else if (k == "max_local_disk_size")
        s->max_local_disk_size = std::stod(v);
      else if (k == "socket")
        s->socket = v;
      else if (k == "metrics_port")
        s->metrics_port = std::stoi(v);
      else if (k == "max_chunk_size")
        s->max_chunk = v;
      else if (k == "write_through")
        s->write_through = v == "true" || v == "1";
      else if (k == "disk_admit_hits")
        s->disk_admit_hits = static_cast<uint32_t>(std::stoul(v));
      else
        std::cerr << path << ":" << n << ": unknown setting '" << k << "' ignored\n";
    } catch (const std::exception&) {
      std::cerr << path << ":" << n << ": bad value for " << k << "\n";
      return false;
    }
  }
  return true;
}

void apply_env(AgentSettings* s) {
  auto env = [](const char* n) -> const char* {
    const char* v = std::getenv(n);
    return v && *v ? v : nullptr;
  };
  if (auto v = env("DPUKV_SOCKET")) s->socket = v;
  if (auto v = env("DPUKV_MAX_LOCAL_CPU_SIZE")) s->max_local_cpu_size = std::atof(v);
  if (auto v = env("DPUKV_LOCAL_DISK")) s->local_disk = v;
  if (auto v = env("DPUKV_MAX_LOCAL_DISK_SIZE")) s->max_local_disk_size = std::atof(v);
  if (auto v = env("DPUKV_METRICS_PORT")) s->metrics_port = std::atoi(v);
}

int run_agent(AgentSettings s, const std::map<std::string, bool>& given) {
  // Precedence: flags > environment > config file > embedded defaults.
  AgentSettings flags = s;
  if (!s.config.empty() && !apply_config(s.config, &s)) return 2;
  apply_env(&s);
  if (given.at("socket")) s.socket = flags.socket;
  if (given.at("mem")) s.max_local_cpu_size = flags.max_local_cpu_size;
  if (given.at("disk")) s.local_disk = flags.local_disk;
  if (given.at("disk_size")) s.max_local_disk_size = flags.max_local_disk_size;
  if (given.at("metrics")) s.metrics_port = flags.metrics_port;

  AgentOptions o;
  o.socket_path = s.socket;
  uint64_t max_chunk = 0;
  if (!bench::parse_size(s.max_chunk, &max_chunk).ok() || max_chunk == 0) {
    std::cerr << "dpukv agent: bad --max-chunk-size\n";
    return 2;
  }
  // Embedded default: a quarter of the available RAM, at most 4 GiB.
  uint64_t mem = s.max_local_cpu_size > 0
                     ? static_cast<uint64_t>(s.max_local_cpu_size * (1ull << 30))
                     : std::min<uint64_t>(available_ram() / 4, 4ull << 30);
  if (!s.memory_bytes.empty() && (!bench::parse_size(s.memory_bytes, &mem).ok() || mem == 0)) {
    std::cerr << "dpukv agent: bad --memory-bytes\n";
    return 2;
  }
  o.cache.memory_bytes = std::max(mem, max_chunk);
  o.cache.max_chunk_bytes = max_chunk;
  const uint64_t disk = static_cast<uint64_t>(s.max_local_disk_size * (1ull << 30));
  o.cache.max_chunks = s.max_chunks
                           ? s.max_chunks
                           : static_cast<uint32_t>(std::min<uint64_t>(
                                 (o.cache.memory_bytes + disk) / (16 << 10) + 1024, 16u << 20));
  o.cache.disk_dir = s.local_disk;
  o.cache.disk_bytes = static_cast<uint64_t>(s.max_local_disk_size * (1ull << 30));
  o.cache.nvme_address = s.nvme_tier;
  o.cache.nvme_nqn = s.nvme_tier_nqn;
  if (!s.nvme_tier.empty() && s.local_disk.empty()) {
    std::cerr << "dpukv agent: --nvme-tier needs --local-disk (the tier's index log lives there)\n";
    return 2;
  }
  if (!s.local_disk.empty() && o.cache.disk_bytes < max_chunk) {
    std::cerr << "dpukv agent: local_disk needs max_local_disk_size (GB) of at least one chunk\n";
    return 2;
  }
  o.cache.write_through = s.write_through;
  o.cache.dma.num_threads = s.dma_threads;
  o.cache.compress = s.compress;
  o.cache.policy =
      s.eviction == "s3fifo" ? CacheOptions::Policy::kS3Fifo : CacheOptions::Policy::kLru;
  o.cache.disk_admit_hits = s.disk_admit_hits;
  o.metrics_port = s.metrics_port;
  std::unique_ptr<Agent> agent;
  Status st = Agent::create(o, &agent);
  if (!st.ok()) {
    std::cerr << "dpukv agent: cannot start: " << st.name() << ": " << st.description() << "\n";
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  if (agent->metrics_port() > 0)
    APP_LOG_INFO("agent: metrics on http://127.0.0.1:%d/metrics", agent->metrics_port());
  st = agent->run(&g_stop);
  if (!st.ok()) {
    std::cerr << "dpukv agent: " << st.name() << ": " << st.description() << "\n";
    return 1;
  }
  return 0;
}

int run_stat(const std::string& socket, bool json) {
  ClientOptions o;
  o.socket_path = socket;
  o.connect_timeout_ms = 1000;
  std::unique_ptr<Client> c;
  std::string text;
  if (!Client::connect(o, &c).ok() || !c->stats_json(&text).ok()) {
    std::cerr << "dpukv stat: no agent at " << (socket.empty() ? default_socket_path() : socket)
              << "\n";
    return 1;
  }
  if (json) {
    std::cout << text << std::endl;
    return 0;
  }
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) {
    std::cerr << "dpukv stat: unreadable answer\n";
    return 1;
  }
  auto gib = [](uint64_t b) { return static_cast<double>(b) / (1ull << 30); };
  const uint64_t keys = j["lookup_keys"], hits = j["lookup_hits"];
  std::printf("clients        %llu connected\n", (unsigned long long)j["clients"].get<uint64_t>());
  std::printf("chunks         %llu (%llu in memory, %llu on disk)\n",
              (unsigned long long)j["chunks"].get<uint64_t>(),
              (unsigned long long)j["memory_chunks"].get<uint64_t>(),
              (unsigned long long)j["disk_chunks"].get<uint64_t>());
  std::printf("memory tier    %.2f of %.2f GiB\n", gib(j["memory_used_bytes"]),
              gib(j["memory_capacity_bytes"]));
  std::printf("disk tier      %.2f of %.2f GiB\n", gib(j["disk_used_bytes"]),
              gib(j["disk_capacity_bytes"]));
  std::printf("lookups        %llu keys, %.1f%% found\n", (unsigned long long)keys,
              keys ? 100.0 * hits / keys : 0.0);
  std::printf("stored         %llu chunks, %.2f GiB\n",
              (unsigned long long)j["stores"].get<uint64_t>(), gib(j["store_bytes"]));
  std::printf("retrieved      %llu chunks, %.2f GiB (%llu misses)\n",
              (unsigned long long)j["retrieves"].get<uint64_t>(), gib(j["retrieve_bytes"]),
              (unsigned long long)j["misses"].get<uint64_t>());
  std::printf("evictions      %llu (spills %llu, reloads %llu)\n",
              (unsigned long long)j["evictions"].get<uint64_t>(),
              (unsigned long long)j["spills"].get<uint64_t>(),
              (unsigned long long)j["reloads"].get<uint64_t>());
  std::printf("errors         %llu checksum, %llu I/O, %llu bad requests, %llu protocol\n",
              (unsigned long long)j["checksum_failures"].get<uint64_t>(),
              (unsigned long long)j["io_errors"].get<uint64_t>(),
              (unsigned long long)j["bad_requests"].get<uint64_t>(),
              (unsigned long long)j["protocol_errors"].get<uint64_t>());
  return 0;
}

}  // namespace

void add_agent_commands(CLI::App* app, int* exit_code) {
  auto s = std::make_shared<AgentSettings>();
  auto given = std::make_shared<std::map<std::string, bool>>();
  CLI::App* cmd =
      app->add_subcommand("agent", "Run the offload agent (the cache daemon) until SIGTERM/SIGINT");
  auto* o_socket =
      cmd->add_option("--socket", s->socket,
                      "UNIX socket path (default: $XDG_RUNTIME_DIR/dpukv.sock or /run/dpukv.sock)");
  auto* o_mem = cmd->add_option("--max-local-cpu-size", s->max_local_cpu_size,
                                "Memory tier in GB (default: 1/4 of available RAM, at most 4)");
  auto* o_disk =
      cmd->add_option("--local-disk", s->local_disk, "Disk tier directory (default: no disk tier)");
  auto* o_dsize =
      cmd->add_option("--max-local-disk-size", s->max_local_disk_size, "Disk tier in GB");
  cmd->add_option(
      "--nvme-tier", s->nvme_tier,
      "Put the disk tier's data on an NVMe/TCP namespace at ADDR:PORT (the index log stays in "
      "--local-disk)");
  cmd->add_option("--nvme-tier-nqn", s->nvme_tier_nqn, "Subsystem NQN of the NVMe tier")
      ->capture_default_str();
  cmd->add_option("--max-chunk-size", s->max_chunk, "Largest chunk (K/M/G)")->capture_default_str();
  cmd->add_option("--memory-bytes", s->memory_bytes,
                  "Exact memory tier size (K/M/G), instead of --max-local-cpu-size");
  cmd->add_option("--eviction", s->eviction, "Eviction policy: lru or s3fifo")
      ->capture_default_str()
      ->check(CLI::IsMember({"lru", "s3fifo"}));
  cmd->add_flag("--compress", s->compress,
                "Encode chunks (lossless KV codec, bf16) on the compress engine before storing");
  cmd->add_option("--dma-threads", s->dma_threads, "DMA engine threads")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  cmd->add_option("--max-chunks", s->max_chunks,
                  "Index capacity in chunks (default: tiers / 16 KiB)");
  auto* o_metrics = cmd->add_option("--metrics-port", s->metrics_port,
                                    "Prometheus metrics on 127.0.0.1:PORT (0: off)")
                        ->capture_default_str();
  cmd->add_flag("--write-through", s->write_through,
                "Write every chunk to the disk tier at once (default: on eviction)");
  cmd->add_option("--disk-admit-hits", s->disk_admit_hits, "Only chunks hit this often go to disk")
      ->capture_default_str();
  cmd->add_option("--config", s->config,
                  "Config file of 'name: value' lines (LMCache names: chunk_size, "
                  "max_local_cpu_size, local_disk, max_local_disk_size)");
  cmd->callback([=] {
    (*given)["socket"] = o_socket->count() > 0;
    (*given)["mem"] = o_mem->count() > 0;
    (*given)["disk"] = o_disk->count() > 0;
    (*given)["disk_size"] = o_dsize->count() > 0;
    (*given)["metrics"] = o_metrics->count() > 0;
    *exit_code = run_agent(*s, *given);
  });

  auto socket = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  CLI::App* stat = app->add_subcommand("stat", "Print a summary of a running agent");
  stat->add_option("--socket", *socket, "Agent socket");
  stat->add_flag("--json", *json, "Print the agent's JSON");
  stat->callback([socket, json, exit_code] { *exit_code = run_stat(*socket, *json); });
}

}  // namespace dpukv
