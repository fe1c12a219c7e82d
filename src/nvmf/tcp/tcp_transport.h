// The NVMe/TCP transport: listening sockets (one per address and port, shared by
// the subsystems that listen there) and every queue pair's connection. A poller
// of the target's poll group: it accepts, sends what its connections queued,
// reaps the closed ones and enforces the deadlines of a host that stalls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nvmf/core/target_side.h"
#include "nvmf/core/transport.h"
#include "nvmf/tcp/tcp_transport_options.h"

namespace dpukv::nvme {

class TcpConnection;

class TcpTransport final : public Transport {
 public:
  TcpTransport(TargetSide* target, PollGroup* group, const TcpTransportOptions& o);
  ~TcpTransport() override;  // closes the listening sockets

  const char* trtype() const override { return "TCP"; }
  int poll() override;
  void tick(uint64_t now_ms) override;
  void shutdown() override;

  // Poll thread, as every method below.
  const TcpTransportOptions& options() const { return opts_; }
  // Options change until the first listener exists (kBadState after).
  Status set_options(const TcpTransportOptions& o);
  // Listens on addr:port (port 0: any) unless a listener there exists already;
  // *key is its "tcp:ADDR:PORT".
  Status listen(const std::string& addr, uint16_t port, std::string* key, uint16_t* bound_port);
  // Closes the listener (its connections stay until they end).
  void stop_listen(const std::string& key);
  // The discovery log's PORTID of a listener: 1, 2, ... (0: none has that key).
  uint16_t port_id(const std::string& key) const;
  size_t active_connections() const { return conns_.size(); }

 private:
  struct Listener;
  int accept_on(Listener* l);
  Listener* listener_of(const TcpConnection& c);
  void reap_closed();

  TargetSide* target_;
  PollGroup* group_;
  TcpTransportOptions opts_;
  std::vector<std::unique_ptr<Listener>> listeners_;
  std::vector<std::unique_ptr<TcpConnection>> conns_;
};

}  // namespace dpukv::nvme
