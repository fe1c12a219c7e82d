#include "tools/bench/cache.h"

#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "cache/cache_engine.h"
#include "cache/eviction_policies.h"
#include "runtime/log.h"
#include "tools/common/bench_common.h"

namespace dpukv {
namespace {

using bench::Json;

// The caller spins this long for completions before sleeping in epoll.
constexpr uint64_t kSpinNs = 5000;

struct Config {
  std::string sizes = "256K,4M,32M";
  std::string pool = "1G";
  uint32_t queue_depth = 64;
  uint32_t dma_threads = 2;
  std::string disk_dir = "/tmp/dpukv-bench-cache";
  std::string disk_bytes = "1G";
  std::string disk_sizes = "256K,1M,4M";  // what vLLM and LMCache store: 0.25-4 MiB chunks
  bool no_disk = false;
  uint32_t disk_rounds = 3;
  bench::OutputOptions out;
};

struct KeyHash {
  size_t operator()(const ChunkKey& k) const { return k.hash(); }
};

ChunkKey bkey(uint64_t id) {
  return key_from_block_id(KeyContext{7, 1, 0, 9}, id);
}

// Drives up to qd cache operations at once until `count` have completed.
struct Driver {
  ProgressEngine* pe;
  uint32_t inflight = 0, done = 0, failed = 0;
  static void cb(void* arg, Status st) {
    auto* d = static_cast<Driver*>(arg);
    --d->inflight;
    ++d->done;
    if (!st.ok()) ++d->failed;
  }

  // Stores (or retrieves) keys 0..n-1 from (into) chunk slots of [base, base+pool),
  // keeping up to qd in flight, until all n have completed.
  void run(CacheEngine* cache, BufInventory* inv, Mmap* map, uint8_t* base, uint64_t pool,
           uint64_t size, uint64_t n, uint32_t qd, bool store) {
    done = failed = 0;
    for (uint64_t next = 0; done < n;) {
      while (next < n && inflight < qd) {
        uint8_t* p = base + (next % (pool / size)) * size;
        Buf* b;
        Status st = store ? inv->get_by_data(map, p, size, &b) : inv->get_by_addr(map, p, size, &b);
        if (!st.ok()) break;
        ++inflight;
        st = store ? cache->store(bkey(next), b, &Driver::cb, this)
                   : cache->retrieve(bkey(next), b, &Driver::cb, this);
        (void)b->dec_refcount();  // the cache holds its own reference until the callback
        if (!st.ok()) {
          --inflight;
          break;
        }
        ++next;
      }
      pe->wait(kSpinNs, 100);
    }
  }
};

// Raw io_uring O_DIRECT on a file in the same directory: writes `count` chunks,
// then reads the first `read_count` back (written data, not unwritten extents,
// which the file system would answer with zeros and no I/O). Returns GB/s of
// each phase; 0 if anything failed.
std::pair<double, double> raw_uring(const std::string& path, uint64_t size, uint64_t count,
                                    uint64_t read_count, uint8_t* buf, uint64_t buf_len,
                                    uint32_t qd) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0640);
  if (fd < 0) return {0, 0};
  io_uring ring;
  if (posix_fallocate(fd, 0, static_cast<off_t>(size * count)) != 0 ||
      io_uring_queue_init(qd * 2, &ring, 0) != 0) {
    ::close(fd);
    ::unlink(path.c_str());
    return {0, 0};
  }
  auto phase = [&](bool write, uint64_t n) -> double {
    uint64_t submitted = 0, completed = 0;
    bool ok = true;
    const uint64_t t0 = bench::now_ns();
    while (completed < n) {
      while (submitted < n && submitted - completed < qd) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring);
        uint8_t* p = buf + (submitted * size) % (buf_len - size + 1) / 4096 * 4096;
        if (write)
          io_uring_prep_write(sqe, fd, p, static_cast<unsigned>(size), submitted * size);
        else
          io_uring_prep_read(sqe, fd, p, static_cast<unsigned>(size), submitted * size);
        ++submitted;
      }
      io_uring_submit(&ring);
      io_uring_cqe* cqe;
      if (io_uring_wait_cqe(&ring, &cqe) == 0) {
        ok &= cqe->res == static_cast<int>(size);
        io_uring_cqe_seen(&ring, cqe);
        ++completed;
      }
    }
    const double secs = (bench::now_ns() - t0) / 1e9;
    return ok ? n * size / secs / 1e9 : 0.0;
  };
  const double w = phase(true, count);
  const double r = phase(false, std::min(read_count, count));
  io_uring_queue_exit(&ring);
  ::close(fd);
  ::unlink(path.c_str());
  return {w, r};
}

