// The vfio-user emulation manager: emulated NVMe functions created and destroyed
// at run time, each listening on its own UNIX socket, all served by one poller
// thread (the reactor) that busy-polls doorbells and checks sockets between
// polls. On a BlueField this is the DevEmu PCI emulation manager with its
// hotplug state machine; the states and their order are the same.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nvmf/bdev/bdev.h"
#include "nvmf/vfio_user/nvme_pci_function.h"
#include "runtime/call_queue.h"
#include "runtime/status.h"

namespace dpukv::nvme {

enum class HotplugState : uint8_t { kPowerOff, kPlugInProgress, kPowerOn, kUnplugInProgress };
const char* hotplug_state_name(HotplugState s);

struct FunctionSpec {
  std::string id;           // empty: "vfio-user-N"
  std::string socket_path;  // where the function listens
  FunctionConfig config;
  std::vector<std::shared_ptr<Bdev>> namespaces;  // nsid 1, 2, ...
  // Instead of `namespaces`: a subsystem's namespace set, shared with its other
  // controllers (the owner polls everything on one thread).
  std::shared_ptr<NamespaceSet> namespace_set;
};

struct FunctionInfo {
  std::string id, socket_path;
  HotplugState state;
  bool client_connected;
  uint32_t namespaces;
  uint32_t io_queues;
  ControllerStats stats;
};

struct ManagerOptions {
  int cpu = -1;                   // pin the reactor; -1: no pinning
  uint32_t idle_after_us = 2000;  // busy-poll this long after the last work...
  uint32_t idle_sleep_us = 200;   // ...then sleep this long between checks
  uint32_t socket_check_us = 50;  // how often a busy reactor looks at its sockets
  // false: no thread of its own; the owner calls poll_once() from its poll loop
  // and every other method from that same thread.
  bool own_thread = true;
};

class EmulationManager {
 public:
  static Status create(const ManagerOptions& o, std::unique_ptr<EmulationManager>* out);
  ~EmulationManager();
  EmulationManager(const EmulationManager&) = delete;
  EmulationManager& operator=(const EmulationManager&) = delete;

  // Power off -> plug in progress -> power on (listening). Returns its id.
  Status create_function(const FunctionSpec& spec, std::string* id);
  // Power on -> unplug in progress (client dropped, I/O drained) -> power off, gone.
  Status destroy_function(const std::string& id);
  std::vector<FunctionInfo> list_functions();
  // One pass of the reactor (for managers without their own thread): doorbells,
  // and sockets every socket_check_us. Returns the work done.
  int poll_once();

 private:
  class Endpoint;
  EmulationManager() = default;
  void run();
  Status call(std::function<Status()> fn);  // runs fn on the reactor thread
  bool poll_sockets(int timeout_us);        // true if any socket had activity

  ManagerOptions opts_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  int wake_fd_ = -1;

  std::vector<std::unique_ptr<Endpoint>> endpoints_;  // the reactor thread's alone
  CallQueue calls_;
  uint64_t next_id_ = 0;
  uint64_t last_check_ = 0;
};

}  // namespace dpukv::nvme
