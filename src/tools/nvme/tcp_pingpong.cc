#include "tools/nvme/tcp_pingpong.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "tools/common/bench_common.h"

namespace dpukv {

int run_pingpong_server(const std::string& port_file, int cpu) {
  if (cpu >= 0) bench::pin_current_thread(cpu);
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof sa;
  if (lfd < 0 || bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      listen(lfd, 4) != 0 || getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &sl) != 0)
    return 1;
  {
    std::ofstream f(port_file + ".tmp");
    f << ntohs(sa.sin_port) << "\n";
  }
  std::filesystem::rename(port_file + ".tmp", port_file);
  int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return 1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<uint8_t> in(4u << 20), out(4u << 20, 0x5a);
  size_t have = 0;
  uint64_t last = bench::now_ns();
  for (;;) {
    ssize_t n = recv(fd, in.data() + have, in.size() - have, MSG_DONTWAIT);
    if (n == 0) return 0;
    if (n < 0) {
      if (errno != EAGAIN) return 1;
      // Spin while busy, sleep when idle: it shares a CPU with the target.
      if (bench::now_ns() - last > 1'000'000) {
        pollfd pf{fd, POLLIN, 0};
        ::poll(&pf, 1, 100);
      }
      continue;
    }
    last = bench::now_ns();
    have += static_cast<size_t>(n);
    size_t pos = 0, reply = 0;
    while (have - pos >= 8) {
      uint32_t req, resp;
      std::memcpy(&req, in.data() + pos, 4);
      std::memcpy(&resp, in.data() + pos + 4, 4);
      if (have - pos < 8 + size_t{req}) break;
      pos += 8 + req;
      reply += resp;
    }
    std::memmove(in.data(), in.data() + pos, have - pos);
    have -= pos;
    while (reply > 0) {  // one send for everything this pass answered
      ssize_t k = send(fd, out.data(), std::min(reply, out.size()), MSG_NOSIGNAL);
      if (k <= 0) return 1;
      reply -= static_cast<size_t>(k);
    }
  }
}

PingPong pingpong(int fd, uint32_t req, uint32_t resp, uint32_t qd, double seconds) {
  std::vector<uint8_t> msg(8 + req, 0x5a);
  std::memcpy(msg.data(), &req, 4);
  std::memcpy(msg.data() + 4, &resp, 4);
  std::vector<uint8_t> in(1u << 20);
  std::vector<uint64_t> sent;
  sent.reserve(1u << 20);
  bench::LatencyRecorder lat;
  size_t head = 0;
  // Like the NVMe/TCP host: requests answered in one receive go out again in one send.
  std::vector<uint8_t> batch;
  auto queue_one = [&] {
    sent.push_back(bench::now_ns());
    batch.insert(batch.end(), msg.begin(), msg.end());
  };
  auto flush = [&] {
    for (size_t off = 0; off < batch.size();) {
      ssize_t k = send(fd, batch.data() + off, batch.size() - off, MSG_NOSIGNAL);
      if (k <= 0) return false;
      off += static_cast<size_t>(k);
    }
    batch.clear();
    return true;
  };
  for (uint32_t i = 0; i < qd; ++i) queue_one();
  if (!flush()) return {};
  uint64_t t0 = bench::now_ns(), end = t0 + static_cast<uint64_t>(seconds * 1e9), got = 0, done = 0;
  while (head < sent.size()) {
    ssize_t n = recv(fd, in.data(), in.size(), MSG_DONTWAIT);
    if (n == 0) return {};
    if (n < 0) continue;
    got += static_cast<uint64_t>(n);
    uint64_t now = bench::now_ns();
    while (got >= resp && head < sent.size()) {
      got -= resp;
      lat.add(now - sent[head++]);
      ++done;
      if (now < end) queue_one();
    }
    if (!flush()) return {};
  }
  lat.finish();
  return PingPong{static_cast<double>(done) / (static_cast<double>(bench::now_ns() - t0) / 1e9),
                  lat.percentile_us(50)};
}

}  // namespace dpukv
