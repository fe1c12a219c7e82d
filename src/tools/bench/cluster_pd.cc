#include "tools/bench/cluster_pd.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <thread>
#include <vector>
#include "client/client.h"
#include "cluster/directory/directory.h"
#include "cluster/ucx/ucx_node.h"
#include "runtime/child_process.h"
#include "runtime/host_port.h"
#include "runtime/log.h"
#include "tools/common/bench_common.h"
#include "tools/common/node_network.h"

namespace dpukv {

using bench::Json;

namespace {
uint8_t pattern(uint64_t i) {
  return static_cast<uint8_t>(i * 131 + (i >> 12));
}
}  // namespace

// Prefill to decode through two agent processes of one cluster: a prefill client
// stores chunks on agent A and has A push them to agent B; a decode client on B
// finds them all locally and retrieves them. Timed from the start of the store to
// the end of the retrieve, against the same store and retrieve on one agent (no
// transfer) in the same run; every byte checked.
int measure_cluster_pd(uint32_t chunks, uint32_t reps, bool json, std::vector<Json>* rows) {
  constexpr uint64_t kChunk = 256 << 10;
  const uint32_t n = chunks;
  uint16_t port = 0;
  const pid_t redis = bench::start_redis_server(&port);
  if (redis < 0) {
    std::cerr << "dpukv bench cluster: no redis-server to start (give --no-pd)\n";
    return 1;
  }
  const std::string base = "/tmp/dpukv-bench-pd-" + std::to_string(getpid());
  std::vector<pid_t> agents;
  for (const char* name : {"a", "b"}) {
    agents.push_back(bench::spawn_self(
        {"--log-level", "error", "agent", "--socket", base + name + ".sock", "--memory-bytes",
         std::to_string(8ull * n * kChunk), "--max-chunk-size", std::to_string(kChunk),
         "--metrics-port", "0", "--cluster", "redis://127.0.0.1:" + std::to_string(port),
         "--cluster-prefix", "pd-bench-" + std::to_string(getpid()), "--parent-pid",
         std::to_string(getpid())},
        -1));
  }
  int rc = 1;
  std::unique_ptr<Client> prefill, decode;
  Staging sp, sd;
  uint64_t b_node = 0;
  // Where the time goes: the prefill's store, the push, the decode's lookup and
  // retrieve; and the baseline's store and retrieve.
  std::vector<double> pd, one, push_only, store_pd, decode_pd, store_one, retrieve_one;
  std::vector<uint64_t> offs(n), lens(n, kChunk);
  std::vector<Status> sts(n);
  for (uint32_t i = 0; i < n; ++i) offs[i] = i * kChunk;
  const KeyContext ctx{7, 1, 0, 0x5044};
  {
    ClientOptions o;
    o.connect_timeout_ms = 10000;
    o.model = 7;
    o.socket_path = base + "b.sock";
    if (!Client::connect(o, &decode).ok()) {
      std::cerr << "dpukv bench cluster: the agents did not start\n";
      goto out;
    }
    o.socket_path = base + "a.sock";
    if (!Client::connect(o, &prefill).ok() || !prefill->alloc_staging(n * kChunk, &sp).ok() ||
        !decode->alloc_staging(n * kChunk, &sd).ok()) {
      std::cerr << "dpukv bench cluster: the agents did not start\n";
      goto out;
    }
    // Both agents in the directory, and B's node id.
    for (int i = 0; i < 500 && b_node == 0; ++i) {
      std::string ja, jb;
      (void)prefill->stats_json(&ja);
      (void)decode->stats_json(&jb);
      const Json a = Json::parse(ja, nullptr, false), b = Json::parse(jb, nullptr, false);
      if (!a.is_discarded() && !b.is_discarded() && a.value("cluster_directory_connected", 0) &&
          b.value("cluster_directory_connected", 0))
        b_node = std::stoull(b.value("cluster_node", std::string("0")), nullptr, 16);
      if (b_node == 0) usleep(10000);
    }
    if (b_node == 0) {
      std::cerr << "dpukv bench cluster: the agents did not join the cluster\n";
      goto out;
    }
  }
  for (uint32_t r = 0; r <= reps; ++r) {  // round 0 warms up
    std::vector<ChunkKey> k(n), k1(n);
    for (uint32_t i = 0; i < n; ++i) {
      k[i] = key_from_block_id(ctx, 2ull * r * n + i);
      k1[i] = key_from_block_id(ctx, (2ull * r + 1) * n + i);
      std::memset(sp.data + offs[i], static_cast<int>(pattern(r * n + i)), kChunk);
    }
    std::memset(sd.data, 0, n * kChunk);
    uint64_t t0 = bench::now_ns();
    if (Status st = prefill->store(sp, k.data(), offs.data(), lens.data(), n, sts.data());
        !st.ok()) {
      std::cerr << "dpukv bench cluster: prefill store: " << st.name() << "\n";
      goto out;
    }
    const uint64_t tp = bench::now_ns();
    Status pst = prefill->push(b_node, k.data(), n, sts.data());
    const uint64_t tp1 = bench::now_ns();
    if (!pst.ok() || decode->lookup(k.data(), n, false) != n ||
        !decode->retrieve(sd, k.data(), offs.data(), lens.data(), n, sts.data()).ok()) {
      std::cerr << "dpukv bench cluster: transfer failed (" << pst.name() << ")\n";
      goto out;
    }
    const uint64_t t1 = bench::now_ns();
    for (uint32_t i = 0; i < n; ++i)
      if (sd.data[offs[i]] != pattern(r * n + i) ||
          sd.data[offs[i] + kChunk - 1] != pattern(r * n + i) ||
          std::memcmp(sd.data + offs[i], sp.data + offs[i], kChunk) != 0) {
        std::cerr << "dpukv bench cluster: decode read wrong bytes\n";
        goto out;
      }
    // Baseline: the same bytes stored and retrieved on one agent.
    const uint64_t b0 = bench::now_ns();
    const bool stored = prefill->store(sp, k1.data(), offs.data(), lens.data(), n, sts.data()).ok();
    const uint64_t bm = bench::now_ns();
    if (!stored || prefill->lookup(k1.data(), n, false) != n ||
        !prefill->retrieve(sp, k1.data(), offs.data(), lens.data(), n, sts.data()).ok()) {
      std::cerr << "dpukv bench cluster: baseline store and retrieve failed\n";
      goto out;
    }
    const uint64_t b1 = bench::now_ns();
    (void)t0;
    // Every round starts from the same caches: this round's chunks go (untimed), so
    // no round's store or ingest pays for evictions, nor evicts what it just moved.
    {
      std::vector<Status> gone(n);
      (void)decode->remove(k.data(), n, gone.data());
      (void)prefill->remove(k.data(), n, gone.data());
      (void)prefill->remove(k1.data(), n, gone.data());
    }
    if (r == 0) continue;
    pd.push_back((t1 - t0) / 1e9);
    push_only.push_back((tp1 - tp) / 1e9);
    one.push_back((b1 - b0) / 1e9);
    store_pd.push_back((tp - t0) / 1e9);
    decode_pd.push_back((t1 - tp1) / 1e9);
    store_one.push_back((bm - b0) / 1e9);
    retrieve_one.push_back((b1 - bm) / 1e9);
  }
  {
    const double t = bench::median(pd), b = bench::median(one), p = bench::median(push_only);
    const double sp_s = bench::median(store_pd), dp_s = bench::median(decode_pd),
                 so_s = bench::median(store_one), ro_s = bench::median(retrieve_one);
    const double bytes = static_cast<double>(n) * kChunk;
    // What a push cannot cost less than on this machine: the bytes through a raw
    // loopback TCP stream (the kernel's copies), on top of one agent's work.
    const double tcp = bench::tcp_stream_seconds(n * kChunk, reps);
    const double floor_s = tcp > 0 ? b + tcp : 0;
    rows->push_back(bench::compared({{"bench", "cluster"},
                                     {"op", "pd_transfer"},
                                     {"chunks", n},
                                     {"size_bytes", n * kChunk},
                                     {"seconds", t},
                                     {"store_seconds", sp_s},
                                     {"push_seconds", p},
                                     {"push_gbps", bytes / p / 1e9},
                                     {"decode_seconds", dp_s},
                                     {"baseline_store_seconds", so_s},
                                     {"baseline_retrieve_seconds", ro_s},
                                     {"tcp_stream_seconds", tcp},
                                     {"floor",
                                      "one agent's store and retrieve plus a raw loopback TCP "
                                      "stream of the same bytes"},
                                     {"floor_seconds", floor_s},
                                     {"floor_ratio", bench::ratio(floor_s, b)}},
                                    "store and retrieve on one agent", "seconds", t, b));
    if (!json)
      std::printf(
          "pd_transfer %u x 256K  store->decode retrieve %8.2f ms (push alone %.2f ms, %.2f GB/s)"
          "   one agent %8.2f ms   ratio %5.2f\n"
          "  medians: store %.2f + push %.2f + decode lookup and retrieve %.2f ms;"
          " one agent: store %.2f + lookup and retrieve %.2f ms\n"
          "  floor: one agent + a raw loopback TCP stream of the bytes (%.2f ms) = %.2f ms,"
          " ratio %.2f\n",
          n, t * 1e3, p * 1e3, bytes / p / 1e9, b * 1e3, t / b, sp_s * 1e3, p * 1e3, dp_s * 1e3,
          so_s * 1e3, ro_s * 1e3, tcp * 1e3, floor_s * 1e3, floor_s / b);
    rc = 0;
  }
out:
  prefill.reset();
  decode.reset();
  for (pid_t p : agents)
    if (p > 0) {
      (void)signal_child(p, SIGTERM);
      (void)reap_child(p, nullptr);
    }
  (void)signal_child(redis, SIGKILL);
  (void)reap_child(redis, nullptr);
  if (rc != 0) std::cerr << "dpukv bench cluster: prefill-to-decode measurement failed\n";
  return rc;
}

}  // namespace dpukv
