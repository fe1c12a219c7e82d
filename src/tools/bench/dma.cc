#include "tools/bench/dma.h"

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "engines/dma/dma_engine.h"
#include "runtime/fd_passing.h"
#include "runtime/log.h"
#include "runtime/mem_region.h"
#include "runtime/mmap.h"
#include "tools/common/bench_common.h"

namespace dpukv {
namespace {

using bench::Json;

struct Config {
  std::string sizes = "64,4K,256K,1M,4M,16M";
  uint32_t queue_depth = 64;
  uint32_t threads = 1;
  double duration_s = 1.0;
  uint64_t iterations = 0;  // > 0 overrides duration
  double warmup_s = 0.2;
  std::string mode = "local";  // local | cross-process | both
  bool warm = false;
  std::string pool = "1G";
  std::string bucket_range;
  int buckets = 20;
  std::string kernel = "auto";
  std::string nt_threshold = "256K";
  bool compare_kernels = false;
  bool no_pin = false;
  bench::OutputOptions out;
};

// One side of a copy: a started map and the pool of bytes inside it to rotate over.
struct Region {
  Mmap* map;
  uint8_t* base;
  uint64_t len;
};

// Offsets rotate through the pool with a page-aligned stride, so that by default
// every task touches memory that left the caches long ago.
struct Rotation {
  uint64_t stride, slots, next = 0;
  Rotation(uint64_t size, uint64_t pool) {
    stride = (size + 4095) & ~4095ull;
    slots = pool / stride;
    if (slots == 0) slots = 1;
  }
  uint64_t take() {
    uint64_t off = next * stride;
    next = next + 1 == slots ? 0 : next + 1;
    return off;
  }
};

struct Result {
  double gbps = 0;
  double ops_per_s = 0;
  uint64_t ops = 0;
  uint64_t errors = 0;
  bench::LatencyRecorder lat{1u << 20};
};

void baseline_memcpy(const Region& src, const Region& dst, uint64_t size, double seconds,
                     uint64_t iterations, CopyFn fn, Result* r) {
  Rotation rot(size, std::min(src.len, dst.len));
  // Warm-up: fault in nothing new (pools are pre-faulted), just settle clocks.
  for (int i = 0; i < 4; ++i) {
    uint64_t off = rot.take();
    fn(dst.base + off, src.base + off, size);
  }
  const uint64_t t0 = bench::now_ns();
  const uint64_t deadline = t0 + static_cast<uint64_t>(seconds * 1e9);
  uint64_t ops = 0, t1 = t0;
  for (;;) {
    // Check the clock every few copies so that small copies are not timer-bound.
    for (int i = 0; i < 16; ++i) {
      uint64_t off = rot.take();
      fn(dst.base + off, src.base + off, size);
    }
    ops += 16;
    t1 = bench::now_ns();
    if (iterations ? ops >= iterations : t1 >= deadline) break;
  }
  double secs = static_cast<double>(t1 - t0) / 1e9;
  r->ops = ops;
  r->ops_per_s = static_cast<double>(ops) / secs;
  r->gbps = static_cast<double>(ops) * static_cast<double>(size) / secs / 1e9;
}

// Drives the engine with queue_depth tasks in flight for the given time.
struct EngineRun {
  DmaEngine* eng;
  ProgressEngine* pe;
  BufInventory* inv;
  std::vector<uint64_t> submit_ns;  // per task slot
  DmaMemcpyTask* slot_base = nullptr;
  Result* res = nullptr;
  uint32_t inflight = 0;
  uint64_t done = 0;
  bool record = false;

