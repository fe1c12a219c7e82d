// The client side of vfio-user: what QEMU or SPDK's vfio-user NVMe transport does
// to reach an emulated device. Used by dpukv's host driver, its tests and benches.
// Blocking request/reply on a stream socket; one request at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nvme/vfio_user_wire.h"
#include "runtime/status.h"

namespace dpukv::nvme {

class VfioUserClient {
 public:
  // Connects, retrying until timeout_ms (the server may still be starting), and
  // negotiates the protocol version.
  static Status connect(const std::string& path, int timeout_ms,
                        std::unique_ptr<VfioUserClient>* out);
  ~VfioUserClient();
  VfioUserClient(const VfioUserClient&) = delete;
  VfioUserClient& operator=(const VfioUserClient&) = delete;

  // One request and its reply. An error reply returns kIoFailed with last_errno()
  // set; a broken connection returns kConnectionReset. Received fds belong to the
  // caller.
  Status request(uint16_t command, const void* payload, size_t len, const int* fds, int nfds,
                 std::vector<uint8_t>* reply, std::vector<int>* reply_fds = nullptr);
  // Sends raw bytes (for tests of malformed messages) and reads one reply.
  Status raw(const void* msg, size_t len, vfio_user::Header* reply_header,
             std::vector<uint8_t>* reply);

  Status device_info(vfio_user::DeviceInfo* out);
  // Region info and, for a mappable region, its fd (caller owns) and sparse area.
  Status region_info(uint32_t index, vfio_user::RegionInfo* out, int* fd = nullptr,
                     uint64_t* area_offset = nullptr, uint64_t* area_size = nullptr);
  Status region_read(uint32_t region, uint64_t offset, void* data, uint32_t count);
  Status region_write(uint32_t region, uint64_t offset, const void* data, uint32_t count);
  Status dma_map(uint64_t iova, uint64_t size, int fd, uint64_t offset, uint32_t flags);
  Status dma_unmap(uint64_t iova, uint64_t size);
  Status set_irq_eventfds(uint32_t start, const std::vector<int>& fds);
  Status mask_irq(uint32_t vector, bool masked);
  Status reset();

  int last_errno() const { return last_errno_; }
  int fd() const { return fd_; }
  const std::string& server_capabilities() const { return server_caps_; }

 private:
  VfioUserClient() = default;
  Status send_msg(const void* msg, size_t len, const int* fds, int nfds);
  Status recv_reply(vfio_user::Header* h, std::vector<uint8_t>* body, std::vector<int>* fds);

  int fd_ = -1;
  uint16_t next_id_ = 1;
  int last_errno_ = 0;
  std::string server_caps_;
  std::vector<uint8_t> buf_;
};

}  // namespace dpukv::nvme
