#include "tools/bench/comch.h"

#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <deque>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "comch/client.h"
#include "comch/server.h"
#include "runtime/buf.h"
#include "runtime/child_process.h"
#include "runtime/copy_routines.h"
#include "runtime/log.h"
#include "runtime/mem_region.h"
#include "tools/common/bench_common.h"

namespace dpukv {
namespace {

using bench::Json;

// Waits for work the way a sleeping owner thread does: arm, re-check, epoll_wait.
void wait_once(ProgressEngine* pe, int timeout_ms) {
  if (pe->progress()) return;
  (void)pe->request_notification();
  epoll_event ev;
  (void)epoll_wait(pe->notification_handle(), &ev, 1, timeout_ms);
  (void)pe->clear_notification();
  pe->progress();
}

enum class Mode { kSpin, kSleep };

void pump(ProgressEngine* pe, Mode m) {
  if (m == Mode::kSpin)
    pe->progress();
  else
    wait_once(pe, 100);
}

// ---------------------------------------------------------------- peer side

struct Peer {
  std::unique_ptr<ProgressEngine> pe;
  std::unique_ptr<ComchServer> srv;
  std::unique_ptr<MemRegion> mem;
  std::unique_ptr<Mmap> map;
  std::unique_ptr<BufInventory> inv;
  FastPathConsumer* consumer = nullptr;
  uint64_t host_consumer = 0;
  Mode mode = Mode::kSleep;
  bool bulk = false;
  struct Echo {
    Buf* buf;
    uint8_t imm[kMaxImmData];
    uint32_t imm_len;
  };
  std::deque<Echo> echoes;  // received fast-path messages waiting to go back
};
Peer* gp = nullptr;

void peer_recv(ComchConnection* c, const uint8_t* d, uint32_t n, UserData) {
  if (n >= 1 && d[0] == 'M') {  // mode switch: Mspin, Msleep, Mbulk
    std::string m(reinterpret_cast<const char*>(d), n);
    gp->mode = m == "Msleep" ? Mode::kSleep : Mode::kSpin;
    gp->bulk = m == "Mbulk";
  }
  if (n >= 1 && d[0] == 'O') return;  // one-way traffic is not echoed
  ComchSendTask* t;
  if (gp->srv->send_alloc_init(c, d, n, UserData{}, &t).ok() && !gp->srv->submit(t).ok())
    (void)gp->srv->free(t);
}

void peer_consumer_new(ComchConnection* c, uint64_t id, UserData) {
  gp->host_consumer = id;
  if (gp->consumer != nullptr) return;
  // Our consumer: 32 buffers of 1 MiB, enough for the bulk test.
  if (!gp->srv->create_consumer(c, gp->map.get(), 32, &gp->consumer).ok()) return;
  for (int i = 0; i < 32; ++i) {
    Buf* b;
    if (gp->inv
            ->get_by_addr(gp->map.get(), gp->map->addr() + (static_cast<size_t>(i) << 20), 1 << 20,
                          &b)
            .ok())
      (void)gp->consumer->post_recv(b, UserData{});
  }
}

void peer_fp_recv(FastPathConsumer* fc, Buf* b, const uint8_t* imm, uint32_t imm_len, Status st,
                  UserData, UserData) {
  if (!st.ok()) {
    (void)b->dec_refcount();
    return;
  }
  if (gp->bulk) {
    b->reset_data();
    (void)fc->post_recv(b, UserData{});
    return;
  }
  Peer::Echo e{b, {}, imm_len};
  std::memcpy(e.imm, imm, imm_len);
  gp->echoes.push_back(e);
}

void peer_send_done(ComchSendTask* t, UserData, UserData) {
  (void)gp->srv->free(t);
}

int run_peer(const std::string& path, int cpu) {
  if (cpu >= 0) bench::pin_current_thread(cpu);
  Peer p;
  gp = &p;
  ComchServerOptions o;
  o.path = path;
  o.max_msg_size = comch::kMaxMsgLimit;
  if (!ProgressEngine::create(&p.pe).ok() || !ComchServer::create(p.pe.get(), o, &p.srv).ok() ||
      !MemRegion::create(32 << 20, MemRegionOptions{}, &p.mem).ok() ||
      !Mmap::create(p.mem->data(), p.mem->size(), kAccessLocalReadWrite | kAccessExportReadWrite,
                    p.mem->fd(), 0, &p.map)
           .ok() ||
      !p.map->start().ok() || !BufInventory::create(64, &p.inv).ok())
    return 1;
  ComchCallbacks cb;
  cb.on_recv = peer_recv;
  cb.on_consumer_new = peer_consumer_new;
  cb.on_fp_recv = peer_fp_recv;
  cb.on_send_done = peer_send_done;
  cb.on_send_error = peer_send_done;
  cb.on_disconnect = [](ComchConnection*, Status, UserData) { _exit(0); };
  if (!p.srv->set_callbacks(cb).ok() || !p.srv->set_send_conf(1024).ok() || !p.srv->start().ok())
    return 1;
  for (;;) {
    pump(p.pe.get(), p.mode);
    while (!p.echoes.empty() && p.consumer != nullptr) {
      Peer::Echo& e = p.echoes.front();
      Status st =
          p.srv->producer_send(p.consumer->connection(), p.host_consumer, e.buf, e.imm, e.imm_len);
      if (st == Code::kAgain) break;
      e.buf->reset_data();
      (void)p.consumer->post_recv(e.buf, UserData{});
      p.echoes.pop_front();
    }
  }
}

// The raw-socket baseline peer: echoes every record except one-way ('O') ones.
int run_raw_peer(int cpu) {
  if (cpu >= 0) bench::pin_current_thread(cpu);
  std::vector<uint8_t> buf(1 << 17);
  for (;;) {
    ssize_t n = recv(3, buf.data(), buf.size(), 0);
    if (n <= 0) return 0;
    if (buf[0] == 'O') continue;
    if (send(3, buf.data(), static_cast<size_t>(n), MSG_NOSIGNAL) != n) return 0;
  }
}

// ---------------------------------------------------------------- host side

struct Config {
  std::string sizes = "64,256,1K,4K";
  uint32_t iterations = 5000;
  uint32_t oneway_messages = 50000;
  std::string placement = "cross-core";
  std::string bulk_size = "1M";
  double bulk_seconds = 1.0;
  bench::OutputOptions out;
};

struct Host {
  std::unique_ptr<ProgressEngine> pe;
  std::unique_ptr<ComchClient> cl;
  std::unique_ptr<MemRegion> mem;  // consumer buffers + send staging
  std::unique_ptr<Mmap> map;
  std::unique_ptr<BufInventory> inv;
  FastPathConsumer* consumer = nullptr;
  uint64_t peer_consumer = 0;
  uint64_t rx = 0;     // control messages received
  uint64_t fp_rx = 0;  // fast-path messages received
  bool gone = false;
};
Host* gh = nullptr;

Status host_send(const void* d, uint32_t n) {
  ComchSendTask* t;
  Status st;
  while ((st = gh->cl->send_alloc_init(gh->cl->connection(), d, n, UserData{}, &t)) ==
         Code::kNoMemory)
    gh->pe->progress();
  if (!st.ok()) return st;
  while ((st = gh->cl->submit(t)) == Code::kAgain) gh->pe->progress();
  if (!st.ok()) (void)gh->cl->free(t);
  return st;
}

bool wait_until(const std::function<bool()>& pred, Mode m) {
  for (uint64_t i = 0; !pred(); ++i) {
    if (gh->gone) return false;
    pump(gh->pe.get(), m);
  }
  return true;
}

struct RttResult {
  bench::LatencyRecorder lat{1u << 20};
};

Json rtt_row(const std::string& path, uint64_t size, RttResult& r, RttResult& base,
             const std::string& placement) {
  r.lat.finish();
  base.lat.finish();
  Json row;
  row["bench"] = "comch";
  row["path"] = path;
  row["size_bytes"] = size;
  row["placement"] = placement;
  row["rtt_p50_us"] = r.lat.percentile_us(50);
  row["rtt_p99_us"] = r.lat.percentile_us(99);
  row["rtt_p999_us"] = r.lat.percentile_us(99.9);
  row["baseline_rtt_p99_us"] = base.lat.percentile_us(99);
  return bench::compared(std::move(row), "raw UNIX SOCK_SEQPACKET ping-pong, blocking",
                         "rtt_p50_us", r.lat.percentile_us(50), base.lat.percentile_us(50));
}

void raw_rtt(int sock, uint64_t size, uint32_t iters, RttResult* r) {
  std::vector<uint8_t> buf(size, 'P'), in(size + 16);
  for (uint32_t i = 0; i < iters + iters / 10; ++i) {
    uint64_t t0 = bench::now_ns();
    (void)!send(sock, buf.data(), size, MSG_NOSIGNAL);
    (void)!recv(sock, in.data(), in.size(), 0);
    if (i >= iters / 10) r->lat.add(bench::now_ns() - t0);
  }
}

double raw_oneway(int sock, uint64_t size, uint32_t n) {
  std::vector<uint8_t> buf(size, 'O'), in(size + 16);
  uint64_t t0 = bench::now_ns();
  for (uint32_t i = 0; i < n; ++i) (void)!send(sock, buf.data(), size, MSG_NOSIGNAL);
  buf[0] = 'P';
  (void)!send(sock, buf.data(), size, MSG_NOSIGNAL);
  (void)!recv(sock, in.data(), in.size(), 0);
  return n / ((bench::now_ns() - t0) / 1e9);
}

void print_row(const Json& r) {
  if (r.contains("gbps")) {
    std::printf("%-15s %7s %10.2f GB/s   memcpy %7.2f GB/s   ratio %5.2f\n",
                r["path"].get<std::string>().c_str(),
                bench::format_size(r["size_bytes"].get<uint64_t>()).c_str(),
                r["gbps"].get<double>(), r["baseline_gbps"].get<double>(),
                r["ratio"].get<double>());
  } else if (r.contains("msgs_per_s")) {
    std::printf("%-15s %7s %10.0f msg/s  raw socket %10.0f msg/s  ratio %5.2f\n",
                r["path"].get<std::string>().c_str(),
                bench::format_size(r["size_bytes"].get<uint64_t>()).c_str(),
                r["msgs_per_s"].get<double>(), r["baseline_msgs_per_s"].get<double>(),
                r["ratio"].get<double>());
  } else {
    std::printf(
        "%-15s %7s  p50 %8.2f  p99 %8.2f  p99.9 %8.2f us   raw socket p50 %8.2f us   ratio %5.2f\n",
        r["path"].get<std::string>().c_str(),
        bench::format_size(r["size_bytes"].get<uint64_t>()).c_str(), r["rtt_p50_us"].get<double>(),
        r["rtt_p99_us"].get<double>(), r["rtt_p999_us"].get<double>(),
        r["baseline_rtt_p50_us"].get<double>(), r["ratio"].get<double>());
  }
  std::fflush(stdout);
}

int run(const Config& c) {
  std::vector<uint64_t> sizes;
  uint64_t bulk = 0;
  if (!bench::parse_size_list(c.sizes, &sizes).ok() ||
      !bench::parse_size(c.bulk_size, &bulk).ok() || bulk == 0 || bulk > (1 << 20)) {
    std::cerr << "dpukv bench comch: bad --sizes or --bulk-size (bulk at most 1M)\n";
    return 2;
  }
  for (uint64_t s : sizes)
    if (s > 65536 - 16) {
      std::cerr << "dpukv bench comch: sizes must be at most 64K - 16\n";
      return 2;
    }
  const int ncpu = bench::num_cpus();
  int host_cpu = -1, peer_cpu = -1;
  std::string placement = "unpinned";
  if (c.placement == "cross-core" && ncpu >= 2) {
    host_cpu = 0, peer_cpu = 1;
    placement = "host on cpu 0, peer on cpu 1";
  } else if (c.placement == "same-core") {
    host_cpu = peer_cpu = 0;
    placement = "host and peer on cpu 0";
  }
  if (host_cpu >= 0) bench::pin_current_thread(host_cpu);
  signal(SIGPIPE, SIG_IGN);

  const std::string path = "@dpukv-bench-comch-" + std::to_string(getpid());
  pid_t peer = bench::spawn_self(
      {"bench", "comch-peer", "--path", path, "--cpu", std::to_string(peer_cpu)}, -1);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return 1;
  pid_t raw =
      bench::spawn_self({"bench", "comch-raw-peer", "--cpu", std::to_string(peer_cpu)}, sv[1]);
  close(sv[1]);
  const int rawfd = sv[0];
  auto reap = [&] {
    close(rawfd);
    if (peer > 0) signal_child(peer, SIGTERM), reap_child(peer, nullptr);
    if (raw > 0) reap_child(raw, nullptr);
  };
  if (peer < 0 || raw < 0) {
    std::cerr << "dpukv bench comch: cannot start the peer processes\n";
    reap();
    return 1;
  }

  Host h;
  gh = &h;
  ComchClientOptions o;
  o.path = path;
  o.max_msg_size = comch::kMaxMsgLimit;
  o.connect_timeout_ms = 5000;
  ComchCallbacks cb;
  cb.on_recv = [](ComchConnection*, const uint8_t*, uint32_t, UserData) { ++gh->rx; };
  cb.on_disconnect = [](ComchConnection*, Status, UserData) { gh->gone = true; };
  cb.on_consumer_new = [](ComchConnection*, uint64_t id, UserData) { gh->peer_consumer = id; };
  cb.on_fp_recv = [](FastPathConsumer* fc, Buf* b, const uint8_t*, uint32_t, Status st, UserData,
                     UserData) {
    if (!st.ok()) {
      (void)b->dec_refcount();
      return;
    }
    ++gh->fp_rx;
    b->reset_data();
    (void)fc->post_recv(b, UserData{});
  };
  cb.on_send_done = [](ComchSendTask* t, UserData, UserData) { (void)gh->cl->free(t); };
  cb.on_send_error = cb.on_send_done;
  // Host memory: 32 x 64 KiB receive buffers, then a 256 MiB bulk source pool.
  const size_t kRecv = 2 << 20, kPool = 256 << 20;
  if (!ProgressEngine::create(&h.pe).ok() || !ComchClient::create(h.pe.get(), o, &h.cl).ok() ||
      !h.cl->set_callbacks(cb).ok() || !h.cl->set_send_conf(1024).ok() ||
      !MemRegion::create(kRecv + kPool, MemRegionOptions{}, &h.mem).ok() ||
      !Mmap::create(h.mem->data(), h.mem->size(), kAccessLocalReadWrite | kAccessExportReadWrite,
                    h.mem->fd(), 0, &h.map)
           .ok() ||
      !h.map->start().ok() || !BufInventory::create(256, &h.inv).ok() ||
      h.cl->start() != Code::kInProgress) {
    std::cerr << "dpukv bench comch: setup failed\n";
    reap();
    return 1;
  }
  while (h.cl->state() == CtxState::kStarting) wait_once(h.pe.get(), 50);
  if (h.cl->state() != CtxState::kRunning) {
    std::cerr << "dpukv bench comch: cannot connect to the peer: " << h.cl->last_error().name()
              << "\n";
    reap();
    return 1;
  }
  ComchConnection* conn = h.cl->connection();
  std::vector<Json> rows;
  if (!c.out.json)
    std::printf("dpukv bench comch: %s; control path waits in epoll, raw baseline blocks in recv\n",
                placement.c_str());

  auto mode_switch = [&](const char* m) {
    uint64_t before = h.rx;
    (void)host_send(m, static_cast<uint32_t>(std::strlen(m)));
    return wait_until([&] { return h.rx > before; }, Mode::kSpin);
  };

  // Control path round trips, sleeping in epoll like the blocking baseline.
  (void)mode_switch("Msleep");
  std::vector<uint8_t> msg(65536, 'P');
  for (uint64_t size : sizes) {
    RttResult r, base;
    for (uint32_t i = 0; i < c.iterations + c.iterations / 10 && !h.gone; ++i) {
      uint64_t before = h.rx, t0 = bench::now_ns();
      if (!host_send(msg.data(), static_cast<uint32_t>(size)).ok()) break;
      wait_until([&] { return h.rx > before; }, Mode::kSleep);
      if (i >= c.iterations / 10) r.lat.add(bench::now_ns() - t0);
    }
    raw_rtt(rawfd, size, c.iterations, &base);
    rows.push_back(rtt_row("control", size, r, base, placement));
    if (!c.out.json) print_row(rows.back());
  }
  // Control path one-way rate.
  for (uint64_t size : {sizes.front(), sizes.back()}) {
    std::vector<uint8_t> ow(size, 'O');
    uint64_t before = h.rx, t0 = bench::now_ns();
    for (uint32_t i = 0; i < c.oneway_messages && !h.gone; ++i)
      (void)host_send(ow.data(), static_cast<uint32_t>(size));
    (void)host_send(msg.data(), static_cast<uint32_t>(size));
    wait_until([&] { return h.rx > before; }, Mode::kSpin);
    double rate = c.oneway_messages / ((bench::now_ns() - t0) / 1e9);
    double base = raw_oneway(rawfd, size, c.oneway_messages);
    Json row;
    row["bench"] = "comch";
    row["path"] = "control-oneway";
    row["size_bytes"] = size;
    row["placement"] = placement;
    row["msgs_per_s"] = rate;
    rows.push_back(bench::compared(std::move(row), "raw UNIX SOCK_SEQPACKET send loop",
                                   "msgs_per_s", rate, base));
    if (!c.out.json) print_row(rows.back());
  }

  // Fast path: our consumer (32 x 64 KiB), then wait for the peer's.
  if (!h.cl->create_consumer(conn, h.map.get(), 32, &h.consumer).ok()) {
    std::cerr << "dpukv bench comch: cannot create the fast-path consumer\n";
    reap();
    return 1;
  }
  for (int i = 0; i < 32; ++i) {
    Buf* b;
    if (h.inv->get_by_addr(h.map.get(), h.map->addr() + i * 65536, 65536, &b).ok())
      (void)h.consumer->post_recv(b, UserData{});
  }
  wait_until([&] { return h.peer_consumer != 0; }, Mode::kSpin);
  uint8_t* src = h.map->addr() + kRecv;
  for (Mode m : {Mode::kSpin, Mode::kSleep}) {
    (void)mode_switch(m == Mode::kSpin ? "Mspin" : "Msleep");
    for (uint64_t size : sizes) {
      RttResult r, base;
      Buf* b;
      if (!h.inv->get_by_data(h.map.get(), src, size, &b).ok()) break;
      for (uint32_t i = 0; i < c.iterations + c.iterations / 10 && !h.gone; ++i) {
        uint64_t before = h.fp_rx, t0 = bench::now_ns();
        Status st;
        while ((st = h.cl->producer_send(conn, h.peer_consumer, b, &i, sizeof(i))) == Code::kAgain)
          h.pe->progress();
        if (!st.ok()) break;
        wait_until([&] { return h.fp_rx > before; }, m);
        if (i >= c.iterations / 10) r.lat.add(bench::now_ns() - t0);
      }
      (void)b->dec_refcount();
      raw_rtt(rawfd, size, c.iterations, &base);
      rows.push_back(
          rtt_row(m == Mode::kSpin ? "fast-spin" : "fast-sleep", size, r, base, placement));
      if (!c.out.json) print_row(rows.back());
    }
  }
  // Fast-path bulk: one-way 1 MiB messages from a cold 256 MiB pool.
  (void)mode_switch("Mbulk");
  {
    const uint64_t slots = kPool / bulk;
    uint64_t sent = 0, k = 0;
    const uint64_t t0 = bench::now_ns();
    const uint64_t end = t0 + static_cast<uint64_t>(c.bulk_seconds * 1e9);
    uint64_t t1 = t0;
    while ((t1 = bench::now_ns()) < end && !h.gone) {
      Buf* b;
      if (!h.inv->get_by_data(h.map.get(), src + (k % slots) * bulk, bulk, &b).ok()) break;
      Status st;
      while ((st = h.cl->producer_send(conn, h.peer_consumer, b, nullptr, 0)) == Code::kAgain) {
      }
      (void)b->dec_refcount();
      if (!st.ok()) break;
      ++sent, ++k;
    }
    double gbps = sent * bulk / ((t1 - t0) / 1e9) / 1e9;
    // Baseline: one thread memcpy of the same source rotation into a 32-slot ring,
    // the shape of the peer's posted buffers.
    std::vector<uint8_t> dst(32 * bulk);
    uint64_t n = 0;
    const uint64_t b0 = bench::now_ns();
    const uint64_t bend = b0 + static_cast<uint64_t>(c.bulk_seconds * 1e9);
    uint64_t b1 = b0;
    while ((b1 = bench::now_ns()) < bend) {
      std::memcpy(dst.data() + (n % 32) * bulk, src + (n % slots) * bulk, bulk);
      ++n;
    }
    double base = n * bulk / ((b1 - b0) / 1e9) / 1e9;
    Json row;
    row["bench"] = "comch";
    row["path"] = "fast-bulk";
    row["size_bytes"] = bulk;
    row["placement"] = placement;
    row["gbps"] = gbps;
    rows.push_back(bench::compared(std::move(row), "memcpy", "gbps", gbps, base));
    if (!c.out.json) print_row(rows.back());
  }
  const bool ok = !h.gone;
  (void)h.cl->stop();
  while (h.cl->state() != CtxState::kIdle) h.pe->progress();
  (void)h.map->stop();
  reap();
  if (!ok) std::cerr << "dpukv bench comch: the peer went away mid-run\n";
  if (c.out.json)
    bench::print_json("comch", rows);
  else
    bench::print_machine_line();
  if (!bench::write_csv(c.out, rows)) return 1;
  return ok ? 0 : 1;
}

}  // namespace

void add_bench_comch_command(CLI::App* bench, int* exit_code) {
  auto c = std::make_shared<Config>();
  CLI::App* cmd = bench->add_subcommand(
      "comch", "Benchmark the control channel: round trips, one-way rate, fast-path bulk");
  cmd->add_option("--sizes", c->sizes, "Message sizes (at most 64K-16), K suffix")
      ->capture_default_str();
  cmd->add_option("--iterations", c->iterations, "Round trips per size and path")
      ->capture_default_str()
      ->check(CLI::Range(10u, 10000000u));
  cmd->add_option("--oneway-messages", c->oneway_messages, "Messages per one-way measurement")
      ->capture_default_str();
  cmd->add_option("--placement", c->placement, "cross-core, same-core or unpinned")
      ->capture_default_str()
      ->check(CLI::IsMember({"cross-core", "same-core", "unpinned"}));
  cmd->add_option("--bulk-size", c->bulk_size, "Fast-path bulk message size (at most 1M)")
      ->capture_default_str();
  cmd->add_option("--bulk-seconds", c->bulk_seconds, "Seconds of bulk transfer")
      ->capture_default_str();
  bench::add_output_options(cmd, &c->out);
  cmd->callback([c, exit_code] { *exit_code = run(*c); });

  auto path = std::make_shared<std::string>();
  auto cpu = std::make_shared<int>(-1);
  CLI::App* peer = bench->add_subcommand("comch-peer", "");
  peer->group("");
  peer->add_option("--path", *path)->required();
  peer->add_option("--cpu", *cpu);
  peer->callback([path, cpu, exit_code] { *exit_code = run_peer(*path, *cpu); });
  auto rcpu = std::make_shared<int>(-1);
  CLI::App* rawp = bench->add_subcommand("comch-raw-peer", "");
  rawp->group("");
  rawp->add_option("--cpu", *rcpu);
  rawp->callback([rcpu, exit_code] { *exit_code = run_raw_peer(*rcpu); });
}

}  // namespace dpukv
