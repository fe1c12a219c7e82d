#include "tools/nvme/perf.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "nvme/initiator.h"
#include "nvme/tcp_host.h"
#include "nvme/vfio_user_driver.h"
#include "nvmf/bdev/bdev_malloc.h"
#include "runtime/child_process.h"
#include "runtime/host_port.h"
#include "runtime/log.h"
#include "tools/common/bench_common.h"
#include "tools/nvme/tcp_pingpong.h"

namespace dpukv {
namespace {

using bench::Json;
using namespace nvme;

struct PerfConfig {
  std::string socket;   // vfio-user target
  std::string address;  // tcp target ADDR:PORT
  std::string nqn = "nqn.2026-11.io.dpukv:cnode1";
  std::string transport = "vfio-user";
  std::string workloads = "randread";
  std::string qds = "1,32";
  std::string block_size = "4K";
  double seconds = 3;
  double warmup = 0.5;
  std::string target_size = "1G";
  int cpu = -1, target_cpu = 1;  // cpu -1: 0 with a started target, unpinned otherwise
  bool interrupts = false;
  bool digests = false;
  bench::OutputOptions out;
};

struct PerfResult {
  double iops = 0, mbps = 0, p50 = 0, p99 = 0, p999 = 0;
  uint64_t errors = 0;
};

uint64_t next_rand(uint64_t* s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

bool workload_known(const std::string& w) {
  return w == "randread" || w == "randwrite" || w == "read" || w == "write";
}
bool is_random(const std::string& w) {
  return w.rfind("rand", 0) == 0;
}
bool is_write(const std::string& w) {
  return w.find("write") != std::string::npos;
}

Status run_one(Initiator& ini, const std::string& workload, uint32_t qd, uint32_t bs,
               const PerfConfig& c, PerfResult* res) {
  uint32_t lba_size = ini.block_size();
  if (ini.nsid() == 0 || lba_size == 0 || bs % lba_size != 0) return Code::kInvalidValue;
  uint32_t nlb = bs / lba_size;
  uint64_t span = ini.num_blocks() / nlb;  // block-sized slots
  if (span == 0 || qd == 0 || qd > ini.max_qd()) return Code::kInvalidValue;
  if (Status st = ini.prepare(qd, bs); !st.ok()) return st;
  bool rnd = is_random(workload), write = is_write(workload);
  uint64_t seed = 0x9e3779b97f4a7c15ull, seq = 0;
  std::vector<uint64_t> started(qd);
  bench::LatencyRecorder lat;
  auto issue = [&](uint16_t slot) {
    uint64_t lba = (rnd ? next_rand(&seed) % span : seq++ % span) * nlb;
    started[slot] = bench::now_ns();
    return ini.submit(slot, write, lba, nlb, bs);
  };
  uint64_t t0 = bench::now_ns();
  uint64_t measure_from = t0 + static_cast<uint64_t>(c.warmup * 1e9);
  uint64_t end = measure_from + static_cast<uint64_t>(c.seconds * 1e9);
  for (uint16_t i = 0; i < qd; ++i)
    if (Status st = issue(i); !st.ok()) return st;
  uint32_t outstanding = qd;
  uint64_t done = 0, errors = 0, last_progress = bench::now_ns();
  // The window closes at `end` once it holds enough completions to be a figure: a
  // machine busy elsewhere can take the CPU for the whole nominal window (a run
  // once measured 0 IOPS with 63,478 commands served), and then the window waits.
  const uint64_t min_done = std::max<uint64_t>(64, 4ull * qd);
  uint64_t stop = 0;  // when the measurement closed (0: still open)
  Cqe cqes[64];
  while (outstanding > 0) {
    int n = ini.reap(cqes, 64);
    if (n < 0) return Code::kConnectionReset;
    uint64_t now = bench::now_ns();
    if (n == 0) {
      if (now - last_progress > 30'000'000'000ull) return Code::kTimeout;  // a stuck target
      ini.idle_wait();
      continue;
    }
    last_progress = now;
    for (int i = 0; i < n; ++i) {
      uint16_t cid = cqes[i].cid;
      if (cid >= qd) return Code::kCorrupted;
      if (status_of_cqe(cqes[i].status) != kSuccess) ++errors;
      if (stop == 0 && started[cid] >= measure_from) {
        lat.add(now - started[cid]);
        ++done;
      }
      if (stop == 0 && now >= end && done >= min_done) stop = now;
      if (stop == 0 && now > end + 120'000'000'000ull) return Code::kTimeout;  // nothing measured
      if (stop == 0) {
        if (Status st = issue(cid); !st.ok()) return st;
      } else {
        --outstanding;
      }
    }
  }
  lat.finish();
  if (done == 0 || stop <= measure_from) return Code::kTimeout;
  res->iops = static_cast<double>(done) / (static_cast<double>(stop - measure_from) / 1e9);
  res->mbps = res->iops * bs / 1e6;
  res->p50 = lat.percentile_us(50);
  res->p99 = lat.percentile_us(99);
  res->p999 = lat.percentile_us(99.9);
  res->errors = errors;
  return Code::kSuccess;
}

// vfio-user baseline: the same I/O done directly on an in-process malloc block
// device, one memcpy per I/O: what the emulation costs on top of the medium.
double bdev_baseline_iops(Bdev& b, const std::string& workload, uint32_t bs, double seconds) {
  std::vector<uint8_t> buf(bs, 0x5a);
  iovec iov{buf.data(), bs};
  uint64_t nlb = bs / b.block_size(), span = b.num_blocks() / nlb, seed = 0x9e3779b97f4a7c15ull,
           seq = 0;
  BdevIo io;
  io.op = is_write(workload) ? BdevOp::kWrite : BdevOp::kRead;
  io.nblocks = nlb;
  io.iov = &iov;
  io.iovcnt = 1;
  io.done = [](BdevIo*, Status) {};
  bool rnd = is_random(workload);
  uint64_t n = 0, t0 = bench::now_ns(), end = t0 + static_cast<uint64_t>(seconds * 1e9), now = t0;
  while (now < end) {
    for (int i = 0; i < 256; ++i) {
      io.lba = (rnd ? next_rand(&seed) % span : seq++ % span) * nlb;
      b.submit(&io);
    }
    n += 256;
    now = bench::now_ns();
  }
  return static_cast<double>(n) / (static_cast<double>(now - t0) / 1e9);
}

// ---- the command ---------------------------------------------------------------

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  for (size_t p = 0; p <= s.size();) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    v.push_back(s.substr(p, q - p));
    p = q + 1;
  }
  return v;
}

pid_t spawn_and_wait_port(std::vector<std::string> args, const std::string& port_file, int* port) {
  std::filesystem::remove(port_file);
  pid_t p = bench::spawn_self(args, -1);
  for (int i = 0; p > 0 && i < 1000 && !std::filesystem::exists(port_file); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::ifstream f(port_file);
  f >> *port;
  std::filesystem::remove(port_file);
  return p;
}

void stop(pid_t* p) {
  if (*p > 0) {
    signal_child(*p, SIGTERM);
    reap_child(*p, nullptr);
    *p = -1;
  }
}

// What every transport's run shares: the pid that names its temporary files, the
// CPU arguments of a target it starts, whether to pin the initiator, the deepest
// queue and the I/O size of the run.
struct PerfPlan {
  std::string pid;
  std::vector<std::string> cpu_args;
  bool pin = false;
  uint64_t max_qd = 1, bs = 0, target_size = 0;
};

// One initiator transport of `nvme perf`: it reaches the target named on the
// command line (or starts one in a child process), owns what it started, and
// measures the same-run baseline each point is compared with.
class PerfTransport {
 public:
  virtual ~PerfTransport() {
    ini_.reset();
    stop(&target_);
  }
  // 0, or the exit code after saying why on stderr.
  virtual int open(const PerfConfig& c, const PerfPlan& p) = 0;
  // Adds the baseline fields (baseline, baseline_iops, ratio, ...) of one point.
  virtual void baseline(const PerfConfig& c, const std::string& w, uint32_t qd, uint32_t bs,
                        double iops, Json* row) = 0;
  Initiator& initiator() { return *ini_; }

 protected:
  std::unique_ptr<Initiator> ini_;
  pid_t target_ = -1;
};

// vfio-user: an emulated PCIe function; baseline, the same I/O on an in-process
// malloc bdev (what the emulation costs on top of the medium).
class VfioUserPerf final : public PerfTransport {
 public:
  int open(const PerfConfig& c, const PerfPlan& p) override {
    std::string socket = c.socket;
    if (socket.empty()) {
      socket = "/tmp/dpukv-nvme-perf-" + p.pid + ".sock";
      std::vector<std::string> a = {"nvme",   "target", "--socket", socket,
                                    "--bdev", "malloc", "--size",   c.target_size};
      a.insert(a.end(), p.cpu_args.begin(), p.cpu_args.end());
      target_ = bench::spawn_self(a, -1);
    }
    if (p.pin) bench::pin_current_thread(c.cpu);
    DriverOptions o;
    o.interrupts = c.interrupts;
    o.queue_entries = static_cast<uint32_t>(std::max<uint64_t>(64, p.max_qd + 1));
    o.memory_bytes =
        std::max<size_t>(64u << 20, static_cast<size_t>(p.max_qd * p.bs * 2 + (32u << 20)));
    std::unique_ptr<VfioUserDriver> d;
    if (Status st = VfioUserDriver::attach(socket, o, &d); !st.ok()) {
      std::cerr << "dpukv nvme perf: cannot attach to " << socket << ": " << st.name() << "\n";
      return 1;
    }
    ini_ = make_vfio_user_initiator(std::move(d), c.interrupts);
    return create_malloc_bdev("baseline", p.target_size / 4096, 4096, &base_).ok() ? 0 : 1;
  }
  void baseline(const PerfConfig& c, const std::string& w, uint32_t, uint32_t bs, double iops,
                Json* row) override {
    if (w != base_workload_) {  // measured once per workload
      base_iops_ = bdev_baseline_iops(*base_, w, bs, 0.5);
      base_workload_ = w;
    }
    (*row)["interrupts"] = c.interrupts;
    *row = bench::compared(std::move(*row), "in-process malloc bdev, same workload", "iops", iops,
                           base_iops_);
  }

 private:
  std::unique_ptr<Bdev> base_;
  std::string base_workload_;
  double base_iops_ = 0;
};

// NVMe/TCP; baseline, a raw TCP ping-pong of the same sizes and depth against a
// server started where the target runs.
class TcpPerf final : public PerfTransport {
 public:
  ~TcpPerf() override {
    if (pp_fd_ >= 0) ::close(pp_fd_);
    stop(&pp_server_);
  }
  int open(const PerfConfig& c, const PerfPlan& p) override {
    std::string addr = "127.0.0.1";
    int port = 0;
    if (c.address.empty()) {
      std::vector<std::string> a = {"nvme",        "target",
                                    "--transport", "tcp",
                                    "--listen",    "127.0.0.1:0",
                                    "--nqn",       c.nqn,
                                    "--bdev",      "malloc",
                                    "--size",      c.target_size,
                                    "--port-file", "/tmp/dpukv-nvme-perf-" + p.pid + ".port"};
      a.insert(a.end(), p.cpu_args.begin(), p.cpu_args.end());
      target_ = spawn_and_wait_port(a, "/tmp/dpukv-nvme-perf-" + p.pid + ".port", &port);
    } else {
      uint16_t p16 = 0;
      if (!parse_host_port(c.address, &addr, &p16, 4420)) {
        std::cerr << "dpukv nvme perf: --address wants ADDR[:PORT], not '" << c.address << "'\n";
        return 2;
      }
      port = p16;
    }
    std::vector<std::string> a = {"nvme", "pingpong-server", "--port-file",
                                  "/tmp/dpukv-nvme-pp-" + p.pid + ".port"};
    a.insert(a.end(), p.cpu_args.begin(), p.cpu_args.end());
    int pp_port = 0;
    pp_server_ = spawn_and_wait_port(a, "/tmp/dpukv-nvme-pp-" + p.pid + ".port", &pp_port);
    if (p.pin) bench::pin_current_thread(c.cpu);
    TcpHostOptions o;
    o.addr = addr;
    o.port = static_cast<uint16_t>(port);
    o.subnqn = c.nqn;
    o.header_digest = o.data_digest = c.digests;
    o.queue_depth = 128;
    std::unique_ptr<NvmeTcpHost> h;
    if (Status st = NvmeTcpHost::connect(o, &h); !st.ok() || port <= 0) {
      std::cerr << "dpukv nvme perf: cannot connect to " << addr << ":" << port << ": " << st.name()
                << "\n";
      return 1;
    }
    uint16_t depth = h->queue_depth();
    ini_ = make_tcp_initiator(std::move(h), depth);
    pp_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(pp_port));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    if (pp_port <= 0 || connect(pp_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
      std::cerr << "dpukv nvme perf: cannot reach the ping-pong baseline server\n";
      return 1;
    }
    setsockopt(pp_fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return 0;
  }
  void baseline(const PerfConfig& c, const std::string& w, uint32_t qd, uint32_t bs, double iops,
                Json* row) override {
    // The same bytes each way as the NVMe/TCP exchange: a 72-byte capsule (+ data
    // for writes) out, a 24-byte C2HData header + data (reads) or response back.
    const bool wr = is_write(w);
    const uint32_t req = 72 + (wr ? bs : 0), resp = wr ? 24 : 24 + bs;
    PingPong pp = pingpong(pp_fd_, req, resp, qd, 1.0);
    (*row)["digests"] = c.digests;
    (*row)["baseline_p50_us"] = pp.p50;
    *row = bench::compared(std::move(*row), "raw TCP ping-pong, same sizes and depth", "iops", iops,
                           pp.iops);
  }

 private:
  pid_t pp_server_ = -1;
  int pp_fd_ = -1;
};

// The initiator transports, by --transport name; the first is the default.
struct PerfTransportInfo {
  const char* name;
  uint32_t max_qd;                      // the deepest queue it offers
  bool (*external)(const PerfConfig&);  // a target named on the command line
  std::unique_ptr<PerfTransport> (*make)();
};
constexpr PerfTransportInfo kPerfTransports[] = {
    {"vfio-user", 1023, [](const PerfConfig& c) { return !c.socket.empty(); },
     [] { return std::unique_ptr<PerfTransport>(new VfioUserPerf); }},
    {"tcp", 127, [](const PerfConfig& c) { return !c.address.empty(); },
     [] { return std::unique_ptr<PerfTransport>(new TcpPerf); }},
};

std::string perf_transport_names() {
  std::string out;
  for (const PerfTransportInfo& t : kPerfTransports)
    out += (out.empty() ? "" : ", ") + std::string(t.name);
  return out;
}

int run_perf(PerfConfig c) {
  const PerfTransportInfo* kind = nullptr;
  for (const PerfTransportInfo& t : kPerfTransports)
    if (c.transport == t.name) kind = &t;
  if (kind == nullptr) {
    std::cerr << "dpukv nvme perf: unknown transport " << c.transport << " ("
              << perf_transport_names() << ")\n";
    return 2;
  }
  std::vector<std::string> workloads = split(c.workloads);
  for (const auto& w : workloads)
    if (!workload_known(w)) {
      std::cerr << "dpukv nvme perf: unknown workload '" << w
                << "' (randread, randwrite, read, write)\n";
      return 2;
    }
  std::vector<uint64_t> qds;
  PerfPlan plan;
  if (!bench::parse_size_list(c.qds, &qds).ok() ||
      !bench::parse_size(c.block_size, &plan.bs).ok() || plan.bs == 0 || plan.bs > (128u << 10) ||
      !bench::parse_size(c.target_size, &plan.target_size).ok()) {
    std::cerr << "dpukv nvme perf: bad --qd, --block-size (up to 128K) or --target-size\n";
    return 2;
  }
  for (uint64_t q : qds) plan.max_qd = std::max(plan.max_qd, q);
  if (plan.max_qd > kind->max_qd) {
    std::cerr << "dpukv nvme perf: --qd up to " << kind->max_qd << " on " << c.transport << "\n";
    return 2;
  }
  const uint64_t bs = plan.bs;
  // A target started here polls on --target-cpu and the initiator on another
  // CPU. Against someone else's target (SPDK's nvmf_tgt busy-polls the CPUs of
  // its -m), pinning the initiator onto its CPU makes both take turns at
  // scheduler ticks (IOPS fall a hundredfold, p50 stays alike): there the
  // initiator is pinned only where --cpu says, and the scheduler places it.
  const bool external = kind->external(c);
  plan.pin = bench::num_cpus() >= 2 && (!external || c.cpu >= 0);
  if (c.cpu < 0) c.cpu = 0;
  plan.pid = std::to_string(getpid());
  if (plan.pin && !external) plan.cpu_args = {"--cpu", std::to_string(c.target_cpu)};
  std::unique_ptr<PerfTransport> t = kind->make();
  if (int rc = t->open(c, plan); rc != 0) return rc;
  std::vector<Json> rows;
  if (!c.out.json)
    std::printf("%-10s %-9s %4s %6s %12s %10s %9s %9s %14s %7s\n", "transport", "workload", "qd",
                "bs", "IOPS", "MB/s", "p50 us", "p99 us", "baseline IOPS", "ratio");
  int rc = 0;
  for (const auto& w : workloads) {
    for (uint64_t qd : qds) {
      PerfResult r;
      if (bench::progress_enabled() && !c.out.json)
        std::fprintf(stderr, "running %s qd %llu for %.1f s...\r", w.c_str(),
                     static_cast<unsigned long long>(qd), c.seconds + c.warmup);
      Status st =
          run_one(t->initiator(), w, static_cast<uint32_t>(qd), static_cast<uint32_t>(bs), c, &r);
      if (!st.ok()) {
        std::cerr << "dpukv nvme perf: " << w << " qd " << qd << " failed: " << st.name()
                  << (st == Code::kTimeout ? " (no I/O completed to measure: a stuck target, or "
                                             "a machine that gave this run no CPU)"
                                           : "")
                  << "; no figure for it\n";
        rc = 1;
        continue;
      }
      if (r.errors > 0) rc = 1;
      Json row;
      row["transport"] = c.transport;
      row["workload"] = w;
      row["qd"] = qd;
      row["block_size"] = bs;
      row["iops"] = r.iops;
      row["mbps"] = r.mbps;
      row["p50_us"] = r.p50;
      row["p99_us"] = r.p99;
      row["p999_us"] = r.p999;
      row["errors"] = r.errors;
      t->baseline(c, w, static_cast<uint32_t>(qd), static_cast<uint32_t>(bs), r.iops, &row);
      rows.push_back(row);
      if (!c.out.json)
        std::printf("%-10s %-9s %4llu %6s %12.0f %10.1f %9.2f %9.2f %14.0f %7.3f\n",
                    c.transport.c_str(), w.c_str(), static_cast<unsigned long long>(qd),
                    bench::format_size(bs).c_str(), r.iops, r.mbps, r.p50, r.p99,
                    row["baseline_iops"].get<double>(), row["ratio"].get<double>());
    }
  }
  t.reset();  // the target and baseline server stop before the report
  if (c.out.json)
    bench::print_json("nvme", rows);
  else
    bench::print_machine_line();
  if (!bench::write_csv(c.out, rows)) rc = 1;
  return rc;
}

}  // namespace

void add_nvme_perf_command(CLI::App* nvme, int* exit_code) {
  static PerfConfig pc;
  CLI::App* p = nvme->add_subcommand("perf",
                                     "I/O benchmark through dpukv's NVMe initiators (starts its "
                                     "own malloc target without an address)");
  p->add_option("--transport", pc.transport, perf_transport_names())->capture_default_str();
  p->add_option("--socket", pc.socket,
                "vfio-user: target socket; empty: start a target in a child process");
  p->add_option("--address", pc.address,
                "tcp: target ADDR:PORT; empty: start a target in a child process");
  p->add_option("--nqn", pc.nqn, "tcp: subsystem NQN")->capture_default_str();
  p->add_option("--workload,-w", pc.workloads, "randread,randwrite,read,write (comma list)")
      ->capture_default_str();
  p->add_option("--qd,-q", pc.qds, "Queue depths (comma list)")->capture_default_str();
  p->add_option("--block-size,-o", pc.block_size, "I/O size")->capture_default_str();
  p->add_option("--time,-t", pc.seconds, "Seconds measured per point")->capture_default_str();
  p->add_option("--warmup", pc.warmup, "Seconds run before measuring")->capture_default_str();
  p->add_option("--target-size", pc.target_size,
                "Malloc namespace size of a started target (and the baseline)")
      ->capture_default_str();
  p->add_option("--cpu", pc.cpu,
                "Initiator CPU (default: 0 with a target started here; unpinned against "
                "--socket/--address, whose target may busy-poll any CPU)");
  p->add_option("--target-cpu", pc.target_cpu, "CPU of a started target's poller")
      ->capture_default_str();
  p->add_flag("--interrupts", pc.interrupts,
              "vfio-user: wait on MSI-X eventfds instead of polling");
  p->add_flag("--digests", pc.digests, "tcp: header and data digests");
  bench::add_output_options(p, &pc.out);
  p->callback([exit_code] { *exit_code = run_perf(pc); });

  static std::string pp_port_file;
  static int pp_cpu = -1;
  CLI::App* s =
      nvme->add_subcommand("pingpong-server", "Raw TCP ping-pong server (the tcp perf baseline)");
  s->group("");  // internal: started by `nvme perf`
  s->add_option("--port-file", pp_port_file, "Write the bound port here")->required();
  s->add_option("--cpu", pp_cpu, "Pin to this CPU");
  s->callback([exit_code] { *exit_code = run_pingpong_server(pp_port_file, pp_cpu); });
}

}  // namespace dpukv
