#include "tools/replay/report.h"

#include <cstdio>
#include <iostream>

#include "tools/common/bench_common.h"

namespace dpukv::replay {

using bench::Json;

int report(const Config& c, const RunShape& s, Totals& t) {
  t.lookup_lat.finish();
  t.retrieve_lat.finish();
  const double saved_s = t.hit_tokens / s.preset->prefill_tokens_per_s;
  const double total_prefill_s = t.tokens / s.preset->prefill_tokens_per_s;
  Json out;
  out["trace"] = c.trace;
  out["model"] = c.model;
  out["scale"] = c.scale;
  out["block_bytes"] = s.block;
  out["capacity_blocks"] = c.capacity_blocks;
  out["kv_codec"] = c.kv_codec;
  // With a codec: the mean stored block and the blocks the memory holds at that size
  // (the simulations' and the optimum's capacity).
  out["stored_block_bytes"] = t.stored_blocks ? t.stored_bytes / t.stored_blocks : s.block;
  out["capacity_blocks_encoded"] = t.capacity_blocks;
  out["nodes"] = s.nodes;
  if (s.nodes > 1) out["network"] = s.netns ? "namespaces" : "loopback";
  out["eviction"] = c.eviction;
  out["clients"] = s.nclients;
  out["requests"] = t.requests;
  out["block_references"] = t.blocks;
  out["block_hit_ratio"] = t.blocks ? static_cast<double>(t.hit_blocks) / t.blocks : 0.0;
  out["token_hit_ratio"] = t.tokens ? static_cast<double>(t.hit_tokens) / t.tokens : 0.0;
  out["lru_sim_block_hit_ratio"] = t.blocks ? static_cast<double>(t.sim_hits) / t.blocks : 0.0;
  // The bound beside every figure: per tier, the capacity, its same-run LRU and its
  // offline optimum; the agent's hit ratio against the deepest tier's optimum.
  const auto ratio = [&](uint64_t hits) {
    return t.blocks ? static_cast<double>(hits) / t.blocks : 0.0;
  };
  const auto share = [](uint64_t hits, uint64_t bound) {
    return bound ? static_cast<double>(hits) / bound : 0.0;
  };
  const OptimumHits& bound = c.disk_blocks ? t.hier_optimum : t.optimum;
  out["optimum_block_hit_ratio"] = ratio(bound.block_hits);
  out["ratio_to_optimum"] = share(t.hit_blocks, bound.block_hits);
  Json tiers = Json::array();
  tiers.push_back({{"tier", "memory"},
                   {"capacity_blocks", t.capacity_blocks * s.nodes},
                   {"lru_sim_block_hit_ratio", ratio(t.sim_hits)},
                   {"optimum_block_hit_ratio", ratio(t.optimum.block_hits)},
                   {"optimum_prefix_hit_ratio", ratio(t.optimum.prefix_hits)},
                   {"lru_ratio_to_optimum", share(t.sim_hits, t.optimum.block_hits)}});
  if (c.disk_blocks)
    tiers.push_back({{"tier", "memory+disk"},
                     {"capacity_blocks", t.capacity_blocks + c.disk_blocks},
                     {"lru_sim_block_hit_ratio", ratio(t.hier_sim_hits)},
                     {"optimum_block_hit_ratio", ratio(t.hier_optimum.block_hits)},
                     {"optimum_prefix_hit_ratio", ratio(t.hier_optimum.prefix_hits)},
                     {"lru_ratio_to_optimum", share(t.hier_sim_hits, t.hier_optimum.block_hits)}});
  out["tiers"] = tiers;
  if (s.nodes > 1) {
    // Remote hits are counted by the agents at lookup; a few may be lost before
    // the retrieve (hits_lost_after_lookup), so local = hits - remote, at least 0.
    const uint64_t remote = std::min(t.remote_hits, t.hit_blocks);
    out["local_hit_blocks"] = t.hit_blocks - remote;
    out["remote_hit_blocks"] = remote;
    out["miss_blocks"] = t.blocks - t.hit_blocks;
    out["remote_hit_ratio"] = t.blocks ? static_cast<double>(remote) / t.blocks : 0.0;
    out["t.remote_bytes"] = t.remote_bytes;
    out["t.remote_failures"] = t.remote_failures;
    out["node_agents"] = t.node_stats;
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
  out["prefill_model_tokens_per_s"] = s.preset->prefill_tokens_per_s;
  out["prefill_seconds_without_cache"] = total_prefill_s;
  out["prefill_seconds_saved"] = saved_s;
  out["agent_peak_rss_bytes"] = s.agent_peak_rss;
  out["agent_capacity_bytes"] = c.capacity_blocks * s.block;
  out["wall_seconds"] = t.wall_s;
  if (!t.agent_json.empty()) out["agent"] = Json::parse(t.agent_json, nullptr, false);

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
        c.trace.c_str(), c.model.c_str(), bench::format_size(s.block).c_str(), c.scale,
        static_cast<unsigned long long>(c.capacity_blocks), s.nclients);
    if (c.kv_codec != "none")
      std::printf(
          "  kv codec            %s: blocks stored in %s on average, %llu of them in the "
          "same memory\n",
          c.kv_codec.c_str(), bench::format_size(out["stored_block_bytes"].get<uint64_t>()).c_str(),
          static_cast<unsigned long long>(t.capacity_blocks));
    std::printf("  requests            %llu in %.1f s\n",
                static_cast<unsigned long long>(t.requests), t.wall_s);
    std::printf("  block hit ratio     %.2f%% (%s)   same-run LRU simulation%s: %.2f%%\n",
                100 * out["block_hit_ratio"].get<double>(),
                c.agent_socket.empty() ? c.eviction.c_str() : "external agent",
                s.nodes > 1     ? " of one cache of the combined capacity"
                : c.disk_blocks ? " of memory alone"
                                : "",
                100 * out["lru_sim_block_hit_ratio"].get<double>());
    if (s.nodes > 1)
      std::printf(
          "  across %u agents    (%s) %.2f%% local hits, %.2f%% remote hits (%.2f GiB read from "
          "peers), %.2f%% misses; %llu remote reads failed\n",
          s.nodes, s.netns ? "each in its own network namespace" : "on loopback",
          100.0 * out["local_hit_blocks"].get<uint64_t>() / t.blocks,
          100 * out["remote_hit_ratio"].get<double>(), t.remote_bytes / 1073741824.0,
          100.0 * out["miss_blocks"].get<uint64_t>() / t.blocks,
          static_cast<unsigned long long>(t.remote_failures));
    if (c.disk_blocks)
      std::printf("  with disk tier      %llu blocks; LRU simulation of memory + disk: %.2f%%\n",
                  static_cast<unsigned long long>(c.disk_blocks),
                  100 * out["hierarchy_lru_sim_block_hit_ratio"].get<double>());
    // Each tier's bound: Belady's optimum for its capacity, with LRU's share of it
    // and, on the deepest tier, the agent's policy's.
    for (size_t i = 0; i < tiers.size(); ++i) {
      const Json& tj = tiers[i];
      char mine[48] = "";
      if (i + 1 == tiers.size())
        std::snprintf(mine, sizeof mine, "   %s %.2fx",
                      c.agent_socket.empty() ? c.eviction.c_str() : "agent",
                      out["ratio_to_optimum"].get<double>());
      std::printf("  %-19s %-11s %6llu blocks %6.2f%%   LRU %.2fx%s\n",
                  i == 0 ? "optimum (Belady)" : "", tj["tier"].get<std::string>().c_str(),
                  static_cast<unsigned long long>(tj["capacity_blocks"].get<uint64_t>()),
                  100 * tj["optimum_block_hit_ratio"].get<double>(),
                  tj["lru_ratio_to_optimum"].get<double>(), mine);
    }
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
        saved_s, total_prefill_s, s.preset->prefill_tokens_per_s);
    if (failed == 0) {
      std::printf("  failures            none (%llu store entries retried after AGAIN)\n",
                  static_cast<unsigned long long>(t.retries));
    } else {
      std::printf("  failures            %llu entries:", static_cast<unsigned long long>(failed));
      for (const auto& [kind, count] : t.failures)
        std::printf(" %s %llu;", kind.c_str(), static_cast<unsigned long long>(count));
      std::printf("\n");
    }
    if (s.agent_peak_rss)
      std::printf("  agent peak RSS      %.1f MiB for a %.1f MiB memory tier\n",
                  s.agent_peak_rss / 1048576.0, c.capacity_blocks * s.block / 1048576.0);
  }
  return rc;
}

}  // namespace dpukv::replay
