#include "tools/replay/clients.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include "client/client.h"
#include "tools/replay/codec.h"

namespace dpukv::replay {

using bench::Json;

int drive_clients(const Config& c, const std::vector<Request>& reqs, const Agents& agents,
                  uint32_t nclients, uint64_t block, uint64_t slot, uint64_t capacity,
                  size_t max_blocks, Totals* out) {
  Totals& t = *out;
  t.capacity_blocks = capacity;
  KvCodec codec{};
  const bool encoded = kv_codec_from_name(c.kv_codec, &codec);
  const uint32_t nodes = static_cast<uint32_t>(agents.sockets().size());
  // Clients are spread over the agents; with several agents a request goes to
  // agent (request index mod N), as a load balancer without prefix affinity would.
  std::vector<std::unique_ptr<Client>> clients(nclients);
  std::vector<Staging> staging(nclients);
  for (uint32_t i = 0; i < nclients; ++i) {
    const std::string& socket = agents.sockets()[i % nodes];
    ClientOptions o;
    o.socket_path = socket;
    o.connect_timeout_ms = 10000;
    o.model = 7;
    if (!Client::connect(o, &clients[i]).ok() ||
        !clients[i]->alloc_staging(max_blocks * slot, &staging[i]).ok()) {
      std::cerr << "dpukv replay: cannot reach the agent at " << socket
                << (agents.own() ? " (it did not start; see its message above)" : "") << "\n";
      return 1;
    }
  }
  const KeyContext ctx{7, 1, 0, kv_layout_fingerprint(c.model, 1, 1, 1)};
  LruSim sim(capacity * nodes);               // one cache of the agents' combined capacity
  LruSim hier_sim(capacity + c.disk_blocks);  // memory + disk, one LRU
  std::mutex mu;                              // guards t across client threads
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
    std::unique_ptr<BlockCodec> bc = encoded ? std::make_unique<BlockCodec>(codec, block) : nullptr;
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
        offs[k] = k * slot;
        lens[k] = slot;  // a retrieve's room; a store's length is set below
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
            if (bc ? bc->check(r.ids[k], sg.data + offs[k])
                   : check_block(r.ids[k], sg.data + offs[k], block))
              verified += block;
            else
              ++vfail;
          }
      }
      // Prefill of the missed tokens is modelled, not run; then the new blocks are stored.
      uint64_t stored = 0;
      for (uint32_t k = got; k < n; ++k) {
        if (bc == nullptr) {
          fill_block(r.ids[k], sg.data + offs[k], block);
        } else if (!bc->encode(r.ids[k], sg.data + offs[k], &lens[k]).ok()) {
          std::cerr << "dpukv replay: a block does not encode\n";  // cannot happen: finite
          std::abort();
        }
        stored += lens[k];
      }
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
      t.stored_bytes += stored;
      t.stored_blocks += n - got;
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
  t.wall_s = (bench::now_ns() - wall0) / 1e9;
  // The simulations see the trace in its own order. What the agents served depends
  // on how the clients' (and nodes') requests interleaved; the ideal it is compared
  // with must not (it moved by 1.1 points from run to run with --nodes 2).
  for (const Request& r : reqs) {
    t.sim_hits += sim.access(r.ids);
    if (c.disk_blocks) t.hier_sim_hits += hier_sim.access(r.ids);
  }
  t.optimum = belady_optimum(reqs, capacity * nodes);
  if (c.disk_blocks) t.hier_optimum = belady_optimum(reqs, capacity + c.disk_blocks);
  if (tty) std::fprintf(stderr, "\n");

  (void)clients[0]->stats_json(&t.agent_json);
  for (uint32_t n = 0; n < nodes && nodes > 1; ++n) {
    std::string js;
    (void)clients[n]->stats_json(&js);
    Json j = Json::parse(js, nullptr, false);
    if (j.is_discarded()) continue;
    t.remote_hits += j.value("lookup_remote_hits", uint64_t{0});
    t.remote_bytes += j.value("remote_bytes", uint64_t{0});
    t.remote_failures += j.value("remote_read_errors", uint64_t{0}) +
                         j.value("remote_checksum_failures", uint64_t{0}) +
                         j.value("remote_timeouts", uint64_t{0});
    t.node_stats.push_back(std::move(j));
  }
  return 0;
}

}  // namespace dpukv::replay
