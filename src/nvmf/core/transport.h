// A transport as the target's poll group sees it: the poll-group half of SPDK's
// spdk_nvmf_transport_ops. Each transport (TCP: nvmf/tcp/tcp_transport.h;
// vfio-user: nvmf/vfio_user/vfio_user_transport.h) is one poller of the group
// among equals: its watchers handle its fds, poll() moves its queue pairs, tick()
// enforces its deadlines, shutdown() ends them. How a transport listens differs
// (a TCP port shared by subsystems, an emulated PCIe function per subsystem) and
// is its own, reached through the target (nvmf_target.h) and the application's
// trtype table (app_transport.h). Its queue pairs reach their controllers through
// ControllerCore::QueueTransport.
#pragma once

#include "nvmf/core/poll_group.h"

namespace dpukv::nvme {

class Transport : public Poller {
 public:
  virtual ~Transport() = default;
  virtual const char* trtype() const = 0;
  // The target is stopping (the poll thread has ended): every queue pair closes
  // and its requests finish before the subsystems go.
  virtual void shutdown() = 0;
};

}  // namespace dpukv::nvme