int run(const Config& c) {
  std::vector<uint64_t> sizes, disk_sizes;
  uint64_t pool = 0, disk_bytes = 0;
  if (!bench::parse_size_list(c.sizes, &sizes).ok() || !bench::parse_size(c.pool, &pool).ok() ||
      !bench::parse_size(c.disk_bytes, &disk_bytes).ok() ||
      !bench::parse_size_list(c.disk_sizes, &disk_sizes).ok()) {
    std::cerr << "dpukv bench cache: bad --sizes, --pool-size, --disk-size or --disk-sizes\n";
    return 2;
  }
  if (c.no_disk) disk_sizes.clear();
  uint64_t max_size = 0;
  for (uint64_t s : sizes) max_size = std::max(max_size, s);
  for (uint64_t s : disk_sizes) {
    // The memory tier holds 32 chunks; the disk must take twice that to spill.
    if (s % 4096 != 0 || disk_bytes < 64 * s) {
      std::cerr << "dpukv bench cache: --disk-sizes " << bench::format_size(s)
                << ": a multiple of 4 KiB, at most 1/64 of --disk-size ("
                << bench::format_size(disk_bytes) << ")\n";
      return 2;
    }
    max_size = std::max(max_size, s);
  }
  if (pool < 4 * max_size) pool = 4 * max_size;
  log_set_level(LogSource::kLib, LogLevel::kError);
  std::vector<Json> rows;
  auto emit = [&](Json row) {
    row["bench"] = "cache";
    rows.push_back(row);
    if (c.out.json) return;
    const Json& r = rows.back();
    if (r.contains("gbps"))
      std::printf("%-10s %7s %9.2f GB/s   %-22s %9.2f GB/s   ratio %5.2f\n",
                  r["op"].get<std::string>().c_str(),
                  bench::format_size(r["size_bytes"].get<uint64_t>()).c_str(),
                  r["gbps"].get<double>(), r["baseline"].get<std::string>().c_str(),
                  r["baseline_gbps"].get<double>(), r["ratio"].get<double>());
    else if (r.contains("keys_per_s"))
      std::printf("%-10s %7s %9.0f keys/s %-22s %9.0f keys/s ratio %5.2f\n",
                  r["op"].get<std::string>().c_str(),
                  (std::to_string(r["keys"].get<uint32_t>()) + "x").c_str(),
                  r["keys_per_s"].get<double>(), r["baseline"].get<std::string>().c_str(),
                  r["baseline_keys_per_s"].get<double>(), r["ratio"].get<double>());
    else
      std::printf("%-10s %-7s %9lu bytes/chunk  %-22s %9lu bytes/chunk ratio %5.2f%s\n",
                  r["op"].get<std::string>().c_str(), r["policy"].get<std::string>().c_str(),
                  static_cast<unsigned long>(r["bytes_per_chunk"].get<uint64_t>()), "lru",
                  static_cast<unsigned long>(r["baseline_bytes_per_chunk"].get<uint64_t>()),
                  r["ratio"].get<double>(), r["default"].get<bool>() ? "  (default)" : "");
    std::fflush(stdout);
  };

  // Caller memory: a source pool and a destination pool, like a client's staging.
  std::unique_ptr<MemRegion> src_mem, dst_mem;
  std::unique_ptr<Mmap> src_map, dst_map;
  if (!MemRegion::create(pool, MemRegionOptions{}, &src_mem).ok() ||
      !MemRegion::create(pool, MemRegionOptions{}, &dst_mem).ok() ||
      !Mmap::create(src_mem->data(), pool, kAccessLocalReadWrite, src_mem->fd(), 0, &src_map)
           .ok() ||
      !Mmap::create(dst_mem->data(), pool, kAccessLocalReadWrite, dst_mem->fd(), 0, &dst_map)
           .ok() ||
      !src_map->start().ok() || !dst_map->start().ok()) {
    std::cerr << "dpukv bench cache: cannot allocate 2 x " << bench::format_size(pool) << "\n";
    return 1;
  }
  auto* src = static_cast<uint8_t*>(src_mem->data());
  auto* dstp = static_cast<uint8_t*>(dst_mem->data());
  for (uint64_t i = 0; i < pool; i += 4096) src[i] = static_cast<uint8_t>(i >> 12);
  std::unique_ptr<BufInventory> inv;
  (void)BufInventory::create(4 * c.queue_depth + 16, &inv);
  if (!c.out.json)
    std::printf(
        "dpukv bench cache: memory tier %s, %u ops in flight, %u DMA threads (from cpu 0), caller "
        "unpinned and sleeping between completions\n",
        bench::format_size(pool).c_str(), c.queue_depth, c.dma_threads);
  // The DMA threads are pinned one per CPU from CPU 0; this thread is not pinned and
  // sleeps in epoll between completions (ProgressEngine::wait), so the engine
  // threads get the cores. (Count CPUs before any pinning: a pinned thread's
  // children inherit its single-CPU mask.)
  const bool pin = bench::num_cpus() >= static_cast<int>(c.dma_threads);

  for (uint64_t size : sizes) {
    std::unique_ptr<ProgressEngine> pe;
    std::unique_ptr<CacheEngine> cache;
    CacheOptions o;
    o.memory_bytes = pool;
    o.max_chunk_bytes = std::max<uint64_t>(size, 1 << 20);
    o.max_chunks = static_cast<uint32_t>(std::max<uint64_t>(pool / size * 2, 1024));
    o.max_requests = c.queue_depth * 2;
    o.dma.first_cpu = pin ? 0 : -1;
    o.dma.num_threads = c.dma_threads;
    if (!ProgressEngine::create(&pe).ok() || !CacheEngine::create(pe.get(), o, &cache).ok() ||
        !cache->start().ok()) {
      std::cerr << "dpukv bench cache: engine setup failed\n";
      return 1;
    }
    const uint64_t n = pool / o.memory_bytes * (pool / size) * 3 / 4;  // fill 3/4 of the tier
    Driver d{pe.get()};
    auto run_ops = [&](bool store) {
      const uint64_t t0 = bench::now_ns();
      d.run(cache.get(), inv.get(), store ? src_map.get() : dst_map.get(), store ? src : dstp, pool,
            size, n, c.queue_depth, store);
      return n * size / ((bench::now_ns() - t0) / 1e9) / 1e9;
    };
    // One unmeasured pass first: the first stores into a fresh arena fault its
    // pages in, and whichever op ran first was measured at a fraction of its speed
    // (0.3-0.5x memcpy in some runs, 2x in others). Then the tier is emptied.
    (void)run_ops(true);
    if (d.failed != 0 || cache->clear() != n) {
      std::cerr << "dpukv bench cache: the warm-up pass did not store every chunk\n";
      return 1;
    }
    const double store_gbps = run_ops(true);
    const uint32_t store_failed = d.failed;
    const double retrieve_gbps = run_ops(false);
    const uint32_t retrieve_failed = d.failed;
    // Baseline: memcpy of the same bytes between the same kinds of memory.
    const uint64_t t0 = bench::now_ns();
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t slot = i % (pool / size);
      std::memcpy(dstp + slot * size, src + slot * size, size);
    }
    const double base = n * size / ((bench::now_ns() - t0) / 1e9) / 1e9;
    if (store_failed || retrieve_failed) {
      std::cerr << "dpukv bench cache: " << store_failed << " stores and " << retrieve_failed
                << " retrieves failed\n";
      return 1;
    }
    emit(bench::compared({{"op", "store"}, {"size_bytes", size}, {"gbps", store_gbps}}, "memcpy",
                         "gbps", store_gbps, base));
    emit(bench::compared({{"op", "retrieve"}, {"size_bytes", size}, {"gbps", retrieve_gbps}},
                         "memcpy", "gbps", retrieve_gbps, base));
    if (size == sizes.front()) {
      // Lookup of 64-chunk prefixes against an unordered_set of the same keys.
      std::vector<ChunkKey> keys;
      std::unordered_set<ChunkKey, KeyHash> set;
      // Only keys that were stored: a lookup stops at the first missing one.
      for (uint64_t i = 0; i < std::min<uint64_t>(64, n); ++i)
        keys.push_back(bkey(i)), set.insert(bkey(i));
      const uint64_t reps = 20000;
      uint64_t found = 0;
      uint64_t l0 = bench::now_ns();
      const auto nk = static_cast<uint32_t>(keys.size());
      for (uint64_t r = 0; r < reps; ++r) found += cache->lookup(keys.data(), nk, false);
      const double lk = reps * nk / ((bench::now_ns() - l0) / 1e9);
      uint64_t found2 = 0;
      l0 = bench::now_ns();
      for (uint64_t r = 0; r < reps; ++r)
        for (const ChunkKey& k : keys) found2 += set.count(k);
      const double lb = reps * nk / ((bench::now_ns() - l0) / 1e9);
      if (found != found2)
        std::cerr << "dpukv bench cache: lookup found " << found << " of " << found2 << "\n";
      emit(bench::compared(
          {{"op", "lookup"}, {"size_bytes", size}, {"keys", nk}, {"keys_per_s", lk}},
          "std::unordered_set", "keys_per_s", lk, lb));
      // The index's memory per chunk under each eviction policy, against LRU's
      // (the policy's links and ghost lists on top of the chunk table).
      auto index_bytes = [&](const char* policy, uint64_t* out) {
        CacheOptions po = o;
        po.policy = policy;
        std::unique_ptr<CacheEngine> pc;
        if (!CacheEngine::create(pe.get(), po, &pc).ok()) return false;
        *out = pc->index_bytes_per_chunk();
        return true;
      };
      uint64_t lru_bytes = 0;
      for (const EvictionPolicyInfo& p : eviction_policies()) {
        uint64_t b = 0;
        if (!index_bytes("lru", &lru_bytes) || !index_bytes(p.name, &b)) {
          std::cerr << "dpukv bench cache: no cache with eviction " << p.name << "\n";
          return 1;
        }
        emit({{"op", "index"},
              {"policy", p.name},
              {"default", &p == &eviction_policies().front()},
              {"size_bytes", size},
              {"bytes_per_chunk", b},
              {"baseline", "lru"},
              {"baseline_bytes_per_chunk", lru_bytes},
              {"ratio", static_cast<double>(b) / static_cast<double>(lru_bytes)}});
      }
    }
    (void)cache->stop();
    while (cache->state() != CtxState::kIdle) pe->progress();
  }

  // Spill and reload through the disk tier against raw io_uring O_DIRECT. The VM's
  // disk is noisy from one second to the next, so tier and raw runs alternate and
  // the medians (and the median of the per-round ratios) are reported.
  for (const uint64_t size : disk_sizes) {
    const uint32_t qd = std::min<uint32_t>(c.queue_depth, 8);
    struct Round {
      double spill = 0, reload = 0, raw_w = 0, raw_r = 0;
      uint64_t spills = 0, reloads = 0;
    };
    auto round = [&](Round* out) -> bool {
      std::filesystem::remove_all(c.disk_dir);
      std::unique_ptr<ProgressEngine> pe;
      std::unique_ptr<CacheEngine> cache;
      CacheOptions o;
      // A memory tier of 32 chunks and 8 stores in flight: stores beyond it spill.
      o.memory_bytes = 32 * size;
      o.max_chunk_bytes = size;
      o.disk_dir = c.disk_dir;
      o.disk_bytes = disk_bytes;
      o.max_requests = c.queue_depth * 2;
      o.dma.first_cpu = pin ? 0 : -1;
      o.dma.num_threads = c.dma_threads;
      if (!ProgressEngine::create(&pe).ok() || !CacheEngine::create(pe.get(), o, &cache).ok() ||
          !cache->start().ok()) {
        std::cerr << "dpukv bench cache: disk tier setup failed in " << c.disk_dir << "\n";
        return false;
      }
      const uint64_t n = disk_bytes / size * 3 / 4;
      Driver d{pe.get()};
      // Stores beyond the memory tier spill the least recent chunks (write back).
      const uint64_t t0 = bench::now_ns();
      d.run(cache.get(), inv.get(), src_map.get(), src, pool, size, n, qd, true);
      out->spills = cache->stats().spills;
      if (d.failed)
        std::cerr << "dpukv bench cache: " << d.failed << " stores failed in the spill phase\n";
      out->spill = out->spills * size / ((bench::now_ns() - t0) / 1e9) / 1e9;
      // Reload: retrieve the oldest chunks, which are on disk only.
      const uint64_t m = std::min<uint64_t>(out->spills, n) / 2;
      const uint64_t r0 = bench::now_ns();
      d.run(cache.get(), inv.get(), dst_map.get(), dstp, pool, size, m, qd, false);
      out->reload = m * size / ((bench::now_ns() - r0) / 1e9) / 1e9;
      out->reloads = cache->stats().reloads;
      (void)cache->stop();
      while (cache->state() != CtxState::kIdle) pe->progress();
      cache.reset();
      std::filesystem::remove_all(c.disk_dir);
      std::filesystem::create_directories(c.disk_dir);
      const auto [w, r] = raw_uring(c.disk_dir + "/raw", size, out->spills ? out->spills : 1,
                                    m ? m : 1, src, pool, qd);
      out->raw_w = w;
      out->raw_r = r;
      std::filesystem::remove_all(c.disk_dir);
      return true;
    };
    std::vector<Round> rounds(c.disk_rounds);
    for (Round& r : rounds)
      if (!round(&r)) return 1;
    auto median = [&](auto field) {
      std::vector<double> v;
      for (const Round& r : rounds) v.push_back(field(r));
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double raw_w = median([](const Round& r) { return r.raw_w; });
    const double raw_r = median([](const Round& r) { return r.raw_r; });
    // The ratio is the median of each round's ratio (the rounds alternate with
    // their baselines), not the ratio of the medians.
    emit(bench::with_baseline({{"op", "spill"},
                               {"size_bytes", size},
                               {"gbps", median([](const Round& r) { return r.spill; })},
                               {"chunks", rounds.back().spills},
                               {"rounds", rounds.size()}},
                              "io_uring O_DIRECT write", "gbps", raw_w, median([](const Round& r) {
                                return bench::ratio(r.spill, r.raw_w);
                              })));
    emit(bench::with_baseline({{"op", "reload"},
                               {"size_bytes", size},
                               {"gbps", median([](const Round& r) { return r.reload; })},
                               {"chunks", rounds.back().reloads},
                               {"rounds", rounds.size()}},
                              "io_uring O_DIRECT read", "gbps", raw_r, median([](const Round& r) {
                                return bench::ratio(r.reload, r.raw_r);
                              })));
  }
  (void)src_map->stop();
  (void)dst_map->stop();
  if (c.out.json)
    bench::print_json("cache", rows);
  else
    bench::print_machine_line();
  return bench::write_csv(c.out, rows) ? 0 : 1;
}

}  // namespace

