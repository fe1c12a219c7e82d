// The application's transports, found by trtype in one table instead of string
// checks at every method: each is created once (nvmf_create_transport), takes and
// drops listeners for subsystems, and lists itself, its listeners and its counters
// for the get methods. TCP serves NvmfTarget's listeners; VFIOUSER serves emulated
// PCIe functions (a listener is a directory holding the function's socket "cntrl",
// as in SPDK) and is also what the nvmf_doca_* methods manage.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nvmf/nvmf_target.h"
#include "nvmf/vfio_user/vfio_user_transport.h"
#include "rpc/params.h"

namespace dpukv::nvme {

struct ListenAddress {
  std::string traddr;
  uint16_t port = 0;  // TCP only
};

// What nvmf_create_transport sets: the TCP target's options, and what a
// vfio-user function offers its host.
struct TransportOptions {
  TcpTransportOptions tcp;
  bool mappable_bar0 = true;  // the doorbell page mmap-able by the host
};

class AppTransport {
 public:
  virtual ~AppTransport() = default;
  virtual const char* trtype() const = 0;
  bool created() const { return created_; }
  virtual rpc::RpcError create(const TransportOptions& o) = 0;
  virtual rpc::Json describe() const = 0;
  // Reads trsvcid/adrfam where the transport has them (a problem is left in l).
  virtual void parse_address(rpc::Params& l, ListenAddress* a) const = 0;
  virtual rpc::RpcError add_listener(const std::string& nqn, const ListenAddress& a) = 0;
  virtual rpc::RpcError remove_listener(const std::string& nqn, const ListenAddress& a) = 0;
  virtual void list_listeners(const SubsystemInfo& s, rpc::Json* out) const = 0;
  virtual rpc::Json stats() = 0;
  virtual void subsystem_deleted(const std::string&) {}

 protected:
  bool created_ = false;
};

class TcpAppTransport final : public AppTransport {
 public:
  explicit TcpAppTransport(NvmfTarget* t) : target_(t) {}
  const char* trtype() const override { return "TCP"; }
  rpc::RpcError create(const TransportOptions& o) override;
  rpc::Json describe() const override;
  void parse_address(rpc::Params& l, ListenAddress* a) const override;
  rpc::RpcError add_listener(const std::string& nqn, const ListenAddress& a) override;
  rpc::RpcError remove_listener(const std::string& nqn, const ListenAddress& a) override;
  void list_listeners(const SubsystemInfo& s, rpc::Json* out) const override;
  rpc::Json stats() override;

 private:
  NvmfTarget* target_;
};

class VfioUserAppTransport final : public AppTransport {
 public:
  // t owns v (NvmfTarget::add_transport); v's methods run on t's poll thread.
  VfioUserAppTransport(NvmfTarget* t, VfioUserTransport* v) : target_(t), vfio_(v) {}
  ~VfioUserAppTransport() override;
  const char* trtype() const override { return "VFIOUSER"; }
  rpc::RpcError create(const TransportOptions& o) override;
  rpc::Json describe() const override;
  void parse_address(rpc::Params&, ListenAddress*) const override {}
  rpc::RpcError add_listener(const std::string& nqn, const ListenAddress& a) override;
  rpc::RpcError remove_listener(const std::string& nqn, const ListenAddress& a) override;
  void list_listeners(const SubsystemInfo& s, rpc::Json* out) const override;
  rpc::Json stats() override;
  void subsystem_deleted(const std::string& nqn) override;

  // Emulated functions (the nvmf_doca_* methods call these directly).
  rpc::RpcError make_function(const std::string& nqn, const std::string& path,
                              const std::string& want, rpc::Json* out);
  rpc::RpcError destroy_function(const std::string& id);
  rpc::Json list_functions();
  size_t num_functions() const { return functions_.size(); }

 private:
  struct Function {
    std::string id, nqn, socket_path;
  };
  std::vector<FunctionInfo> function_infos();
  NvmfTarget* target_;
  VfioUserTransport* vfio_;
  std::vector<Function> functions_;  // RPC thread only
  bool mappable_bar0_ = true;
};

}  // namespace dpukv::nvme
