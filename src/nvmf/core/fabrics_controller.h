// The controllers of the NVMe-oF dynamic controller model: created by a host's
// admin-queue Connect, they take registers over Property Get/Set, serve the
// discovery log, and end their I/O queues on a reset. The fabrics transport of
// ControllerCore (PcieController is the PCIe one).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nvmf/core/controller_core.h"
#include "runtime/clock.h"

namespace dpukv::nvme {

struct Subsystem;
class TargetSide;

// A controller created by a host's admin-queue Connect (dynamic controller model).
class FabricsController final : public ControllerCore {
 public:
  FabricsController(const ControllerConfig& c, std::shared_ptr<NamespaceSet> ns, uint32_t pool,
                    Subsystem* s, std::string host)
      : ControllerCore(c, std::move(ns), pool), subsys(s), hostnqn(std::move(host)) {}
  ~FabricsController() override { drain_inflight(); }

  Subsystem* subsys;
  std::string hostnqn;
  std::vector<QueueTransport*> queues;         // [qid]; admin at 0
  uint64_t last_activity_ms = monotonic_ms();  // the last command on any of its queues
  TargetSide* target = nullptr;                // for the discovery log

  // Closes every queue it has (keep alive expired, host removed, admin queue gone).
  void close_queues(const char* why) {
    for (QueueTransport* q : queues)
      if (q != nullptr) q->close(why);
  }

 private:
  void complete(Request* r, uint16_t status) override;
  bool transport_log(uint8_t lid, std::vector<uint8_t>* page) override;
  void drop(Request* r) override;
  uint16_t admin_transport(Request* r) override;
  void on_disable() override;
};

}  // namespace dpukv::nvme
