// The vfio-user transport of the target's poll group: its emulation manager's
// functions (emulated NVMe PCIe functions, each on its UNIX socket) polled on the
// target's thread, with the TCP transport, so both see one namespace set per
// subsystem. Its methods run on the poll thread (NvmfTarget::run_on_poller).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nvmf/core/transport.h"
#include "nvmf/vfio_user/emulation_manager.h"

namespace dpukv::nvme {

class VfioUserTransport final : public Transport {
 public:
  static Status create(std::unique_ptr<VfioUserTransport>* out) {
    ManagerOptions mo;
    mo.own_thread = false;  // polled by the group this transport joins
    std::unique_ptr<EmulationManager> m;
    if (Status st = EmulationManager::create(mo, &m); !st.ok()) return st;
    out->reset(new VfioUserTransport(std::move(m)));
    return Code::kSuccess;
  }

  const char* trtype() const override { return "VFIOUSER"; }
  int poll() override { return emu_->poll_once(); }
  void tick(uint64_t) override {}  // a function's host is watched by its socket
  // The functions go with the manager, after the poll thread ended.
  void shutdown() override {}

  Status create_function(const FunctionSpec& spec, std::string* id) {
    return emu_->create_function(spec, id);
  }
  Status destroy_function(const std::string& id) { return emu_->destroy_function(id); }
  std::vector<FunctionInfo> list_functions() { return emu_->list_functions(); }

 private:
  explicit VfioUserTransport(std::unique_ptr<EmulationManager> m) : emu_(std::move(m)) {}
  std::unique_ptr<EmulationManager> emu_;
};

}  // namespace dpukv::nvme
