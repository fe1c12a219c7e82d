#include "tools/bench/cluster.h"

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

#include <hiredis/hiredis.h>
#include <spawn.h>

#include "client/client.h"
#include "cluster/directory/directory.h"
#include "cluster/ucx/ucx_node.h"
#include "runtime/child_process.h"
#include "runtime/host_port.h"
#include "runtime/log.h"
#include "tools/bench/cluster_pd.h"
#include "tools/common/bench_common.h"
#include "tools/common/node_network.h"

extern char** environ;

namespace dpukv {
namespace {

using bench::Json;

struct Config {
  std::string redis;  // HOST:PORT; empty: start a redis-server for the run
  bool no_directory = false;
  std::string size = "32M";
  uint32_t reps = 9;
  std::string transports = "tcp,shm,netns";
  bool no_pd = false;
  uint32_t pd_chunks = 64;  // chunks of 256 KiB per prefill-to-decode transfer
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

// The peer: a UCX node exposing `bytes` of patterned memory, and a TCP server on
// `ip` that streams the same bytes for every one-byte request (the raw baseline).
// Writes its description and TCP port to `out`, then serves until killed.
[[noreturn]] void run_peer(uint64_t bytes, const UcxNodeOptions& no, const std::string& ip,
                           int out) {
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
  socklen_t alen = sizeof(a);
  if (inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) _exit(1);
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

// Reads `bytes` from the peer whose port and description come on `from` with UCX
// (c.reps times after a warm-up read), checks the bytes, then streams them over
// raw TCP (or copies them, for shm) as often: the medians in *ucx_s and *base_s.
bool time_reads(const Config& c, const std::string& transport, uint64_t bytes,
                const UcxNodeOptions& no, int from, const std::string& peer_ip, double* ucx_s,
                double* base_s) {
  bool ok = false;
  uint16_t port = 0;
  uint32_t n = 0;
  std::string blob;
  std::unique_ptr<ProgressEngine> pe;
  std::unique_ptr<UcxNode> node;
  std::vector<uint8_t> local(4096), dst(bytes), src(bytes, 1);
  std::vector<double> ucx, base;
  uint32_t peer = 0;
  int s = -1;
  struct Done {
    bool done = false;
    Status st;
  };
  auto cb = [](void* arg, Status st) {
    auto* d = static_cast<Done*>(arg);
    d->done = true;
    d->st = st;
  };
  if (!read_all(from, &port, 2) || !read_all(from, &n, 4) || n > (1u << 20)) goto out;
  blob.resize(n);
  if (!read_all(from, blob.data(), n)) goto out;
  if (!ProgressEngine::create(&pe).ok() || !UcxNode::create(pe.get(), no, &node).ok() ||
      !node->expose(local.data(), local.size()).ok() || !node->start().ok() ||
      !node->connect(reinterpret_cast<const uint8_t*>(blob.data()), blob.size(), &peer).ok()) {
    std::cerr << "dpukv bench cluster: UCX setup failed (" << transport << ")\n";
    goto out;
  }
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
  if (transport != "shm") {
    s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (inet_pton(AF_INET, peer_ip.c_str(), &a.sin_addr) != 1 ||
        ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
      goto out;
    for (uint32_t r = 0; r <= c.reps; ++r) {
      const uint8_t req = 1;
      const uint64_t t0 = bench::now_ns();
      if (!write_all(s, &req, 1) || !read_all(s, dst.data(), bytes)) goto out;
      if (r > 0) base.push_back((bench::now_ns() - t0) / 1e9);
    }
  } else {
    for (uint32_t r = 0; r <= c.reps; ++r) {
      const uint64_t t0 = bench::now_ns();
      std::memcpy(dst.data(), src.data(), bytes);
      if (r > 0) base.push_back((bench::now_ns() - t0) / 1e9);
    }
  }
  *ucx_s = bench::median(ucx);
  *base_s = bench::median(base);
  ok = true;
out:
  if (s >= 0) close(s);
  if (node) {
    (void)node->stop();
    for (int i = 0; i < 100000 && node->state() != CtxState::kIdle; ++i) pe->progress();
  }
  return ok;
}

// One transport: a fresh peer process and node with UCX_TLS set for it.
//   tcp    TCP between two processes on loopback, peer failures detected;
//   shm    UCX's shared-memory transports (UCX 1.13: endpoints without
//          peer-failure handling);
//   netns  TCP between two processes in two network namespaces joined by veth
//          pairs on a bridge (as two hosts on one segment); the raw TCP baseline
//          between the same two.
int measure(const Config& c, const std::string& transport, uint64_t bytes,
            std::vector<Json>* rows) {
  const bool netns = transport == "netns";
  NodeNetwork net;
  std::string peer_ip = "127.0.0.1";
  if (netns) {
    if (!net.create(2)) {
      std::cerr << "dpukv bench cluster: cannot make two network namespaces (ip from "
                   "iproute2, as root)\n";
      return 1;
    }
    peer_ip = net.ip(0);
  }
  setenv("UCX_TLS", transport == "shm" ? "sm,self" : "tcp", 1);
  UcxNode::set_transport_defaults();
  const std::string settings = UcxNode::settings();
  UcxNodeOptions no;
  no.detect_peer_failure = transport != "shm";
  double ucx_s = 0, base_s = 0;
  bool ok = false;
  int p[2], r[2] = {-1, -1};
  if (pipe2(p, O_CLOEXEC) != 0) return 1;
  std::fflush(nullptr);  // nothing buffered is written twice by a child
  const pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    close(p[0]);
    if (netns && (!net.enter(0) || setenv("UCX_NET_DEVICES", net.veth(0).c_str(), 1) != 0))
      _exit(1);
    run_peer(bytes, no, peer_ip, p[1]);
  }
  close(p[1]);
  if (!netns) {
    ok = time_reads(c, transport, bytes, no, p[0], peer_ip, &ucx_s, &base_s);
  } else if (pipe2(r, O_CLOEXEC) == 0) {
    // The reader is a process of its own in namespace 1 (a mount namespace comes
    // with it, which a process of several threads cannot enter).
    const pid_t reader = fork();
    if (reader == 0) {
      close(r[0]);
      double t[2];
      if (!net.enter(1) || setenv("UCX_NET_DEVICES", net.veth(1).c_str(), 1) != 0 ||
          !time_reads(c, transport, bytes, no, p[0], peer_ip, &t[0], &t[1]) ||
          !write_all(r[1], t, sizeof(t)))
        _exit(1);
      _exit(0);
    }
    close(r[1]);
    double t[2];
    ok = reader > 0 && read_all(r[0], t, sizeof(t));
    if (ok) {
      ucx_s = t[0];
      base_s = t[1];
    }
    if (reader > 0) (void)reap_child(reader, nullptr);
    close(r[0]);
  }
  (void)signal_child(child, SIGKILL);
  (void)reap_child(child, nullptr);
  close(p[0]);
  unsetenv("UCX_TLS");
  if (!ok) {
    std::cerr << "dpukv bench cluster: " << transport << " reads failed\n";
    return 1;
  }
  const std::string baseline = transport == "shm" ? "memcpy" : "raw TCP stream";
  const double g = bytes / ucx_s / 1e9, b = bytes / base_s / 1e9;
  rows->push_back(bench::compared({{"bench", "cluster"},
                                   {"op", "remote_read"},
                                   {"transport", transport},
                                   {"peer_failure_detection", no.detect_peer_failure},
                                   {"size_bytes", bytes},
                                   {"gbps", g},
                                   {"ucx", settings}},
                                  baseline, "gbps", g, b));
  if (!c.out.json)
    std::printf("remote_read %-5s %7s %8.2f GB/s   %-16s %8.2f GB/s   ratio %5.2f   (%s)\n",
                transport.c_str(), bench::format_size(bytes).c_str(), g, baseline.c_str(), b, g / b,
                settings.c_str());
  return 0;
}

// One lookup of `keys` through d, progressing pe until it is answered; false unless
// every key had a holder.
bool time_lookup(ProgressEngine* pe, Directory* d, const std::vector<ChunkKey>& keys,
                 double* seconds, bool quiet = false) {
  struct Done {
    bool done = false;
    size_t hits = 0;
  } x;
  const uint64_t t0 = bench::now_ns();
  if (!d->lookup(
            keys.data(), static_cast<uint32_t>(keys.size()),
            [](void* arg, Status st, const std::vector<std::vector<uint64_t>>& h) {
              auto* y = static_cast<Done*>(arg);
              y->done = true;
              if (st.ok())
                for (const auto& v : h) y->hits += !v.empty();
            },
            &x)
           .ok())
    return false;
  while (!x.done) pe->progress();
  *seconds = (bench::now_ns() - t0) / 1e9;
  if (x.hits != keys.size()) {
    if (quiet) return false;
    std::cerr << "dpukv bench cluster: directory found " << x.hits << " of " << keys.size()
              << " keys\n";
    return false;
  }
  return true;
}

// Directory lookup of a 64-key prefix (published by another node) against one
// Redis round trip (PING on a plain hiredis connection), both medians of 200.
int measure_directory(const Config& c, std::vector<Json>* rows) {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  pid_t redis = -1;
  if (!c.redis.empty()) {
    if (!parse_host_port(c.redis, &host, &port, 6379)) {
      std::cerr << "dpukv bench cluster: --redis takes HOST:PORT\n";
      return 2;
    }
  } else {
    redis = bench::start_redis_server(&port);
    if (redis < 0) {
      std::cerr
          << "dpukv bench cluster: no redis-server to start (give --redis or --no-directory)\n";
      return 1;
    }
  }
  int rc = 1;
  redisContext* sync = nullptr;
  for (int i = 0; i < 300 && sync == nullptr; ++i) {
    sync = redisConnect(host.c_str(), port);
    if (sync != nullptr && sync->err) {
      redisFree(sync);
      sync = nullptr;
      usleep(10000);
    }
  }
  std::unique_ptr<ProgressEngine> pe;
  std::unique_ptr<Directory> a, b, c2;  // publisher; reader with a replica; reader without
  DirectoryOptions o;
  o.host = host;
  o.port = port;
  o.prefix = "dpukv-bench-" + std::to_string(getpid());
  std::vector<ChunkKey> keys;
  for (uint64_t i = 0; i < 64; ++i) keys.push_back(key_from_block_id(KeyContext{9, 1, 0, 1}, i));
  std::vector<double> ping, look, look_redis, mget, propagate;
  std::vector<std::string> redis_keys;
  std::vector<const char*> mget_argv;
  std::vector<size_t> mget_len;
  if (sync == nullptr || !ProgressEngine::create(&pe).ok()) goto out;
  o.node_id = 1;
  if (!Directory::create(pe.get(), o, &a).ok() || !a->start().ok()) goto out;
  o.node_id = 2;
  if (!Directory::create(pe.get(), o, &b).ok() || !b->start().ok()) goto out;
  o.node_id = 3;
  o.replicate = false;
  if (!Directory::create(pe.get(), o, &c2).ok() || !c2->start().ok()) goto out;
  for (int i = 0; i < 100000 && !(a->connected() && b->replica_ready() && c2->connected()); ++i)
    pe->wait(1000, 1);
  if (!a->connected() || !b->replica_ready() || !c2->connected()) goto out;
  for (const ChunkKey& k : keys) a->add(k);
  {  // Published, and a seen live by both readers (their live sets refresh each second).
    const uint64_t give_up = bench::now_ns() + 30'000'000'000ull;
    double unused = 0;
    while (!(time_lookup(pe.get(), b.get(), keys, &unused, true) &&
             time_lookup(pe.get(), c2.get(), keys, &unused, true))) {
      if (bench::now_ns() > give_up) {
        std::cerr << "dpukv bench cluster: the directory did not show the 64 keys in 30 s\n";
        goto out;
      }
      for (int i = 0; i < 10; ++i) pe->wait(1000, 1);
    }
  }
  {  // The Redis keys the directory wrote, for the plain MGET below.
    auto* reply = static_cast<redisReply*>(redisCommand(sync, "KEYS %s:c:*", o.prefix.c_str()));
    if (reply == nullptr) goto out;
    if (reply->type == REDIS_REPLY_ARRAY)
      for (size_t i = 0; i < reply->elements; ++i)
        redis_keys.emplace_back(reply->element[i]->str, reply->element[i]->len);
    freeReplyObject(reply);
    if (redis_keys.size() != keys.size()) {
      std::cerr << "dpukv bench cluster: the directory wrote " << redis_keys.size()
                << " keys, not 64\n";
      goto out;
    }
    mget_argv.push_back("MGET");
    mget_len.push_back(4);
    for (const std::string& k : redis_keys) {
      mget_argv.push_back(k.data());
      mget_len.push_back(k.size());
    }
  }
  for (int r = 0; r < 201; ++r) {
    uint64_t t0 = bench::now_ns();
    auto* reply = static_cast<redisReply*>(redisCommand(sync, "PING"));
    if (reply == nullptr) goto out;
    freeReplyObject(reply);
    if (r > 0) ping.push_back((bench::now_ns() - t0) / 1e9);
    t0 = bench::now_ns();
    reply = static_cast<redisReply*>(redisCommandArgv(sync, static_cast<int>(mget_argv.size()),
                                                      mget_argv.data(), mget_len.data()));
    if (reply == nullptr) goto out;
    freeReplyObject(reply);
    if (r > 0) mget.push_back((bench::now_ns() - t0) / 1e9);
    double seconds = 0;
    if (!time_lookup(pe.get(), b.get(), keys, &seconds)) goto out;
    if (r > 0) look.push_back(seconds);
    if (!time_lookup(pe.get(), c2.get(), keys, &seconds)) goto out;
    if (r > 0) look_redis.push_back(seconds);
    // Propagation: a new chunk on a until b's replica has it.
    const size_t before = b->replica_keys();
    t0 = bench::now_ns();
    a->add(key_from_block_id(KeyContext{9, 1, 0, 1}, 1000 + static_cast<uint64_t>(r)));
    for (int i = 0; i < 10000000 && b->replica_keys() == before; ++i) pe->progress();
    if (b->replica_keys() == before) goto out;
    if (r > 0) propagate.push_back((bench::now_ns() - t0) / 1e9);
  }
  {
    const double l = bench::median(look), p = bench::median(ping), lr = bench::median(look_redis),
                 pr = bench::median(propagate);
    const char* ping_base = "one Redis round trip (PING)";
    rows->push_back(bench::compared({{"bench", "cluster"},
                                     {"op", "directory_lookup"},
                                     {"keys", 64},
                                     {"replica", true},
                                     {"seconds", l}},
                                    ping_base, "seconds", l, p));
    rows->push_back(bench::compared({{"bench", "cluster"},
                                     {"op", "directory_lookup"},
                                     {"keys", 64},
                                     {"replica", false},
                                     {"seconds", lr}},
                                    ping_base, "seconds", lr, p));
    rows->push_back(
        bench::compared({{"bench", "cluster"}, {"op", "directory_propagation"}, {"seconds", pr}},
                        ping_base, "seconds", pr, p));
    // The floor: the same keys read by one plain MGET on a blocking connection.
    const double m = bench::median(mget);
    rows->push_back(bench::compared(
        {{"bench", "cluster"}, {"op", "directory_mget_floor"}, {"keys", 64}, {"seconds", m}},
        ping_base, "seconds", m, p));
    if (!c.out.json) {
      std::printf(
          "directory_lookup 64 keys %8.1f us   one Redis round trip %8.1f us   ratio %5.2f"
          "   (from the replica)\n",
          l * 1e6, p * 1e6, l / p);
      std::printf(
          "directory_lookup 64 keys %8.1f us   one Redis round trip %8.1f us   ratio %5.2f"
          "   (asking Redis: one MGET)\n",
          lr * 1e6, p * 1e6, lr / p);
      std::printf(
          "directory_propagation    %8.1f us   one Redis round trip %8.1f us   ratio %5.2f"
          "   (a new chunk until another node's replica has it)\n",
          pr * 1e6, p * 1e6, pr / p);
      std::printf(
          "plain MGET of 64 keys    %8.1f us   one Redis round trip %8.1f us   ratio %5.2f\n",
          m * 1e6, p * 1e6, m / p);
    }
    rc = 0;
  }
out:
  for (Directory* d : {a.get(), b.get(), c2.get()})
    if (d != nullptr) {
      (void)d->stop();
      for (int i = 0; i < 100000 && d->state() != CtxState::kIdle; ++i) pe->progress();
    }
  a.reset();
  b.reset();
  c2.reset();
  if (sync != nullptr) redisFree(sync);
  if (redis > 0) {
    (void)signal_child(redis, SIGKILL);
    (void)reap_child(redis, nullptr);
  }
  if (rc != 0) std::cerr << "dpukv bench cluster: directory measurement failed\n";
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
    if (t != "tcp" && t != "shm" && t != "netns") {
      std::cerr << "dpukv bench cluster: --transports takes tcp, shm and netns\n";
      return 2;
    }
    if (t == "netns" && geteuid() != 0) {
      std::cerr << "dpukv bench cluster: netns skipped (network namespaces need root)\n";
    } else if (measure(c, t, bytes, &rows) != 0) {
      return 1;
    }
    start = comma + 1;
  }
  if (!c.no_directory)
    if (int rc = measure_directory(c, &rows); rc != 0) return rc;
  if (!c.no_pd)
    if (int rc = measure_cluster_pd(c.pd_chunks, c.reps, c.out.json, &rows); rc != 0) return rc;
  if (c.out.json)
    bench::print_json("cluster", rows);
  else
    bench::print_machine_line();
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
  cmd->add_option("--transports", c->transports,
                  "Comma-separated: tcp (loopback), shm, netns (two network namespaces over "
                  "veth; root only, skipped otherwise)")
      ->capture_default_str();
  cmd->add_option("--redis", c->redis,
                  "Redis for the directory measurement, HOST:PORT (default: start redis-server)");
  cmd->add_flag("--no-directory", c->no_directory, "Skip the directory measurement");
  cmd->add_flag("--no-pd", c->no_pd, "Skip the prefill-to-decode transfer measurement");
  cmd->add_option("--pd-chunks", c->pd_chunks, "256 KiB chunks per prefill-to-decode transfer")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  bench::add_output_options(cmd, &c->out);
  cmd->callback([c, exit_code] { *exit_code = run(*c); });
}

}  // namespace dpukv
