#include "tools/replay.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/agent.h"
#include "cache/eviction_policy.h"
#include "client/client.h"
#include "runtime/child_process.h"
#include "runtime/log.h"
#include "tools/bench_common.h"
#include "tools/node_network.h"

extern char** environ;

namespace dpukv {
namespace {

using bench::Json;

// KV bytes per token of each preset (bf16 unless noted), and an assumed prefill
// throughput used only to estimate the compute a hit saves. The throughputs are
// round figures for one 8xH100 node running the model with vLLM-class kernels;
// they are assumptions, stated in docs/replay.md, not measurements.
struct Preset {
  const char* name;
  uint64_t bytes_per_token;
  double prefill_tokens_per_s;
};
constexpr Preset kPresets[] = {
    {"llama-3.1-8b", 32ull * 8 * 128 * 2 * 2, 40000},  // 131,072 B/token
    {"qwen2.5-7b", 28ull * 4 * 128 * 2 * 2, 45000},    // 57,344 B/token
    {"llama-3.1-70b", 80ull * 8 * 128 * 2 * 2, 8000},  // 327,680 B/token
    {"deepseek-v3", 61ull * (512 + 64) * 2, 6000},     // MLA latent + rope key: 70,272 B/token
};

struct Request {
  double ts_ms;
  uint32_t input_length;
  std::vector<uint64_t> ids;
};

struct Config {
  std::string trace;
  std::string agent_socket;
  std::string model = "llama-3.1-8b";
  uint32_t scale = 1024;
  uint64_t capacity_blocks = 10000;
  uint64_t disk_blocks = 0;  // a disk tier of this many blocks on the agent it starts
  std::string disk_dir;      // where (default: a fresh directory under /var/tmp)
  uint32_t clients = 1;
  double speedup = 0;
  uint64_t max_requests = 0;
  bool json = false;
  bool no_verify = false;
  std::string plot;
  std::string eviction = "lru";
  uint32_t nodes = 1;  // agents in a cluster (a Redis directory the replay starts)
  bool no_netns = false;
};

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Limits that keep a hostile or broken trace from taking the machine: a request
// of more blocks than this is refused with its line number.
constexpr size_t kMaxBlocksPerRequest = 16384;

Status load_trace(const std::string& path, uint64_t limit, std::vector<Request>* out,
                  std::string* err) {
  std::ifstream f(path);
  if (!f) {
    *err = "cannot open " + path;
    return Code::kNotFound;
  }
  std::string line;
  uint64_t n = 0;
  auto bad = [&](const std::string& why) {
    *err = path + ":" + std::to_string(n) + ": " + why;
    return Status(Code::kInvalidValue);
  };
  while (std::getline(f, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("hash_ids") ||
        !j["hash_ids"].is_array() || !j.contains("input_length") ||
        !j["input_length"].is_number_unsigned() || !j.contains("timestamp") ||
        !j["timestamp"].is_number())
      return bad("not a trace record (timestamp, input_length, hash_ids)");
    const double ts = j["timestamp"].get<double>();
    if (!std::isfinite(ts) || ts < 0) return bad("timestamp must be a finite number >= 0");
    if (!out->empty() && ts < out->back().ts_ms)
      return bad("timestamp " + std::to_string(ts) + " is earlier than the line before's (" +
                 std::to_string(out->back().ts_ms) + "): a trace must be in time order");
    if (j["hash_ids"].size() > kMaxBlocksPerRequest)
      return bad(std::to_string(j["hash_ids"].size()) + " hash_ids; at most " +
                 std::to_string(kMaxBlocksPerRequest) + " per request");
    if (j["input_length"].get<uint64_t>() > 512ull * (j["hash_ids"].size() + 1) ||
        (j["input_length"].get<uint64_t>() == 0 && !j["hash_ids"].empty()))
      return bad("input_length " + std::to_string(j["input_length"].get<uint64_t>()) +
                 " does not fit " + std::to_string(j["hash_ids"].size()) + " blocks of 512 tokens");
    Request r{ts, j["input_length"].get<uint32_t>(), {}};
    r.ids.reserve(j["hash_ids"].size());
    for (const auto& id : j["hash_ids"]) {
      if (!id.is_number_unsigned()) return bad("hash_ids must be non-negative integers");
      r.ids.push_back(id.get<uint64_t>());
    }
    out->push_back(std::move(r));
    if (limit && out->size() >= limit) break;
  }
  return Code::kSuccess;
}

// Block contents are a function of the block id, so every retrieve can be checked.
inline uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}
void fill_block(uint64_t id, uint8_t* p, uint64_t len) {
  const uint64_t seed = mix(id + 1);
  auto* w = reinterpret_cast<uint64_t*>(p);
  for (uint64_t i = 0; i < len / 8; ++i) w[i] = seed ^ (i * 0x9e3779b97f4a7c15ull);
}
bool check_block(uint64_t id, const uint8_t* p, uint64_t len) {
  const uint64_t seed = mix(id + 1);
  auto* w = reinterpret_cast<const uint64_t*>(p);
  uint64_t bad = 0;
  for (uint64_t i = 0; i < len / 8; ++i) bad |= w[i] ^ (seed ^ (i * 0x9e3779b97f4a7c15ull));
  return bad == 0;
}

// Exact LRU over block ids, with the replay's access pattern: a present block moves
// to the front, a missing one is inserted (evicting the least recent).
class LruSim {
 public:
  explicit LruSim(uint64_t cap) : cap_(cap) {}
  // Returns the request's prefix hits (leading present blocks).
  uint32_t access(const std::vector<uint64_t>& ids) {
    uint32_t hits = 0;
    bool prefix = true;
    for (uint64_t id : ids) {
      auto it = pos_.find(id);
      if (it != pos_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        if (prefix) ++hits;
      } else {
        prefix = false;
        lru_.push_front(id);
        pos_[id] = lru_.begin();
        if (lru_.size() > cap_) {
          pos_.erase(lru_.back());
          lru_.pop_back();
        }
      }
    }
    return hits;
  }

