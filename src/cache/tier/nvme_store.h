// A ChunkStore on a namespace of an NVMe/TCP target (the NVMe tier): chunk I/O is
// cut into commands of at most the controller's transfer limit, sent as queue
// slots free up; a chunk completes when its last command does. The connection's
// socket is the event fd.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/tier/chunk_store.h"
#include "nvme/tcp_host.h"

namespace dpukv {

struct NvmeStoreOptions {
  std::string address;  // ADDR:PORT
  std::string nqn;
  uint32_t nsid = 1;
  uint64_t capacity = 0;  // bytes the tier needs on the namespace
  uint32_t queue_depth = 64;
};

class NvmeStore final : public ChunkStore {
 public:
  static Status open(const NvmeStoreOptions& o, std::unique_ptr<ChunkStore>* out);
  ~NvmeStore() override = default;
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  Status write(uint64_t offset, const void* buf, uint64_t len, uint64_t tag) override;
  Status read(uint64_t offset, void* buf, uint64_t len, uint64_t tag) override;
  size_t poll(Completion* out, size_t max) override;
  int event_fd() const override { return host_->queue_fd(0); }
  uint32_t inflight() const override { return inflight_; }
  const char* kind() const override { return "nvme-tcp"; }

 private:
  NvmeStore() = default;
  Status io(bool write, uint64_t offset, uint8_t* buf, uint64_t len, uint64_t tag);
  void submit();

  struct Piece {
    uint64_t tag, lba;
    uint32_t nlb;
    uint8_t* buf;
    bool write;
  };
  struct TagState {
    uint32_t remaining = 0;
    bool failed = false;
  };
  std::unique_ptr<nvme::NvmeTcpHost> host_;
  uint32_t nsid_ = 1, bs_ = 4096, max_ = 0;
  std::vector<Piece> slots_;    // by command id
  std::vector<uint16_t> free_;  // free command ids
  std::vector<Piece> waiting_;  // FIFO of pieces not yet sent
  size_t waiting_head_ = 0;
  std::vector<std::pair<uint64_t, TagState>> tags_;  // chunks in flight (few)
  uint32_t inflight_ = 0;
};

}  // namespace dpukv