void add_bench_cache_command(CLI::App* bench, int* exit_code) {
  auto c = std::make_shared<Config>();
  CLI::App* cmd = bench->add_subcommand(
      "cache", "Benchmark the cache engine: store, retrieve, lookup, spill, reload");
  cmd->add_option("--sizes", c->sizes, "Chunk sizes")->capture_default_str();
  cmd->add_option("--pool-size", c->pool, "Memory tier and caller pools")->capture_default_str();
  cmd->add_option("--queue-depth", c->queue_depth, "Operations in flight")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1024u));
  cmd->add_option("--dma-threads", c->dma_threads, "DMA engine threads")
      ->capture_default_str()
      ->check(CLI::Range(1u, 16u));
  cmd->add_option("--disk-dir", c->disk_dir, "Directory for the disk tier measurement")
      ->capture_default_str();
  cmd->add_option("--disk-size", c->disk_bytes, "Disk tier size")->capture_default_str();
  cmd->add_option("--disk-sizes", c->disk_sizes,
                  "Chunk sizes for the spill/reload measurement (each 1/64 of --disk-size at most)")
      ->capture_default_str();
  cmd->add_flag("--no-disk", c->no_disk, "Skip the spill/reload measurement");
  cmd->add_option("--disk-rounds", c->disk_rounds,
                  "Spill/reload rounds, each followed by its raw io_uring run (medians reported)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 99u));
  bench::add_output_options(cmd, &c->out);
  cmd->callback([c, exit_code] { *exit_code = run(*c); });
}

}  // namespace dpukv