 private:
  uint64_t cap_;
  std::list<uint64_t> lru_;
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> pos_;
};

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

struct Totals {
  uint64_t requests = 0, blocks = 0, hit_blocks = 0, tokens = 0, hit_tokens = 0, sim_hits = 0;
  uint64_t stored_bytes = 0, retrieved_bytes = 0, verified_bytes = 0, verify_failures = 0;
  uint64_t store_ns = 0, retrieve_ns = 0, lost_hits = 0, hier_sim_hits = 0, retries = 0;
  std::map<std::string, uint64_t> failures;  // "store NO_MEMORY" -> entries
  bench::LatencyRecorder lookup_lat{1u << 18}, retrieve_lat{1u << 18};
  struct Bucket {
    uint64_t refs = 0, hits = 0, bytes = 0, ns = 0;
  };
  std::vector<Bucket> timeline;  // per minute of trace time
};

int run(const Config& c) {
  const Preset* preset = nullptr;
  for (const Preset& p : kPresets)
    if (c.model == p.name) preset = &p;
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
  const uint64_t staging_bytes = max_blocks * block;
  if (staging_bytes > (4ull << 30)) {
    std::cerr << "dpukv replay: the longest request (" << max_blocks << " blocks of "
              << bench::format_size(block) << ") needs " << bench::format_size(staging_bytes)
              << " of staging per client; raise --scale\n";
    return 2;
  }

  // The agents: ours, unless one was named. They die with this process (a replay
  // that is killed or crashes leaves no agent behind). With --nodes N, N agents
  // share chunks through a Redis directory the replay starts too.
  const uint32_t nodes = std::max<uint32_t>(1, c.nodes);
  if (nodes > 1 && !c.agent_socket.empty()) {
    std::cerr << "dpukv replay: --nodes starts its own agents; it cannot use --agent\n";
    return 2;
  }
  std::vector<pid_t> agent_pids;
  std::vector<std::string> sockets;
  std::vector<std::string> disk_dirs;
  pid_t redis_pid = -1;
  uint16_t redis_port = 0;
  auto stop_agents = [&] {
    for (pid_t& p : agent_pids) {
      if (p <= 0) continue;
      signal_child(p, SIGTERM);
      int status;
      reap_child(p, &status);
      p = -1;
    }
    if (redis_pid > 0) {
      (void)signal_child(redis_pid, SIGKILL);
      (void)reap_child(redis_pid, nullptr);
      redis_pid = -1;
    }
    for (const std::string& d : disk_dirs) std::filesystem::remove_all(d);
    disk_dirs.clear();
  };
  NodeNetwork net;
  bool netns = false;
  if (nodes > 1 && !c.no_netns && geteuid() == 0) {
    netns = net.create(nodes);
    if (!netns) {
      std::cerr << "dpukv replay: cannot make network namespaces for the agents (ip from "
                   "iproute2, as root); give --no-netns to run them on loopback\n";
      return 1;
    }
  }
  const std::string redis_host = netns ? net.bridge_ip() : "127.0.0.1";
  if (nodes > 1) {
    redis_pid = bench::start_redis_server(&redis_port, redis_host);
    if (redis_pid < 0) {
      std::cerr << "dpukv replay: --nodes needs redis-server (Debian's redis-server package) for "
                   "the cluster directory; none could be started\n";
      return 1;
    }
  }
  if (c.agent_socket.empty()) {
    for (uint32_t n = 0; n < nodes; ++n) {
      const std::string socket = "/tmp/dpukv-replay-" + std::to_string(getpid()) +
                                 (nodes > 1 ? "-" + std::to_string(n) : "") + ".sock";
      std::vector<std::string> args = {
          "--log-level",
          "warning",
          "agent",
          "--socket",
          socket,
          "--memory-bytes",
          std::to_string(c.capacity_blocks * block),
          "--max-chunk-size",
          std::to_string(block),
          "--max-chunks",
          std::to_string((c.capacity_blocks + c.disk_blocks) * 2 + 1024),
          "--metrics-port",
          "0",
          "--eviction",
          c.eviction,
          "--parent-pid",
          std::to_string(getpid())};
      if (nodes > 1)
        args.insert(args.end(),
                    {"--cluster", "redis://" + redis_host + ":" + std::to_string(redis_port),
                     "--cluster-prefix", "replay-" + std::to_string(getpid())});
      if (netns) args.insert(args.end(), {"--advertise", net.ip(n)});
      if (c.disk_blocks > 0) {
        std::string dir =
            c.disk_dir.empty() ? "" : c.disk_dir + (nodes > 1 ? "/node" + std::to_string(n) : "");
        if (dir.empty()) {
          char tmpl[] = "/var/tmp/dpukv-replay-disk-XXXXXX";
          if (mkdtemp(tmpl) == nullptr) {
            std::cerr << "dpukv replay: cannot make a disk tier directory under /var/tmp: "
                      << std::strerror(errno) << "\n";
            stop_agents();
            return 1;
          }
          dir = tmpl;
          disk_dirs.push_back(dir);
        }
        args.insert(args.end(), {"--local-disk", dir, "--max-local-disk-size",
                                 std::to_string(c.disk_blocks * block) + "B"});
      }
      pid_t pid = -1;
      if (netns) {  // `ip netns exec` enters the namespace and execs the agent in place
        std::vector<std::string> full = {"ip", "netns", "exec", net.ns(n), self_exe()};
        full.insert(full.end(), args.begin(), args.end());
        std::vector<char*> argv;
        for (auto& a : full) argv.push_back(a.data());
        argv.push_back(nullptr);
        if (posix_spawnp(&pid, "ip", nullptr, nullptr, argv.data(), environ) != 0) pid = -1;
      } else {
        pid = bench::spawn_self(args, -1);
      }
      if (pid < 0) {
        std::cerr << "dpukv replay: cannot start the agent\n";
        stop_agents();
        return 1;
      }
      agent_pids.push_back(pid);
      sockets.push_back(socket);
    }
  } else {
    sockets.push_back(c.agent_socket);
  }

  // Clients are spread over the agents; with several agents a request goes to
  // agent (request index mod N), as a load balancer without prefix affinity would.
  const uint32_t nclients = std::max<uint32_t>(nodes, std::max<uint32_t>(1, c.clients));
  std::vector<std::unique_ptr<Client>> clients(nclients);
  std::vector<Staging> staging(nclients);
  for (uint32_t i = 0; i < nclients; ++i) {
    const std::string& socket = sockets[i % nodes];
    ClientOptions o;
    o.socket_path = socket;
    o.connect_timeout_ms = 10000;
    o.model = 7;
    if (!Client::connect(o, &clients[i]).ok() ||
        !clients[i]->alloc_staging(max_blocks * block, &staging[i]).ok()) {
      std::cerr << "dpukv replay: cannot reach the agent at " << socket
                << (!agent_pids.empty() ? " (it did not start; see its message above)" : "")
                << "\n";
      stop_agents();
      return 1;
    }
  }
  const KeyContext ctx{7, 1, 0, kv_layout_fingerprint(c.model, 1, 1, 1)};
  LruSim sim(c.capacity_blocks * nodes);               // one cache of the agents' combined capacity
  LruSim hier_sim(c.capacity_blocks + c.disk_blocks);  // memory + disk, one LRU
  Totals t;
  std::mutex mu;  // guards t across client threads
  const double span_ms = reqs.back().ts_ms - reqs.front().ts_ms;
  t.timeline.resize(static_cast<size_t>(span_ms / 60000) + 1);
  const bool tty = bench::progress_enabled() && !c.json;
  std::vector<std::atomic<uint64_t>> next(nodes);  // per agent: its requests taken so far
  for (auto& x : next) x.store(0);
  const uint64_t wall0 = bench::now_ns();

  auto worker = [&](uint32_t w) {
    Client& cl = *clients[w];
    const Staging& sg = staging[w];
    std::vector<ChunkKey> keys;
    std::vector<uint64_t> offs, lens;
    std::vector<Status> sts;
    std::vector<uint32_t> again_k;
    uint64_t retries = 0;
    for (;;) {
      const uint32_t node = w % nodes;
      const uint64_t i = next[node].fetch_add(1) * nodes + node;
      if (i >= reqs.size()) return;
      const Request& r = reqs[i];
      if (c.speedup > 0) {  // honour arrival times, compressed
        const double due_ns = (r.ts_ms - reqs.front().ts_ms) * 1e6 / c.speedup;
        const double now = static_cast<double>(bench::now_ns() - wall0);
        if (due_ns > now)
          std::this_thread::sleep_for(
              std::chrono::nanoseconds(static_cast<uint64_t>(due_ns - now)));
      }
      const uint32_t n = static_cast<uint32_t>(r.ids.size());
      keys.resize(n), offs.resize(n), lens.resize(n), sts.resize(n);
      for (uint32_t k = 0; k < n; ++k) {
        keys[k] = key_from_block_id(ctx, r.ids[k]);
        offs[k] = k * block;
        lens[k] = block;
      }
      uint64_t t0 = bench::now_ns();
      uint32_t hits = cl.lookup(keys.data(), n, false);
      const uint64_t lookup_ns = bench::now_ns() - t0;
      uint32_t got = 0;
      uint64_t retrieve_ns = 0, verified = 0, vfail = 0;
      if (hits > 0) {
        t0 = bench::now_ns();
        (void)cl.retrieve(sg, keys.data(), offs.data(), lens.data(), hits, sts.data());
        retrieve_ns = bench::now_ns() - t0;
        // A block that was evicted or failed its checksum since the lookup is a miss.
        while (got < hits && sts[got].ok()) ++got;
        if (!c.no_verify)
          for (uint32_t k = 0; k < got; ++k) {
            if (check_block(r.ids[k], sg.data + offs[k], block))
              verified += block;
            else
              ++vfail;
          }
      }
      // Prefill of the missed tokens is modelled, not run; then the new blocks are stored.
      for (uint32_t k = got; k < n; ++k) fill_block(r.ids[k], sg.data + offs[k], block);
      uint64_t store_ns = 0;
      std::map<std::string, uint64_t> fails;  // "op CODE" -> entries
      for (uint32_t k = got; k < hits; ++k)
        if (!sts[k].ok() && sts[k] != Code::kNotFound)
          ++fails["retrieve " + std::string(sts[k].name())];
      if (got < n) {
        t0 = bench::now_ns();
        (void)cl.store(sg, keys.data() + got, offs.data() + got, lens.data() + got, n - got,
                       sts.data());
        // AGAIN means "retry": the entries the agent could not take now go again,
        // with a growing pause, before they count as failures.
        for (int attempt = 0; attempt < 20; ++attempt) {
          again_k.clear();
          for (uint32_t k = 0; k < n - got; ++k)
            if (sts[k] == Code::kAgain) again_k.push_back(k);
          if (again_k.empty()) break;
          retries += again_k.size();
          std::this_thread::sleep_for(std::chrono::microseconds(100u << std::min(attempt, 10)));
          for (uint32_t k : again_k) {
            Status one;
            (void)cl.store(sg, &keys[got + k], &offs[got + k], &lens[got + k], 1, &one);
            sts[k] = one;
          }
        }
        store_ns = bench::now_ns() - t0;
        for (uint32_t k = 0; k < n - got; ++k)
          if (!sts[k].ok()) ++fails["store " + std::string(sts[k].name())];
      }
      uint64_t hit_tokens = 0;
      for (uint32_t k = 0; k < got; ++k)
        hit_tokens += k + 1 < n ? 512 : r.input_length - 512ull * (n - 1);
      std::lock_guard<std::mutex> g(mu);
      ++t.requests;
      t.blocks += n;
      t.hit_blocks += got;
      t.lost_hits += hits - got;
      t.tokens += r.input_length;
      t.hit_tokens += hit_tokens;
      for (const auto& [kind, count] : fails) t.failures[kind] += count;
      t.retries += retries;
      retries = 0;
      t.retrieved_bytes += static_cast<uint64_t>(got) * block;
      t.stored_bytes += static_cast<uint64_t>(n - got) * block;
      t.verified_bytes += verified;
      t.verify_failures += vfail;
      t.store_ns += store_ns;
      t.retrieve_ns += retrieve_ns;
      t.lookup_lat.add(lookup_ns);
      if (hits) t.retrieve_lat.add(retrieve_ns);
      auto& b = t.timeline[static_cast<size_t>((r.ts_ms - reqs.front().ts_ms) / 60000)];
      b.refs += n, b.hits += got, b.bytes += static_cast<uint64_t>(n) * block,
          b.ns += lookup_ns + retrieve_ns + store_ns;
      if (tty && (t.requests % 200 == 0 || t.requests == reqs.size())) {
        const double frac = static_cast<double>(t.requests) / reqs.size();
        const int bar = static_cast<int>(frac * 40);
        std::fprintf(stderr, "\r  [%.*s%*s] %5.1f%%  %llu requests  block hits %.1f%%   ", bar,
                     "========================================", 40 - bar, "", 100 * frac,
                     static_cast<unsigned long long>(t.requests),
                     t.blocks ? 100.0 * t.hit_blocks / t.blocks : 0.0);
      }
    }
  };
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < nclients; ++w) threads.emplace_back(worker, w);
  for (auto& th : threads) th.join();
  const double wall_s = (bench::now_ns() - wall0) / 1e9;
  // The simulations see the trace in its own order. What the agents served depends
  // on how the clients' (and nodes') requests interleaved; the ideal it is compared
  // with must not (it moved by 1.1 points from run to run with --nodes 2).
  for (const Request& r : reqs) {
    t.sim_hits += sim.access(r.ids);
    if (c.disk_blocks) t.hier_sim_hits += hier_sim.access(r.ids);
  }
  if (tty) std::fprintf(stderr, "\n");

