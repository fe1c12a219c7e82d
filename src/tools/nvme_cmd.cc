#include "tools/nvme_cmd.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "nvme/bdev.h"
#include "nvme/emulation_manager.h"
#include "nvme/nvme_driver.h"
#include "nvme/nvmf_target.h"
#include "nvme/tcp_host.h"
#include "runtime/log.h"
#include "tools/bench_common.h"

namespace dpukv {
namespace {

using bench::Json;
using namespace nvme;

struct TargetConfig {
  std::string socket;
  std::string bdev = "malloc";
  std::string size = "1G";
  std::string file;
  uint32_t block_size = 4096;
  uint32_t namespaces = 1;
  int cpu = -1;
  std::string serial = "DPUKV00000001";
  std::string transport = "vfio-user";
  std::string listen = "127.0.0.1:4420";
  std::string nqn = "nqn.2026-11.io.dpukv:cnode1";
  std::vector<std::string> hosts;  // empty: any host
  std::string port_file;
};

Status make_bdev(const TargetConfig& c, uint32_t index, std::shared_ptr<Bdev>* out) {
  uint64_t bytes = 0;
  if (Status st = bench::parse_size(c.size, &bytes); !st.ok()) return st;
  std::unique_ptr<Bdev> b;
  std::string name = c.bdev + std::to_string(index);
  Status st = Code::kInvalidValue;
  if (c.bdev == "malloc")
    st = create_malloc_bdev(name, bytes / c.block_size, c.block_size, &b);
  else if (c.bdev == "null")
    st = create_null_bdev(name, bytes / c.block_size, c.block_size, &b);
  else if (c.bdev == "file")
    st = create_file_bdev(name, c.namespaces > 1 ? c.file + "." + std::to_string(index) : c.file,
                          bytes, c.block_size, &b);
  if (st.ok()) *out = std::move(b);
  return st;
}

volatile sig_atomic_t g_stop = 0;

void wait_for_signal() {
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_stop = 1; };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  while (!g_stop) pause();
}

bool split_host_port(const std::string& s, std::string* host, uint16_t* port) {
  size_t colon = s.rfind(':');
  if (colon == std::string::npos) return false;
  *host = s.substr(0, colon);
  char* end = nullptr;
  unsigned long p = std::strtoul(s.c_str() + colon + 1, &end, 10);
  if (end == s.c_str() + colon + 1 || *end != '\0' || p > 65535) return false;
  *port = static_cast<uint16_t>(p);
  return true;
}

int run_tcp_target(const TargetConfig& c, std::vector<std::shared_ptr<Bdev>> bdevs) {
  std::string addr;
  uint16_t port = 0;
  if (!split_host_port(c.listen, &addr, &port)) {
    std::cerr << "dpukv nvme target: --listen wants ADDR:PORT\n";
    return 2;
  }
  TcpTransportOptions to;
  to.cpu = c.cpu;
  std::unique_ptr<NvmfTarget> t;
  if (Status st = NvmfTarget::create(to, &t); !st.ok()) return 1;
  SubsystemConfig sc;
  sc.nqn = c.nqn;
  sc.serial = c.serial;
  sc.allow_any_host = c.hosts.empty();
  sc.hosts = c.hosts;
  if (Status st = t->create_subsystem(sc); !st.ok()) {
    std::cerr << "dpukv nvme target: bad subsystem NQN or serial: " << st.name() << "\n";
    return 2;
  }
  for (auto& b : bdevs) {
    uint32_t nsid = 0;
    if (!t->add_namespace(c.nqn, b, 0, &nsid).ok()) return 1;
  }
  uint16_t bound = 0;
  if (Status st = t->add_listener(c.nqn, addr, port, &bound); !st.ok()) {
    std::cerr << "dpukv nvme target: cannot listen on " << c.listen << ": " << st.name() << "\n";
    return 1;
  }
  if (!c.port_file.empty()) {
    FILE* f = std::fopen((c.port_file + ".tmp").c_str(), "w");
    if (f == nullptr) return 1;
    std::fprintf(f, "%u\n", bound);
    std::fclose(f);
    std::rename((c.port_file + ".tmp").c_str(), c.port_file.c_str());
  }
  std::cerr << "dpukv nvme target: subsystem " << c.nqn << " listening on tcp " << addr << ":"
            << bound << " (" << c.namespaces << " x " << c.bdev << " " << c.size << ", "
            << c.block_size << "-byte blocks, "
            << (c.hosts.empty() ? "any host" : std::to_string(c.hosts.size()) + " allowed hosts")
            << ")\n";
  wait_for_signal();
  TargetStats st = t->stats();
  std::cerr << "dpukv nvme target: " << st.connections << " connections, " << st.commands
            << " commands, " << st.errors << " errors, " << st.term_reqs_sent << " terminations, "
            << st.connect_rejects << " refused connects\n";
  return 0;
}

int run_target(const TargetConfig& c) {
  if (c.transport != "tcp" && c.socket.empty()) {
    std::cerr << "dpukv nvme target: --socket is required for vfio-user\n";
    return 2;
  }
  if (!valid_block_size(c.block_size)) {
    std::cerr << "dpukv nvme target: --block-size must be 512 or 4096\n";
    return 2;
  }
  if (c.bdev == "file" && c.file.empty()) {
    std::cerr << "dpukv nvme target: --bdev file needs --file PATH\n";
    return 2;
  }
  FunctionSpec spec;
  spec.socket_path = c.socket;
  spec.config.controller.serial = c.serial;
  for (uint32_t i = 0; i < c.namespaces; ++i) {
    std::shared_ptr<Bdev> b;
    if (Status st = make_bdev(c, i, &b); !st.ok()) {
      std::cerr << "dpukv nvme target: cannot create " << c.bdev << " bdev of " << c.size << ": "
                << st.name() << "\n";
      return 1;
    }
    spec.namespaces.push_back(std::move(b));
  }
  if (c.transport == "tcp") return run_tcp_target(c, spec.namespaces);
  ManagerOptions mo;
  mo.cpu = c.cpu;
  std::unique_ptr<EmulationManager> mgr;
  if (Status st = EmulationManager::create(mo, &mgr); !st.ok()) return 1;
  std::string id;
  if (Status st = mgr->create_function(spec, &id); !st.ok()) {
    std::cerr << "dpukv nvme target: cannot create the function on " << c.socket << ": "
              << st.name() << "\n";
    return 1;
  }
  std::cerr << "dpukv nvme target: function " << id << " listening on " << c.socket << " ("
            << c.namespaces << " x " << c.bdev << " " << c.size << ", " << c.block_size
            << "-byte blocks)\n";
  wait_for_signal();
  for (const FunctionInfo& f : mgr->list_functions())
    std::cerr << "dpukv nvme target: " << f.id << ": " << f.stats.io_commands << " I/O commands, "
              << f.stats.admin_commands << " admin, " << f.stats.errors << " errors, "
              << f.stats.fatal << " fatal\n";
  return 0;
}

std::string ascii(const uint8_t* p, size_t n) {
  std::string s(reinterpret_cast<const char*>(p), n);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.pop_back();
  return s;
}

int run_identify(const std::string& socket, bool json) {
  DriverOptions o;
  o.queue_entries = 16;
  std::unique_ptr<NvmeDriver> d;
  if (Status st = NvmeDriver::attach(socket, o, &d); !st.ok()) {
    std::cerr << "dpukv nvme identify: cannot attach to " << socket << ": " << st.name() << "\n";
    return 1;
  }
  uint8_t id[kIdentifySize];
  uint16_t status = 0;
  if (!d->identify(kCnsController, 0, id, &status).ok() || status != kSuccess) {
    std::cerr << "dpukv nvme identify: Identify Controller failed (status 0x" << std::hex << status
              << ")\n";
    return 1;
  }
  uint16_t vid, cntlid;
  uint32_t ver, nn;
  std::memcpy(&vid, id, 2);
  std::memcpy(&cntlid, id + 78, 2);
  std::memcpy(&ver, id + 80, 4);
  std::memcpy(&nn, id + 516, 4);
  Json j;
  j["vendor_id"] = vid;
  j["serial"] = ascii(id + 4, 20);
  j["model"] = ascii(id + 24, 40);
  j["firmware"] = ascii(id + 64, 8);
  j["controller_id"] = cntlid;
  j["version"] = std::to_string(ver >> 16) + "." + std::to_string((ver >> 8) & 0xff);
  j["max_transfer_bytes"] = d->max_transfer();
  j["max_namespaces"] = nn;
  j["subsystem_nqn"] = ascii(id + 768, 256);
  j["io_queues"] = d->io_queue_count();
  Json nss = Json::array();
  for (uint32_t nsid : d->namespaces())
    nss.push_back(Json{{"nsid", nsid},
                       {"blocks", d->num_blocks(nsid)},
                       {"block_size", d->block_size(nsid)},
                       {"bytes", d->num_blocks(nsid) * d->block_size(nsid)}});
  j["namespaces"] = nss;
  if (json) {
    std::cout << j.dump() << "\n";
    return 0;
  }
  std::printf("NVMe controller at %s\n", socket.c_str());
  std::printf(
      "  vendor id      0x%04x\n  serial         %s\n  model          %s\n  firmware       %s\n",
      vid, j["serial"].get<std::string>().c_str(), j["model"].get<std::string>().c_str(),
      j["firmware"].get<std::string>().c_str());
  std::printf(
      "  version        %s\n  controller id  %u\n  max transfer   %u bytes\n  subsystem nqn  %s\n",
      j["version"].get<std::string>().c_str(), cntlid, d->max_transfer(),
      j["subsystem_nqn"].get<std::string>().c_str());
  for (uint32_t nsid : d->namespaces())
    std::printf("  namespace %u: %llu blocks of %u bytes (%.2f GiB)\n", nsid,
                static_cast<unsigned long long>(d->num_blocks(nsid)), d->block_size(nsid),
                static_cast<double>(d->num_blocks(nsid) * d->block_size(nsid)) / (1u << 30));
  return 0;
}

// ---- perf -------------------------------------------------------------------

struct PerfConfig {
  std::string socket;
  std::string transport = "vfio-user";
  std::string workloads = "randread";
  std::string qds = "1,32";
  std::string block_size = "4K";
  double seconds = 3;
  double warmup = 0.5;
  std::string target_size = "1G";
  int cpu = 0, target_cpu = 1;
  bool interrupts = false;
  bool json = false;
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

Status run_perf_one(NvmeDriver& d, const std::string& workload, uint32_t qd, uint32_t bs,
                    const PerfConfig& c, PerfResult* res) {
  uint32_t nsid = d.namespaces().empty() ? 0 : d.namespaces()[0];
  uint32_t lba_size = d.block_size(nsid);
  if (nsid == 0 || lba_size == 0 || bs % lba_size != 0) return Code::kInvalidValue;
  uint64_t nlb = bs / lba_size;
  uint64_t span = d.num_blocks(nsid) / nlb;  // block-sized slots
  if (span == 0 || qd == 0 || qd >= d.queue_entries()) return Code::kInvalidValue;
  std::vector<DmaBuffer> bufs(qd);
  for (auto& b : bufs)
    if (Status st = d.alloc(bs, &b); !st.ok()) return st;
  for (auto& b : bufs) std::memset(b.host, 0x5a, bs);
  bool rnd = workload[0] == 'r' && workload[1] == 'a';
  bool write = workload.find("write") != std::string::npos;
  uint64_t seed = 0x9e3779b97f4a7c15ull, seq = 0;
  std::vector<uint64_t> started(qd);
  bench::LatencyRecorder lat;
  auto issue = [&](uint16_t cid) -> Status {
    Sqe cmd{};
    cmd.opc = write ? kNvmWrite : kNvmRead;
    cmd.cid = cid;
    cmd.nsid = nsid;
    uint64_t slot = rnd ? next_rand(&seed) % span : seq++ % span;
    uint64_t lba = slot * nlb;
    cmd.cdw10 = static_cast<uint32_t>(lba);
    cmd.cdw11 = static_cast<uint32_t>(lba >> 32);
    cmd.cdw12 = static_cast<uint32_t>(nlb - 1);
    started[cid] = bench::now_ns();
    return d.submit(0, cmd, &bufs[cid], bs, nullptr);
  };
  uint64_t t0 = bench::now_ns();
  uint64_t measure_from = t0 + static_cast<uint64_t>(c.warmup * 1e9);
  uint64_t end = measure_from + static_cast<uint64_t>(c.seconds * 1e9);
  for (uint16_t i = 0; i < qd; ++i)
    if (Status st = issue(i); !st.ok()) return st;
  uint32_t outstanding = qd;
  uint64_t done = 0, errors = 0, last_progress = bench::now_ns();
  Cqe cqes[64];
  while (outstanding > 0) {
    int n = d.reap(0, cqes, 64);
    uint64_t now = bench::now_ns();
    if (n == 0) {
      if (now - last_progress > 5'000'000'000ull) return Code::kTimeout;  // a stuck controller
      if (c.interrupts) (void)d.wait_interrupt(0, 10);
      continue;
    }
    last_progress = now;
    for (int i = 0; i < n; ++i) {
      uint16_t cid = cqes[i].cid;
      if (cid >= qd) return Code::kCorrupted;
      if (status_of_cqe(cqes[i].status) != kSuccess) ++errors;
      if (started[cid] >= measure_from && now <= end) {
        lat.add(now - started[cid]);
        ++done;
      }
      if (now < end) {
        if (Status st = issue(cid); !st.ok()) return st;
      } else {
        --outstanding;
      }
    }
  }
  double secs = c.seconds;
  lat.finish();
  res->iops = static_cast<double>(done) / secs;
  res->mbps = res->iops * bs / 1e6;
  res->p50 = lat.percentile_us(50);
  res->p99 = lat.percentile_us(99);
  res->p999 = lat.percentile_us(99.9);
  res->errors = errors;
  return Code::kSuccess;
}

// The same I/O done directly on an in-process malloc block device: what the
// emulation costs on top of the medium.
double baseline_iops(Bdev& b, const std::string& workload, uint32_t bs, double seconds) {
  std::vector<uint8_t> buf(bs, 0x5a);
  iovec iov{buf.data(), bs};
  bool rnd = workload[0] == 'r' && workload[1] == 'a';
  bool write = workload.find("write") != std::string::npos;
  uint64_t nlb = bs / b.block_size(), span = b.num_blocks() / nlb, seed = 0x9e3779b97f4a7c15ull,
           seq = 0;
  BdevIo io;
  io.op = write ? BdevOp::kWrite : BdevOp::kRead;
  io.nblocks = nlb;
  io.iov = &iov;
  io.iovcnt = 1;
  io.done = [](BdevIo*, Status) {};
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

int run_perf(const PerfConfig& c) {
  if (c.transport == "tcp") {
    std::cerr << "dpukv nvme perf: the NVMe/TCP transport is not built yet (issue 8); use "
                 "--transport vfio-user\n";
    return 2;
  }
  if (c.transport != "vfio-user") {
    std::cerr << "dpukv nvme perf: unknown transport " << c.transport << "\n";
    return 2;
  }
  std::vector<std::string> workloads;
  for (size_t p = 0; p <= c.workloads.size();) {
    size_t q = c.workloads.find(',', p);
    if (q == std::string::npos) q = c.workloads.size();
    workloads.push_back(c.workloads.substr(p, q - p));
    p = q + 1;
  }
  for (const auto& w : workloads)
    if (!workload_known(w)) {
      std::cerr << "dpukv nvme perf: unknown workload '" << w
                << "' (randread, randwrite, read, write)\n";
      return 2;
    }
  std::vector<uint64_t> qds;
  uint64_t bs = 0, tsize = 0;
  if (!bench::parse_size_list(c.qds, &qds).ok() || !bench::parse_size(c.block_size, &bs).ok() ||
      bs == 0 || bs > (1u << 20) || !bench::parse_size(c.target_size, &tsize).ok()) {
    std::cerr << "dpukv nvme perf: bad --qd, --block-size or --target-size\n";
    return 2;
  }
  std::string socket = c.socket;
  pid_t child = -1;
  bool pin = bench::num_cpus() >= 2;
  if (socket.empty()) {
    socket = "/tmp/dpukv-nvme-perf-" + std::to_string(getpid()) + ".sock";
    std::vector<std::string> args = {"nvme",   "target", "--socket", socket,
                                     "--bdev", "malloc", "--size",   c.target_size};
    if (pin) args.insert(args.end(), {"--cpu", std::to_string(c.target_cpu)});
    child = bench::spawn_self(args, -1);
    if (child < 0) {
      std::cerr << "dpukv nvme perf: cannot start a target\n";
      return 1;
    }
  }
  auto stop_child = [&] {
    if (child > 0) {
      kill(child, SIGTERM);
      waitpid(child, nullptr, 0);
      child = -1;
    }
  };
  if (pin) bench::pin_current_thread(c.cpu);
  DriverOptions o;
  o.interrupts = c.interrupts;
  uint64_t max_qd = 1;
  for (uint64_t q : qds) max_qd = std::max(max_qd, q);
  o.queue_entries = static_cast<uint32_t>(std::max<uint64_t>(64, max_qd + 1));
  o.memory_bytes = std::max<size_t>(64u << 20, static_cast<size_t>(max_qd * bs * 2 + (32u << 20)));
  std::unique_ptr<NvmeDriver> d;
  if (Status st = NvmeDriver::attach(socket, o, &d); !st.ok()) {
    std::cerr << "dpukv nvme perf: cannot attach to " << socket << ": " << st.name() << "\n";
    stop_child();
    return 1;
  }
  std::unique_ptr<Bdev> base;
  if (!create_malloc_bdev("baseline", tsize / 4096, 4096, &base).ok()) {
    stop_child();
    return 1;
  }
  std::vector<Json> rows;
  if (!c.json)
    std::printf("%-10s %-9s %4s %6s %12s %10s %9s %9s %14s %7s\n", "transport", "workload", "qd",
                "bs", "IOPS", "MB/s", "p50 us", "p99 us", "baseline IOPS", "ratio");
  int rc = 0;
  for (const auto& w : workloads) {
    double base_iops = baseline_iops(*base, w, static_cast<uint32_t>(bs), 0.5);
    for (uint64_t qd : qds) {
      PerfResult r;
      if (bench::progress_enabled() && !c.json)
        std::fprintf(stderr, "running %s qd %llu for %.1f s...\r", w.c_str(),
                     static_cast<unsigned long long>(qd), c.seconds + c.warmup);
      Status st = run_perf_one(*d, w, static_cast<uint32_t>(qd), static_cast<uint32_t>(bs), c, &r);
      if (!st.ok()) {
        std::cerr << "dpukv nvme perf: " << w << " qd " << qd << " failed: " << st.name() << "\n";
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
      row["interrupts"] = c.interrupts;
      row["baseline"] = "in-process malloc bdev, same workload";
      row["baseline_iops"] = base_iops;
      row["ratio"] = base_iops > 0 ? r.iops / base_iops : 0.0;
      rows.push_back(row);
      if (!c.json)
        std::printf("%-10s %-9s %4llu %6s %12.0f %10.1f %9.2f %9.2f %14.0f %7.3f\n",
                    c.transport.c_str(), w.c_str(), static_cast<unsigned long long>(qd),
                    bench::format_size(bs).c_str(), r.iops, r.mbps, r.p50, r.p99, base_iops,
                    row["ratio"].get<double>());
    }
  }
  d.reset();
  stop_child();
  if (c.json) bench::print_json("nvme", rows);
  if (!bench::write_csv(c.out, rows)) rc = 1;
  return rc;
}

}  // namespace

void add_nvme_commands(CLI::App* app, int* exit_code) {
  CLI::App* nvme = app->add_subcommand(
      "nvme", "Emulated NVMe controller over vfio-user: target, identify, perf");
  nvme->require_subcommand(1);

  static TargetConfig tc;
  CLI::App* t =
      nvme->add_subcommand("target", "Serve an emulated NVMe PCIe function on a vfio-user socket");
  t->add_option("--transport", tc.transport,
                "vfio-user (an emulated PCIe function) or tcp (NVMe/TCP)")
      ->check(CLI::IsMember({"vfio-user", "tcp"}))
      ->capture_default_str();
  t->add_option("--socket", tc.socket, "vfio-user socket path");
  t->add_option("--listen", tc.listen, "tcp: ADDR:PORT to listen on (port 0: any)")
      ->capture_default_str();
  t->add_option("--nqn", tc.nqn, "tcp: subsystem NQN")->capture_default_str();
  t->add_option("--allow-host", tc.hosts,
                "tcp: host NQN allowed to connect (repeat; none: any host)");
  t->add_option("--port-file", tc.port_file,
                "tcp: write the bound port to this file when listening");
  t->add_option("--bdev", tc.bdev, "Namespace medium: malloc, null or file")
      ->check(CLI::IsMember({"malloc", "null", "file"}))
      ->capture_default_str();
  t->add_option("--size", tc.size, "Namespace size (4K, 1G, ...)")->capture_default_str();
  t->add_option("--file", tc.file, "Backing file for --bdev file");
  t->add_option("--block-size", tc.block_size, "LBA size: 512 or 4096")->capture_default_str();
  t->add_option("--namespaces", tc.namespaces, "Namespaces, each its own device")
      ->check(CLI::Range(1u, ControllerCore::kMaxNamespaces))
      ->capture_default_str();
  t->add_option("--serial", tc.serial, "Controller serial number")->capture_default_str();
  t->add_option("--cpu", tc.cpu, "Pin the poller thread to this CPU (-1: no pinning)")
      ->capture_default_str();
  t->callback([exit_code] { *exit_code = run_target(tc); });

  static std::string id_socket;
  static bool id_json = false;
  CLI::App* i =
      nvme->add_subcommand("identify", "Print what the controller's Identify commands return");
  i->add_option("--socket", id_socket, "vfio-user socket path")->required();
  i->add_flag("--json", id_json, "One JSON object");
  i->callback([exit_code] { *exit_code = run_identify(id_socket, id_json); });

  static PerfConfig pc;
  CLI::App* p = nvme->add_subcommand("perf",
                                     "I/O benchmark through a vfio-user NVMe client (starts its "
                                     "own malloc target without --socket)");
  p->add_option("--socket", pc.socket, "Target socket; empty: start a target in a child process");
  p->add_option("--transport", pc.transport, "vfio-user (tcp: not built yet)")
      ->capture_default_str();
  p->add_option("--workload,-w", pc.workloads, "randread,randwrite,read,write (comma list)")
      ->capture_default_str();
  p->add_option("--qd,-q", pc.qds, "Queue depths (comma list)")->capture_default_str();
  p->add_option("--block-size,-o", pc.block_size, "I/O size")->capture_default_str();
  p->add_option("--time,-t", pc.seconds, "Seconds measured per point")->capture_default_str();
  p->add_option("--warmup", pc.warmup, "Seconds run before measuring")->capture_default_str();
  p->add_option("--target-size", pc.target_size,
                "Malloc namespace size of a started target (and the baseline)")
      ->capture_default_str();
  p->add_option("--cpu", pc.cpu, "Initiator CPU")->capture_default_str();
  p->add_option("--target-cpu", pc.target_cpu, "CPU of a started target's poller")
      ->capture_default_str();
  p->add_flag("--interrupts", pc.interrupts,
              "Wait on MSI-X eventfds instead of polling completions");
  p->add_flag("--json", pc.json, "One JSON object {\"bench\": \"nvme\", \"results\": [...]}");
  p->add_option("--csv-output-file", pc.out.csv_path, "Also write rows to this CSV file");
  p->callback([exit_code] { *exit_code = run_perf(pc); });
}

}  // namespace dpukv
