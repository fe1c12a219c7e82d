#include "tools/bench/client.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <vector>

#include "client/client.h"
#include "comch/client.h"
#include "runtime/child_process.h"
#include "runtime/log.h"
#include "runtime/mem_region.h"
#include "tools/common/bench_common.h"

namespace dpukv {
namespace {

using bench::Json;

struct Config {
  std::string sizes = "1M,4M,16M,64M";
  std::string bytes = "1G";  // moved per size and direction
  uint32_t batch = 16;       // a prompt's chunks go together, as LMCache stores them
  uint32_t rtt_iterations = 2000;
  bool json = false;
  bench::OutputOptions out;
};

pid_t start(const std::vector<std::string>& args) {
  return bench::spawn_self(args, -1);
}
void stop(pid_t p) {
  if (p > 0) {
    signal_child(p, SIGTERM);
    reap_child(p, nullptr);
  }
}

// Round trip of a 64-byte DATA message to a comch echo peer, waiting the way the
// client library waits.
double comch_rtt_p50(const std::string& path, uint32_t iters) {
  std::unique_ptr<ProgressEngine> pe;
  std::unique_ptr<ComchClient> cl;
  ComchClientOptions o;
  o.path = path;
  o.connect_timeout_ms = 5000;
  static uint64_t rx = 0;
  ComchCallbacks cb;
  cb.on_recv = [](ComchConnection*, const uint8_t*, uint32_t, UserData) { ++rx; };
  cb.on_send_done = [](ComchSendTask*, UserData, UserData) {};
  cb.on_send_error = cb.on_send_done;
  if (!ProgressEngine::create(&pe).ok() || !ComchClient::create(pe.get(), o, &cl).ok() ||
      !cl->set_callbacks(cb).ok() || !cl->set_send_conf(4).ok() || cl->start() != Code::kInProgress)
    return 0;
  while (cl->state() == CtxState::kStarting) pe->wait(20000, 10);
  if (cl->state() != CtxState::kRunning) return 0;
  bench::LatencyRecorder lat;
  char msg[64];
  std::memset(msg, 'P', sizeof(msg));
  std::memcpy(msg, "Mspin", 5);  // the peer spins, as the agent does while busy
  for (uint32_t i = 0; i < iters + iters / 10 + 1; ++i) {
    ComchSendTask* t;
    const uint64_t before = rx, t0 = bench::now_ns();
    if (!cl->send_alloc_init(cl->connection(), msg, 64, UserData{}, &t).ok() || !cl->submit(t).ok())
      return 0;
    while (rx == before) pe->wait(50000, 10);
    (void)cl->free(t);
    if (i > iters / 10) lat.add(bench::now_ns() - t0);
    msg[0] = 'P';
  }
  lat.finish();
  (void)cl->stop();
  while (cl->state() != CtxState::kIdle) pe->progress();
  return lat.percentile_us(50);
}

int run(const Config& c) {
  std::vector<uint64_t> sizes;
  uint64_t bytes = 0;
  if (!bench::parse_size_list(c.sizes, &sizes).ok() || !bench::parse_size(c.bytes, &bytes).ok()) {
    std::cerr << "dpukv bench client: bad --sizes or --bytes\n";
    return 2;
  }
  uint64_t max_size = 0;
  for (uint64_t s : sizes) max_size = std::max(max_size, s);
  const std::string sock = "/tmp/dpukv-bench-client-" + std::to_string(getpid()) + ".sock";
  const uint64_t tier = std::max<uint64_t>(bytes + 2 * max_size * c.batch, 256 << 20);
  pid_t agent = start({"--log-level", "warning", "agent", "--socket", sock, "--memory-bytes",
                       std::to_string(tier), "--max-chunk-size", std::to_string(max_size),
                       "--metrics-port", "0", "--dma-threads", "2"});
  ClientOptions o;
  o.socket_path = sock;
  o.connect_timeout_ms = 20000;
  std::unique_ptr<Client> cl;
  Staging st;
  const uint64_t staging_bytes = 2 * max_size * c.batch;
  Status cs = agent < 0 ? Status(Code::kDriver) : Client::connect(o, &cl);
  if (cs.ok()) cs = cl->alloc_staging(staging_bytes, &st);
  if (!cs.ok()) {
    std::cerr << "dpukv bench client: cannot start or reach the agent: " << cs.name() << "\n";
    stop(agent);
    return 1;
  }
  for (uint64_t i = 0; i < staging_bytes; i += 4096) st.data[i] = static_cast<uint8_t>(i >> 12);
  // The baseline's destination rotates through as many bytes as the agent's memory
  // tier receives, so both write cold memory.
  std::unique_ptr<MemRegion> target;
  if (!MemRegion::create(bytes + max_size * c.batch, MemRegionOptions{}, &target).ok()) {
    stop(agent);
    return 1;
  }
  auto* tgt = static_cast<uint8_t*>(target->data());
  std::vector<Json> rows;
  const KeyContext ctx{1, 1, 0, 0};
  uint64_t id = 0;
  if (!c.out.json)
    std::printf(
        "dpukv bench client: a separate agent process; client batches of %u chunks; memory tier "
        "%s\n",
        c.batch, bench::format_size(tier).c_str());
  for (uint64_t size : sizes) {
    const uint64_t n = std::max<uint64_t>(c.batch, bytes / size / c.batch * c.batch);
    std::vector<ChunkKey> keys(n);
    for (auto& k : keys) k = key_from_block_id(ctx, id++);
    std::vector<uint64_t> offs(c.batch), lens(c.batch, size);
    for (uint32_t i = 0; i < c.batch; ++i) offs[i] = i * size;
    auto timed = [&](bool store) {
      const uint64_t t0 = bench::now_ns();
      for (uint64_t b = 0; b < n; b += c.batch) {
        Status s =
            store ? cl->store(st, keys.data() + b, offs.data(), lens.data(), c.batch, nullptr)
                  : cl->retrieve(st, keys.data() + b, offs.data(), lens.data(), c.batch, nullptr);
        if (!s.ok()) {
          std::cerr << "dpukv bench client: " << (store ? "store" : "retrieve")
                    << " failed: " << s.name() << "\n";
          return -1.0;
        }
      }
      return n * size / ((bench::now_ns() - t0) / 1e9) / 1e9;
    };
    const double sg = timed(true), rg = timed(false);
    // Baseline: memcpy of the same bytes out of the same staging buffer.
    const uint64_t t0 = bench::now_ns();
    for (uint64_t b = 0; b < n; b += c.batch)
      for (uint32_t i = 0; i < c.batch; ++i)
        std::memcpy(tgt + (b + i) * size % (bytes + 1 - size), st.data + offs[i], size);
    const double base = n * size / ((bench::now_ns() - t0) / 1e9) / 1e9;
    if (sg < 0 || rg < 0) {
      std::cerr << "dpukv bench client: store or retrieve failed at " << bench::format_size(size)
                << "\n";
      stop(agent);
      return 1;
    }
    Json row{{"bench", "client"},        {"size_bytes", size},         {"store_gbps", sg},
             {"retrieve_gbps", rg},      {"baseline", "memcpy"},       {"baseline_gbps", base},
             {"store_ratio", sg / base}, {"retrieve_ratio", rg / base}};
    rows.push_back(row);
    if (!c.out.json)
      std::printf(
          "%7s  store %6.2f GB/s  retrieve %6.2f GB/s  memcpy %6.2f GB/s  ratios %.2f / %.2f\n",
          bench::format_size(size).c_str(), sg, rg, base, sg / base, rg / base);
  }
  // Lookup of one key, against a bare comch round trip to an echo peer.
  bench::LatencyRecorder lk;
  ChunkKey k = key_from_block_id(ctx, 0);
  for (uint32_t i = 0; i < c.rtt_iterations + c.rtt_iterations / 10; ++i) {
    const uint64_t t0 = bench::now_ns();
    (void)cl->lookup(&k, 1, false);
    if (i >= c.rtt_iterations / 10) lk.add(bench::now_ns() - t0);
  }
  lk.finish();
  cl.reset();
  stop(agent);
  const std::string peer_path = "@dpukv-bench-client-peer-" + std::to_string(getpid());
  pid_t peer = start({"bench", "comch-peer", "--path", peer_path});
  const double comch = comch_rtt_p50(peer_path, c.rtt_iterations);
  stop(peer);
  Json row{{"bench", "client"},
           {"op", "lookup-1-key"},
           {"lookup_rtt_p50_us", lk.percentile_us(50)},
           {"lookup_rtt_p99_us", lk.percentile_us(99)},
           {"baseline", "comch control round trip, 64 B"},
           {"comch_rtt_p50_us", comch},
           {"ratio", bench::ratio(lk.percentile_us(50), comch)}};
  rows.push_back(row);
  if (!c.out.json)
    std::printf(
        "lookup of one key: p50 %.1f us (p99 %.1f)   comch round trip p50 %.1f us   ratio %.2f\n",
        lk.percentile_us(50), lk.percentile_us(99), comch,
        comch > 0 ? lk.percentile_us(50) / comch : 0.0);
  if (c.out.json)
    bench::print_json("client", rows);
  else
    bench::print_machine_line();
  return bench::write_csv(c.out, rows) ? 0 : 1;
}

}  // namespace

void add_bench_client_command(CLI::App* bench, int* exit_code) {
  auto c = std::make_shared<Config>();
  CLI::App* cmd = bench->add_subcommand(
      "client", "Benchmark store/retrieve and lookup through a real agent process");
  cmd->add_option("--sizes", c->sizes, "Chunk sizes")->capture_default_str();
  cmd->add_option("--bytes", c->bytes, "Bytes moved per size and direction")->capture_default_str();
  cmd->add_option("--batch", c->batch, "Chunks per request")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  cmd->add_option("--rtt-iterations", c->rtt_iterations, "Round trips measured")
      ->capture_default_str();
  bench::add_output_options(cmd, &c->out);
  cmd->callback([c, exit_code] { *exit_code = run(*c); });
}

}  // namespace dpukv