  std::string agent_json;
  (void)clients[0]->stats_json(&agent_json);
  uint64_t remote_hits = 0, remote_bytes = 0, remote_failures = 0;
  Json node_stats = Json::array();
  for (uint32_t n = 0; n < nodes && nodes > 1; ++n) {
    std::string js;
    (void)clients[n]->stats_json(&js);
    Json j = Json::parse(js, nullptr, false);
    if (j.is_discarded()) continue;
    remote_hits += j.value("lookup_remote_hits", uint64_t{0});
    remote_bytes += j.value("remote_bytes", uint64_t{0});
    remote_failures += j.value("remote_read_errors", uint64_t{0}) +
                       j.value("remote_checksum_failures", uint64_t{0}) +
                       j.value("remote_timeouts", uint64_t{0});
    node_stats.push_back(j);
  }
  const uint64_t rss = agent_pids.empty() ? 0 : peak_rss(agent_pids[0]);
  clients.clear();
  stop_agents();

  t.lookup_lat.finish();
  t.retrieve_lat.finish();
  const double saved_s = t.hit_tokens / preset->prefill_tokens_per_s;
  const double total_prefill_s = t.tokens / preset->prefill_tokens_per_s;
  Json out;
  out["trace"] = c.trace;
  out["model"] = c.model;
  out["scale"] = c.scale;
  out["block_bytes"] = block;
  out["capacity_blocks"] = c.capacity_blocks;
  out["nodes"] = nodes;
  if (nodes > 1) out["network"] = netns ? "namespaces" : "loopback";
  out["eviction"] = c.eviction;
  out["clients"] = nclients;
  out["requests"] = t.requests;
  out["block_references"] = t.blocks;
  out["block_hit_ratio"] = t.blocks ? static_cast<double>(t.hit_blocks) / t.blocks : 0.0;
  out["token_hit_ratio"] = t.tokens ? static_cast<double>(t.hit_tokens) / t.tokens : 0.0;
  out["lru_sim_block_hit_ratio"] = t.blocks ? static_cast<double>(t.sim_hits) / t.blocks : 0.0;
  if (nodes > 1) {
    // Remote hits are counted by the agents at lookup; a few may be lost before
    // the retrieve (hits_lost_after_lookup), so local = hits - remote, at least 0.
    const uint64_t remote = std::min(remote_hits, t.hit_blocks);
    out["local_hit_blocks"] = t.hit_blocks - remote;
    out["remote_hit_blocks"] = remote;
    out["miss_blocks"] = t.blocks - t.hit_blocks;
    out["remote_hit_ratio"] = t.blocks ? static_cast<double>(remote) / t.blocks : 0.0;
    out["remote_bytes"] = remote_bytes;
    out["remote_failures"] = remote_failures;
    out["node_agents"] = node_stats;
  }
  out["disk_blocks"] = c.disk_blocks;
  if (c.disk_blocks)
    out["hierarchy_lru_sim_block_hit_ratio"] =
        t.blocks ? static_cast<double>(t.hier_sim_hits) / t.blocks : 0.0;
  out["hits_lost_after_lookup"] = t.lost_hits;
  out["bytes_stored"] = t.stored_bytes;
  out["bytes_retrieved"] = t.retrieved_bytes;
  out["store_gbps"] = t.store_ns ? t.stored_bytes / (t.store_ns / 1e9) / 1e9 : 0.0;
  out["retrieve_gbps"] = t.retrieve_ns ? t.retrieved_bytes / (t.retrieve_ns / 1e9) / 1e9 : 0.0;
  out["lookup_p50_us"] = t.lookup_lat.percentile_us(50);
  out["lookup_p99_us"] = t.lookup_lat.percentile_us(99);
  out["retrieve_p50_us"] = t.retrieve_lat.percentile_us(50);
  out["retrieve_p99_us"] = t.retrieve_lat.percentile_us(99);
  out["verified_bytes"] = t.verified_bytes;
  out["verify_failures"] = t.verify_failures;
  uint64_t failed = 0;
  Json fj = Json::object();
  for (const auto& [kind, count] : t.failures) {
    fj[kind] = count;
    failed += count;
  }
  out["failures"] = fj;
  out["errors"] = failed;
  out["store_retries"] = t.retries;
  out["prefill_model_tokens_per_s"] = preset->prefill_tokens_per_s;
  out["prefill_seconds_without_cache"] = total_prefill_s;
  out["prefill_seconds_saved"] = saved_s;
  out["agent_peak_rss_bytes"] = rss;
  out["agent_capacity_bytes"] = c.capacity_blocks * block;
  out["wall_seconds"] = wall_s;
  if (!agent_json.empty()) out["agent"] = Json::parse(agent_json, nullptr, false);

