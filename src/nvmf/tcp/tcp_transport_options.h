// The NVMe/TCP transport's options (nvmf_create_transport's TCP fields): what the
// target's TCP queues (tcp_connection.h) are given, and what the target checks
// when they are set.
#pragma once

#include <cstdint>

namespace dpukv::nvme {

struct TcpTransportOptions {
  uint32_t in_capsule_data_size = 8192;
  uint32_t max_io_size = 128 * 1024;  // MDTS (4 KiB pages): 2^5
  uint32_t max_h2c_data = 128 * 1024;
  uint16_t max_queue_depth = 128;
  uint16_t max_io_queues = 8;
  uint32_t keep_alive_grace_ms = 1000;  // beyond the host's KATO before a controller is torn down
  bool c2h_success = true;              // C2HData with SUCCESS instead of a response capsule
  int cpu = -1;                         // pin the poll-group thread
  // A connection that has not sent its ICReq by then is closed: a silent peer holds
  // a socket and a receive buffer, and nothing else ever times it out.
  uint32_t icreq_timeout_ms = 10000;
  // After its ICReq, a connection must send a Fabrics Connect within this: until
  // then it holds a socket and a buffer for nothing.
  uint32_t connect_timeout_ms = 10000;
  // Once a PDU's header has arrived, the rest of it must within this (a host that
  // sends half a capsule and stops is closed, not waited for).
  uint32_t pdu_timeout_ms = 10000;
  // An association whose host asked for no keep alive (KATO 0) ends after this
  // long without a command, as SPDK's discovery controllers do after 2 minutes.
  uint32_t no_kato_timeout_ms = 120000;
  // Connections one listener keeps at once; more are accepted and closed at once.
  // A host opens one per queue (an admin queue and up to max_io_queues).
  uint32_t max_connections_per_listener = 1024;
};

}  // namespace dpukv::nvme
