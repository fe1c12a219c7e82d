#include "tools/bench_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <thread>
#include <vector>

#include "cluster/ucx_node.h"
#include "runtime/child_process.h"
#include "runtime/log.h"
#include "tools/bench_common.h"

namespace dpukv {
namespace {

using bench::Json;

struct Config {
  std::string size = "32M";
  uint32_t reps = 9;
  std::string transports = "tcp,shm";
  bench::OutputOptions out;
};

uint8_t pattern(uint64_t i) {
  return static_cast<uint8_t>(i * 131 + (i >> 12));
}

bool write_all(int fd, const void* p, size_t n) {
  const auto* c = static_cast<const uint8_t*>(p);
  while (n > 0) {
    ssize_t k = ::write(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool read_all(int fd, void* p, size_t n) {
  auto* c = static_cast<uint8_t*>(p);
  while (n > 0) {
    ssize_t k = ::read(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// The peer: a UCX node exposing `bytes` of patterned memory, and a TCP server that
// streams the same bytes for every one-byte request (the raw baseline). Writes its
// description and TCP port to `out`, then serves until killed.
[[noreturn]] void run_peer(uint64_t bytes, const UcxNodeOptions& no, int out) {
  std::vector<uint8_t> region(bytes);
  for (uint64_t i = 0; i < bytes; ++i) region[i] = pattern(i);
  std::unique_ptr<ProgressEngine> pe;
  std::unique_ptr<UcxNode> node;
  std::string blob;
  if (!ProgressEngine::create(&pe).ok() || !UcxNode::create(pe.get(), no, &node).ok() ||
      !node->expose(region.data(), bytes).ok() || !node->start().ok() ||
      !node->description(&blob).ok())
    _exit(1);
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof(a);
  if (ls < 0 || bind(ls, reinterpret_cast<sockaddr*>(&a), alen) != 0 || listen(ls, 1) != 0 ||
      getsockname(ls, reinterpret_cast<sockaddr*>(&a), &alen) != 0)
    _exit(1);
  std::thread tcp([&] {
    int c = accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    uint8_t req;
    while (read_all(c, &req, 1) && write_all(c, region.data(), bytes)) {
    }
    _exit(0);
  });
  const uint16_t port = ntohs(a.sin_port);
  const auto n = static_cast<uint32_t>(blob.size());
  if (!write_all(out, &port, 2) || !write_all(out, &n, 4) || !write_all(out, blob.data(), n))
    _exit(1);
  for (;;) pe->wait(100000, 100);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One transport: a fresh peer and node with UCX_TLS set for it.
int measure(const Config& c, const std::string& transport, uint64_t bytes,
            std::vector<Json>* rows) {
  // tcp: TCP only, peer failures detected; shm: UCX's shared-memory transports,
  // which in UCX 1.13 need the endpoints without peer-failure handling.
  setenv("UCX_TLS", transport == "tcp" ? "tcp" : "sm,self", 1);
  UcxNodeOptions no;
  no.detect_peer_failure = transport == "tcp";
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return 1;
  pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    close(p[0]);
    run_peer(bytes, no, p[1]);
  }
  close(p[1]);
  int rc = 1;
  uint16_t port = 0;
  uint32_t n = 0;
  std::string blob;
  std::unique_ptr<ProgressEngine> pe;
  std::unique_ptr<UcxNode> node;
  std::vector<uint8_t> local(4096), dst(bytes), src(bytes, 1);
  uint32_t peer = 0;
  int s = -1;
  if (!read_all(p[0], &port, 2) || !read_all(p[0], &n, 4) || n > (1u << 20)) goto out;
  blob.resize(n);
  if (!read_all(p[0], blob.data(), n)) goto out;
  if (!ProgressEngine::create(&pe).ok() || !UcxNode::create(pe.get(), no, &node).ok() ||
      !node->expose(local.data(), local.size()).ok() || !node->start().ok() ||
      !node->connect(reinterpret_cast<const uint8_t*>(blob.data()), blob.size(), &peer).ok()) {
    std::cerr << "dpukv bench cluster: UCX setup failed (" << transport << ")\n";
    goto out;
  }
  {
    struct Done {
      bool done = false;
      Status st;
    };
    auto cb = [](void* arg, Status st) {
      auto* d = static_cast<Done*>(arg);
      d->done = true;
      d->st = st;
    };
    std::vector<double> ucx, base;
    for (uint32_t r = 0; r <= c.reps; ++r) {  // the first round warms up (wire-up)
      Done d;
      const uint64_t t0 = bench::now_ns();
      if (!node->read(peer, 0, dst.data(), bytes, cb, &d).ok()) goto out;
      while (!d.done) pe->progress();
      if (!d.st.ok()) goto out;
      if (r > 0) ucx.push_back((bench::now_ns() - t0) / 1e9);
    }
    for (uint64_t i = 0; i < bytes; i += 4093)
      if (dst[i] != pattern(i)) {
        std::cerr << "dpukv bench cluster: wrong byte at " << i << "\n";
        goto out;
      }
    std::string baseline;
    if (transport == "tcp") {
      baseline = "raw TCP stream";
      s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(port);
      int one = 1;
      setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) goto out;
      for (uint32_t r = 0; r <= c.reps; ++r) {
        const uint8_t req = 1;
        const uint64_t t0 = bench::now_ns();
        if (!write_all(s, &req, 1) || !read_all(s, dst.data(), bytes)) goto out;
        if (r > 0) base.push_back((bench::now_ns() - t0) / 1e9);
      }
    } else {
      baseline = "memcpy";
      for (uint32_t r = 0; r <= c.reps; ++r) {
        const uint64_t t0 = bench::now_ns();
        std::memcpy(dst.data(), src.data(), bytes);
        if (r > 0) base.push_back((bench::now_ns() - t0) / 1e9);
      }
    }
    const double g = bytes / median(ucx) / 1e9, b = bytes / median(base) / 1e9;
    rows->push_back({{"bench", "cluster"},
                     {"op", "remote_read"},
                     {"transport", transport},
                     {"peer_failure_detection", no.detect_peer_failure},
                     {"size_bytes", bytes},
                     {"gbps", g},
                     {"baseline", baseline},
                     {"baseline_gbps", b},
                     {"ratio", g / b}});
    if (!c.out.json)
      std::printf("remote_read %-4s %7s %8.2f GB/s   %-16s %8.2f GB/s   ratio %5.2f\n",
                  transport.c_str(), bench::format_size(bytes).c_str(), g, baseline.c_str(), b,
                  g / b);
    rc = 0;
  }
out:
  if (s >= 0) close(s);
  if (node) {
    (void)node->stop();
    for (int i = 0; i < 100000 && node->state() != CtxState::kIdle; ++i) pe->progress();
  }
  node.reset();
  (void)signal_child(child, SIGKILL);
  (void)reap_child(child, nullptr);
  close(p[0]);
  unsetenv("UCX_TLS");
  return rc;
}

int run(const Config& c) {
  uint64_t bytes = 0;
  if (!bench::parse_size(c.size, &bytes).ok() || bytes == 0) {
    std::cerr << "dpukv bench cluster: bad --size\n";
    return 2;
  }
  log_set_level(LogSource::kLib, LogLevel::kError);
  if (!c.out.json)
    std::printf("dpukv bench cluster: one-sided UCX reads from a peer process, median of %u\n",
                c.reps);
  std::vector<Json> rows;
  size_t start = 0;
  while (start <= c.transports.size()) {
    size_t comma = c.transports.find(',', start);
    if (comma == std::string::npos) comma = c.transports.size();
    const std::string t = c.transports.substr(start, comma - start);
    if (t != "tcp" && t != "shm") {
      std::cerr << "dpukv bench cluster: --transports takes tcp and shm\n";
      return 2;
    }
    if (measure(c, t, bytes, &rows) != 0) return 1;
    start = comma + 1;
  }
  if (c.out.json) bench::print_json("cluster", rows);
  return bench::write_csv(c.out, rows) ? 0 : 1;
}

}  // namespace

void add_bench_cluster_command(CLI::App* bench, int* exit_code) {
  auto c = std::make_shared<Config>();
  CLI::App* cmd = bench->add_subcommand(
      "cluster", "Benchmark one-sided reads from a peer over UCX against raw TCP and memcpy");
  cmd->add_option("--size", c->size, "Bytes per read (K/M/G)")->capture_default_str();
  cmd->add_option("--reps", c->reps, "Timed reads (median reported)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000u));
  cmd->add_option("--transports", c->transports, "tcp, shm or both")->capture_default_str();
  bench::add_output_options(cmd, &c->out);
  cmd->callback([c, exit_code] { *exit_code = run(*c); });
}

}  // namespace dpukv