  int rc = t.verify_failures || failed ? 1 : 0;
  if (!c.plot.empty()) {
    std::string script =
        "set terminal pngcairo size 1000,500\nset xlabel 'trace time (min)'\n"
        "set ylabel 'block hit ratio (%)'\nset y2label 'GB/s'\nset y2tics\nset ytics nomirror\n"
        "set title 'dpukv replay: " +
        c.model + "'\n$d << EOD\n";
    for (size_t i = 0; i < t.timeline.size(); ++i) {
      const auto& b = t.timeline[i];
      if (!b.refs) continue;
      script += std::to_string(i) + " " + std::to_string(100.0 * b.hits / b.refs) + " " +
                std::to_string(b.ns ? b.bytes / (b.ns / 1e9) / 1e9 : 0.0) + "\n";
    }
    script +=
        "EOD\nplot $d using 1:2 with lines title 'hit ratio', $d using 1:3 axes x1y2 with lines "
        "title 'GB/s'\n";
    std::string perr;
    if (!bench::run_gnuplot(script, c.plot, &perr)) {
      std::cerr << "dpukv replay: no plot: " << perr << "\n";
      rc = 1;
    }
  }

  if (c.json) {
    std::cout << out.dump(2) << std::endl;
  } else {
    std::printf(
        "dpukv replay: %s, %s blocks of %s (512 tokens / %u), %llu-block memory tier, %u "
        "client(s)\n",
        c.trace.c_str(), c.model.c_str(), bench::format_size(block).c_str(), c.scale,
        static_cast<unsigned long long>(c.capacity_blocks), nclients);
    std::printf("  requests            %llu in %.1f s\n",
                static_cast<unsigned long long>(t.requests), wall_s);
    std::printf("  block hit ratio     %.2f%% (%s)   same-run LRU simulation%s: %.2f%%\n",
                100 * out["block_hit_ratio"].get<double>(),
                c.agent_socket.empty() ? c.eviction.c_str() : "external agent",
                nodes > 1       ? " of one cache of the combined capacity"
                : c.disk_blocks ? " of memory alone"
                                : "",
                100 * out["lru_sim_block_hit_ratio"].get<double>());
    if (nodes > 1)
      std::printf(
          "  across %u agents    (%s) %.2f%% local hits, %.2f%% remote hits (%.2f GiB read from "
          "peers), %.2f%% misses; %llu remote reads failed\n",
          nodes, netns ? "each in its own network namespace" : "on loopback",
          100.0 * out["local_hit_blocks"].get<uint64_t>() / t.blocks,
          100 * out["remote_hit_ratio"].get<double>(), remote_bytes / 1073741824.0,
          100.0 * out["miss_blocks"].get<uint64_t>() / t.blocks,
          static_cast<unsigned long long>(remote_failures));
    if (c.disk_blocks)
      std::printf("  with disk tier      %llu blocks; LRU simulation of memory + disk: %.2f%%\n",
                  static_cast<unsigned long long>(c.disk_blocks),
                  100 * out["hierarchy_lru_sim_block_hit_ratio"].get<double>());
    std::printf("  token hit ratio     %.2f%%\n", 100 * out["token_hit_ratio"].get<double>());
    std::printf("  stored / retrieved  %.2f / %.2f GiB at %.2f / %.2f GB/s\n",
                t.stored_bytes / 1073741824.0, t.retrieved_bytes / 1073741824.0,
                out["store_gbps"].get<double>(), out["retrieve_gbps"].get<double>());
    std::printf("  lookup latency      p50 %.1f us, p99 %.1f us\n",
                out["lookup_p50_us"].get<double>(), out["lookup_p99_us"].get<double>());
    std::printf("  retrieve latency    p50 %.1f us, p99 %.1f us (per request)\n",
                out["retrieve_p50_us"].get<double>(), out["retrieve_p99_us"].get<double>());
    std::printf("  verified            %.2f GiB byte for byte, %llu failures\n",
                t.verified_bytes / 1073741824.0,
                static_cast<unsigned long long>(t.verify_failures));
    std::printf(
        "  prefill saved       %.0f s of %.0f s (model: %.0f tokens/s, an assumption; see "
        "docs/replay.md)\n",
        saved_s, total_prefill_s, preset->prefill_tokens_per_s);
    if (failed == 0) {
      std::printf("  failures            none (%llu store entries retried after AGAIN)\n",
                  static_cast<unsigned long long>(t.retries));
    } else {
      std::printf("  failures            %llu entries:", static_cast<unsigned long long>(failed));
      for (const auto& [kind, count] : t.failures)
        std::printf(" %s %llu;", kind.c_str(), static_cast<unsigned long long>(count));
      std::printf("\n");
    }
    if (rss)
      std::printf("  agent peak RSS      %.1f MiB for a %.1f MiB memory tier\n", rss / 1048576.0,
                  c.capacity_blocks * block / 1048576.0);
  }
  return rc;
}

}  // namespace

void add_replay_command(CLI::App* app, int* exit_code) {
  auto c = std::make_shared<Config>();
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
  cmd->add_flag("--no-verify", c->no_verify, "Do not check retrieved bytes");
  cmd->add_flag("--json", c->json, "Print one JSON object");
  cmd->add_option("--plot", c->plot, "Write a PNG of hit ratio and GB/s over trace time (gnuplot)");
  cmd->callback([c, exit_code] { *exit_code = run(*c); });
}

}  // namespace dpukv