  static void on_done(DmaMemcpyTask* t, UserData ud, UserData ctx_ud) {
    auto* self = static_cast<EngineRun*>(ctx_ud.ptr);
    self->finish(t, ud, true);
  }
  static void on_error(DmaMemcpyTask* t, UserData ud, UserData ctx_ud) {
    auto* self = static_cast<EngineRun*>(ctx_ud.ptr);
    self->finish(t, ud, false);
  }
  void finish(DmaMemcpyTask* t, UserData ud, bool ok) {
    if (record) {
      res->lat.add(bench::now_ns() - submit_ns[ud.u64]);
      if (!ok) ++res->errors;
    }
    (void)t->src()->dec_refcount();
    (void)t->dst()->dec_refcount();
    (void)eng->free(t);
    --inflight;
    ++done;
  }
};

Status run_engine(EngineRun* er, const Region& src, const Region& dst, uint64_t size, uint32_t qd,
                  double seconds, uint64_t iterations, bool record, Result* r) {
  Rotation rot(size, std::min(src.len, dst.len));
  er->res = r;
  er->record = record;
  er->done = 0;
  uint64_t submitted = 0;
  uint64_t next_slot = 0;
  const uint64_t t0 = bench::now_ns();
  const uint64_t deadline = t0 + static_cast<uint64_t>(seconds * 1e9);
  bool submitting = true;
  while (submitting || er->inflight != 0) {
    while (submitting && er->inflight < qd) {
      uint64_t off = rot.take();
      Buf *s = nullptr, *d = nullptr;
      DPUKV_RETURN_IF_ERROR(er->inv->get_by_data(src.map, src.base + off, size, &s));
      DPUKV_RETURN_IF_ERROR(er->inv->get_by_addr(dst.map, dst.base + off, size, &d));
      DmaMemcpyTask* t = nullptr;
      UserData ud;
      ud.u64 = next_slot;
      Status st = er->eng->memcpy_alloc_init(s, d, ud, &t);
      if (!st.ok()) {
        (void)s->dec_refcount(), (void)d->dec_refcount();
        break;
      }
      er->submit_ns[next_slot] = record ? bench::now_ns() : 0;
      st = er->eng->submit(t);
      if (st == Code::kAgain) {
        (void)s->dec_refcount(), (void)d->dec_refcount(), (void)er->eng->free(t);
        break;
      }
      if (!st.ok()) return st;
      next_slot = next_slot + 1 == er->submit_ns.size() ? 0 : next_slot + 1;
      ++er->inflight;
      ++submitted;
      if (iterations && submitted >= iterations) submitting = false;
    }
    er->pe->progress();
    if (!iterations && submitting && bench::now_ns() >= deadline) submitting = false;
  }
  const double secs = static_cast<double>(bench::now_ns() - t0) / 1e9;
  r->ops = er->done;
  r->ops_per_s = static_cast<double>(er->done) / secs;
  r->gbps = static_cast<double>(er->done) * static_cast<double>(size) / secs / 1e9;
  return Code::kSuccess;
}

// The child process of cross-process mode: allocates and exports its memory, then
// waits for the parent to hang up.
int run_peer(int sock, uint64_t pool) {
  std::unique_ptr<MemRegion> region;
  std::unique_ptr<Mmap> map;
  Status st = MemRegion::create(pool, MemRegionOptions{}, &region);
  if (st.ok())
    st = Mmap::create(region->data(), region->size(),
                      kAccessLocalReadWrite | kAccessExportReadWrite, region->fd(), 0, &map);
  if (st.ok()) st = map->start();
  ExportDescriptor desc{};
  int fd = -1;
  if (st.ok()) st = map->export_to(&desc, &fd);
  if (st.ok()) st = send_with_fd(sock, &desc, sizeof(desc), fd);
  if (!st.ok()) {
    std::fprintf(stderr, "dpukv dma-peer: %s\n", std::string(st.name()).c_str());
    return 1;
  }
  char c;
  while (read(sock, &c, 1) > 0) {
  }
  (void)map->stop();
  return 0;
}

struct Peer {
  pid_t pid = -1;
  int sock = -1;
  std::unique_ptr<Mmap> map;
  ~Peer() {
    if (sock >= 0) close(sock);
    map.reset();
    if (pid > 0) {
      int status;
      waitpid(pid, &status, 0);
    }
  }
};

Status spawn_peer(uint64_t pool, Peer* p) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return Code::kDriver;
  p->pid = bench::spawn_self(
      {"bench", "dma-peer", "--fd", "3", "--pool-bytes", std::to_string(pool)}, sv[1]);
  close(sv[1]);
  p->sock = sv[0];
  if (p->pid < 0) return Code::kDriver;
  ExportDescriptor desc{};
  size_t len = 0;
  int fd = -1;
  DPUKV_RETURN_IF_ERROR(recv_with_fd(p->sock, &desc, sizeof(desc), &len, &fd));
  Status st = Mmap::import(&desc, len, fd, &p->map);
  close(fd);
  if (st.ok()) st = p->map->start();
  return st;
}

Json make_row(const std::string& mode, const std::string& direction, uint64_t size, const Config& c,
              const std::string& kernel, Result& eng, const Result& base,
              const bench::HistogramSpec& hist, const std::string& placement) {
  eng.lat.finish();
  Json row;
  row["bench"] = "dma";
  row["mode"] = mode;
  row["direction"] = direction;
  row["size_bytes"] = size;
  row["queue_depth"] = c.queue_depth;
  row["engine_threads"] = c.threads;
  row["kernel"] = kernel;
  row["cold"] = !c.warm;
  row["placement"] = placement;
  row["engine_gbps"] = eng.gbps;
  row = bench::compared(std::move(row), "memcpy", "gbps", eng.gbps, base.gbps);
  row["tasks_per_s"] = eng.ops_per_s;
  row["baseline_ops_per_s"] = base.ops_per_s;
  row["tasks"] = eng.ops;
  row["errors"] = eng.errors;
  row["p50_us"] = eng.lat.percentile_us(50);
  row["p90_us"] = eng.lat.percentile_us(90);
  row["p99_us"] = eng.lat.percentile_us(99);
  row["p999_us"] = eng.lat.percentile_us(99.9);
  row["max_us"] = eng.lat.max_us();
  if (hist.enabled) {
    row["histogram"] = {{"start_us", hist.start_us},
                        {"width_us", hist.width_us},
                        {"counts", eng.lat.histogram(hist.start_us, hist.width_us, hist.buckets)}};
  }
  return row;
}

void print_human_header(const Config& c, const std::string& placement, uint64_t pool) {
  std::printf(
      "dpukv bench dma: %u engine thread(s), queue depth %u, %s memory (pool %s per side), %s\n",
      c.threads, c.queue_depth, c.warm ? "warm" : "cold", bench::format_size(pool).c_str(),
      placement.c_str());
  std::printf("%-14s %-10s %7s %11s %11s %6s %12s %8s %8s %8s %8s\n", "mode", "direction", "size",
              "engine GB/s", "memcpy GB/s", "ratio", "tasks/s", "p50 us", "p99 us", "p99.9 us",
              "max us");
}

void print_human_row(const Json& r, const bench::HistogramSpec& hist) {
  std::printf("%-14s %-10s %7s %11.2f %11.2f %6.2f %12.0f %8.2f %8.2f %8.2f %8.1f\n",
              r["mode"].get<std::string>().c_str(), r["direction"].get<std::string>().c_str(),
              bench::format_size(r["size_bytes"].get<uint64_t>()).c_str(),
              r["engine_gbps"].get<double>(), r["baseline_gbps"].get<double>(),
              r["ratio"].get<double>(), r["tasks_per_s"].get<double>(), r["p50_us"].get<double>(),
              r["p99_us"].get<double>(), r["p999_us"].get<double>(), r["max_us"].get<double>());
  if (hist.enabled && r.contains("histogram")) {
    const auto& counts = r["histogram"]["counts"];
    for (size_t i = 0; i < counts.size(); ++i) {
      double lo = hist.start_us + hist.width_us * static_cast<double>(i);
      if (i == 0)
        std::printf("    [   <%9.2f us ) %llu\n", lo + hist.width_us,
                    static_cast<unsigned long long>(counts[i].get<uint64_t>()));
      else if (i + 1 == counts.size())
        std::printf("    [>=%9.2f us ) %llu\n", lo,
                    static_cast<unsigned long long>(counts[i].get<uint64_t>()));
      else
        std::printf("    [%9.2f, %9.2f) %llu\n", lo, lo + hist.width_us,
                    static_cast<unsigned long long>(counts[i].get<uint64_t>()));
    }
  }
  std::fflush(stdout);
}

int run(const Config& c) {
  std::vector<uint64_t> sizes;
  uint64_t pool = 0, nt_threshold = 0;
  bench::HistogramSpec hist;
  CopyKernel kernel;
  if (!bench::parse_size_list(c.sizes, &sizes).ok()) {
    std::cerr << "dpukv bench dma: bad --sizes '" << c.sizes << "' (example: 64,256K,1M,16M)\n";
    return 2;
  }
  if (!bench::parse_size(c.pool, &pool).ok() || pool == 0 ||
      !bench::parse_size(c.nt_threshold, &nt_threshold).ok()) {
    std::cerr << "dpukv bench dma: bad --pool-size or --nt-threshold\n";
    return 2;
  }
  if (!c.bucket_range.empty() && !bench::parse_bucket_range(c.bucket_range, &hist).ok()) {
    std::cerr << "dpukv bench dma: bad --latency-bucket-range '" << c.bucket_range
              << "' (START,WIDTH in microseconds)\n";
    return 2;
  }
  hist.buckets = c.buckets;
  if (!copy_kernel_from_name(c.kernel, &kernel)) {
    std::cerr << "dpukv bench dma: unknown --kernel '" << c.kernel << "'\n";
    return 2;
  }
  if (!copy_kernel_supported(kernel)) {
    std::cerr << "dpukv bench dma: kernel '" << c.kernel << "' is not supported on this CPU\n";
    return 2;
  }
  uint64_t max_size = 0;
  for (uint64_t s : sizes) max_size = std::max(max_size, s);
  // Warm: a pool small enough to stay in this machine's caches (~64 MiB here).
  if (c.warm) pool = std::max<uint64_t>(2 * ((max_size + 4095) & ~4095ull), 8ull << 20);
  if (pool < max_size) pool = max_size;
  const bool local = c.mode == "local" || c.mode == "both";
  const bool cross = c.mode == "cross-process" || c.mode == "both";
  if (!local && !cross) {
    std::cerr << "dpukv bench dma: --mode must be local, cross-process or both\n";
    return 2;
  }

  // Cross-process: spawn the peer before any thread exists.
  Peer peer;
  if (cross) {
    Status st = spawn_peer(pool, &peer);
    if (!st.ok()) {
      std::cerr << "dpukv bench dma: cross-process peer failed: " << st.name() << "\n";
      return 1;
    }
  }

  const int ncpu = bench::num_cpus();
  const bool pin = !c.no_pin && ncpu >= 2;
  std::string placement =
      pin ? "submitter pinned to cpu 0, engine thread(s) from cpu 1" : "threads not pinned";
  if (pin) bench::pin_current_thread(0);

  std::unique_ptr<MemRegion> src_mem, dst_mem;
  MemRegionOptions mo;
  mo.name = "dpukv-bench-dma";
  if (!MemRegion::create(pool, mo, &src_mem).ok() || !MemRegion::create(pool, mo, &dst_mem).ok()) {
    std::cerr << "dpukv bench dma: cannot allocate 2 x " << bench::format_size(pool) << "\n";
    return 1;
  }
  // Pages hold a pattern so that copies move real data, not the zero page.
  for (uint64_t i = 0; i < src_mem->size(); i += 4096)
    static_cast<uint8_t*>(src_mem->data())[i] = static_cast<uint8_t>(i >> 12);
  std::unique_ptr<Mmap> src_map, dst_map;
  const uint32_t acc = kAccessLocalReadWrite;
  if (!Mmap::create(src_mem->data(), src_mem->size(), acc, src_mem->fd(), 0, &src_map).ok() ||
      !Mmap::create(dst_mem->data(), dst_mem->size(), acc, dst_mem->fd(), 0, &dst_map).ok() ||
      !src_map->start().ok() || !dst_map->start().ok()) {
    std::cerr << "dpukv bench dma: map setup failed\n";
    return 1;
  }

  std::unique_ptr<ProgressEngine> pe;
  std::unique_ptr<DmaEngine> eng;
  std::unique_ptr<BufInventory> inv;
  DmaOptions opts;
  opts.num_threads = c.threads;
  opts.queue_depth = std::max<uint32_t>(c.queue_depth, 1);
  opts.max_buf_size = std::max<uint64_t>(max_size, opts.max_buf_size);
  opts.copy.kernel = kernel;
  opts.copy.nt_threshold = nt_threshold;
  opts.first_cpu = pin ? 1 : -1;
  EngineRun er{};
  if (!ProgressEngine::create(&pe).ok() || !DmaEngine::create(pe.get(), opts, &eng).ok() ||
      !BufInventory::create(2 * c.queue_depth + 8, &inv).ok()) {
    std::cerr << "dpukv bench dma: engine setup failed (check --threads, --queue-depth)\n";
    return 2;
  }
  er.eng = eng.get();
  er.pe = pe.get();
  er.inv = inv.get();
  er.submit_ns.assign(4 * c.queue_depth + 64, 0);
  UserData ctx_ud;
  ctx_ud.ptr = &er;
  if (!eng->set_user_data(ctx_ud).ok() ||
      !eng->set_memcpy_conf(&EngineRun::on_done, &EngineRun::on_error, c.queue_depth).ok() ||
      !eng->start().ok()) {
    std::cerr << "dpukv bench dma: engine start failed\n";
    return 1;
  }

  struct Case {
    std::string mode, direction;
    Region src, dst;
  };
  std::vector<Case> cases;
  Region ls{src_map.get(), src_mem->data() ? static_cast<uint8_t*>(src_mem->data()) : nullptr,
            pool};
  Region ld{dst_map.get(), static_cast<uint8_t*>(dst_mem->data()), pool};
  if (local) cases.push_back({"local", "local", ls, ld});
  if (cross) {
    Region pr{peer.map.get(), peer.map->addr(), std::min<uint64_t>(pool, peer.map->length())};
    cases.push_back({"cross-process", "to-peer", ls, pr});
    cases.push_back({"cross-process", "from-peer", pr, ld});
  }

  std::vector<Json> rows;
  if (!c.out.json) print_human_header(c, placement, pool);
  int rc = 0;
  for (const Case& cs : cases) {
    for (uint64_t size : sizes) {
      if (bench::progress_enabled())
        std::fprintf(stderr, "\r  measuring %s %s %s ...   ", cs.mode.c_str(), cs.direction.c_str(),
                     bench::format_size(size).c_str());
      Result base, warm, res;
      baseline_memcpy(cs.src, cs.dst, size, c.duration_s, c.iterations,
                      copy_kernel_fn(CopyKernel::kLibc), &base);
      Status st = run_engine(&er, cs.src, cs.dst, size, c.queue_depth, c.warmup_s, 0, false, &warm);
      if (st.ok())
        st = run_engine(&er, cs.src, cs.dst, size, c.queue_depth, c.duration_s, c.iterations, true,
                        &res);
      if (!st.ok()) {
        std::cerr << "\ndpukv bench dma: " << st.name() << ": " << st.description() << "\n";
        rc = 1;
        break;
      }
      if (res.errors != 0) rc = 1;  // a benchmark that saw failed copies is not a result
      if (bench::progress_enabled()) std::fprintf(stderr, "\r%60s\r", "");
      rows.push_back(make_row(cs.mode, cs.direction, size, c, std::string(copy_kernel_name(kernel)),
                              res, base, hist, placement));
      if (!c.out.json) print_human_row(rows.back(), hist);
    }
  }

  if (c.compare_kernels && rc == 0) {
    // Each copy routine alone on the submitter thread, to justify the engine's choice.
    if (!c.out.json)
      std::printf("\ncopy routines, one thread, same memory (ratio against libc memcpy):\n");
    for (uint64_t size : sizes) {
      Result base;
      baseline_memcpy(ls, ld, size, c.duration_s, c.iterations, copy_kernel_fn(CopyKernel::kLibc),
                      &base);
      for (CopyKernel k : {CopyKernel::kRepMovsb, CopyKernel::kNtAvx2, CopyKernel::kNtAvx512}) {
        if (!copy_kernel_supported(k)) continue;
        Result r;
        baseline_memcpy(ls, ld, size, c.duration_s, c.iterations, copy_kernel_fn(k), &r);
        Json row;
        row["bench"] = "dma";
        row["mode"] = "copy-routine";
        row["direction"] = "local";
        row["size_bytes"] = size;
        row["kernel"] = std::string(copy_kernel_name(k));
        row["cold"] = !c.warm;
        row["engine_gbps"] = r.gbps;
        rows.push_back(bench::compared(std::move(row), "memcpy", "gbps", r.gbps, base.gbps));
        if (!c.out.json)
          std::printf("  %-10s %7s %8.2f GB/s  memcpy %8.2f GB/s  ratio %.2f\n",
                      std::string(copy_kernel_name(k)).c_str(), bench::format_size(size).c_str(),
                      r.gbps, base.gbps, base.gbps > 0 ? r.gbps / base.gbps : 0.0);
      }
    }
  }

  Status st = eng->stop();
  while (st == Code::kInProgress && eng->state() != CtxState::kIdle) pe->progress(), st = Status();
  eng.reset();
  (void)src_map->stop();
  (void)dst_map->stop();
  if (peer.map) (void)peer.map->stop();

  if (c.out.json)
    bench::print_json("dma", rows);
  else
    bench::print_machine_line();
  if (!bench::write_csv(c.out, rows)) rc = 1;
  return rc;
}

}  // namespace

