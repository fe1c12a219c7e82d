// `nvme perf`'s tcp baseline: a raw TCP ping-pong of the same sizes and queue depth
// as the NVMe/TCP run. Each request is an 8-byte header {request bytes, response
// bytes} and the request bytes; the server answers with the response bytes. The
// server busy polls like the target's poll group (and sleeps when idle, since it
// shares a CPU with the target).
#pragma once

#include <cstdint>
#include <string>

namespace dpukv {

// Serves one connection on 127.0.0.1 (an ephemeral port, written to port_file
// once listening), pinned to cpu (-1: not pinned), until the peer closes: 0, or 1
// on an error.
int run_pingpong_server(const std::string& port_file, int cpu);

struct PingPong {
  double iops = 0, p50 = 0;  // p50 in microseconds; all 0 if the connection failed
};
// qd requests in flight for `seconds`, each `req` bytes out and `resp` bytes back.
PingPong pingpong(int fd, uint32_t req, uint32_t resp, uint32_t qd, double seconds);

}  // namespace dpukv