void add_bench_dma_command(CLI::App* bench, int* exit_code) {
  auto c = std::make_shared<Config>();
  CLI::App* cmd = bench->add_subcommand(
      "dma", "Benchmark the DMA engine: throughput, tasks/s and latency against memcpy");
  cmd->add_option("--sizes", c->sizes, "Copy sizes, comma-separated, K/M/G suffixes")
      ->capture_default_str();
  cmd->add_option("--queue-depth", c->queue_depth, "Tasks in flight")
      ->capture_default_str()
      ->check(CLI::Range(1u, 65536u));
  cmd->add_option("--threads", c->threads, "Engine threads (software DMA queues)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  cmd->add_option("--duration", c->duration_s, "Seconds per size and mode")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--iterations", c->iterations, "Tasks per size (overrides --duration)");
  cmd->add_option("--warmup", c->warmup_s, "Warm-up seconds before each measurement")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--mode", c->mode,
                  "local, cross-process (a child process exports its memory) or both")
      ->capture_default_str()
      ->check(CLI::IsMember({"local", "cross-process", "both"}));
  cmd->add_flag("--warm", c->warm, "Use a small pool that stays in cache (default: cold memory)");
  cmd->add_option("--pool-size", c->pool, "Bytes per side to rotate over for cold memory")
      ->capture_default_str();
  cmd->add_option("--latency-bucket-range", c->bucket_range,
                  "Latency histogram START,WIDTH in microseconds");
  cmd->add_option("--latency-buckets", c->buckets, "Number of histogram buckets")
      ->capture_default_str()
      ->check(CLI::Range(2, 1000));
  cmd->add_option("--kernel", c->kernel, "Copy routine: auto, libc, rep-movsb, nt-avx512, nt-avx2")
      ->capture_default_str();
  cmd->add_option("--nt-threshold", c->nt_threshold,
                  "With --kernel auto: copies from this size use non-temporal stores")
      ->capture_default_str();
  cmd->add_flag("--compare-kernels", c->compare_kernels,
                "Also measure each copy routine alone against libc memcpy");
  cmd->add_flag("--no-pin", c->no_pin, "Do not pin the submitter and engine threads");
  bench::add_output_options(cmd, &c->out);
  cmd->callback([c, exit_code] { *exit_code = run(*c); });

  auto peer_fd = std::make_shared<int>(-1);
  auto peer_pool = std::make_shared<uint64_t>(0);
  CLI::App* peer =
      bench->add_subcommand("dma-peer", "");  // internal: child of --mode cross-process
  peer->group("");
  peer->add_option("--fd", *peer_fd)->required();
  peer->add_option("--pool-bytes", *peer_pool)->required();
  peer->callback([peer_fd, peer_pool, exit_code] { *exit_code = run_peer(*peer_fd, *peer_pool); });
}

}  // namespace dpukv
