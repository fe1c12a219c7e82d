#include "nvme/initiator.h"

#include <cstring>
#include <vector>

#include "nvme/tcp_host.h"
#include "nvme/vfio_user_driver.h"

namespace dpukv::nvme {
namespace {

class VfioInitiator final : public Initiator {
 public:
  VfioInitiator(std::unique_ptr<VfioUserDriver> d, bool irq) : d_(std::move(d)), irq_(irq) {}
  uint32_t nsid() override { return d_->namespaces().empty() ? 0 : d_->namespaces()[0]; }
  uint32_t block_size() override { return d_->block_size(nsid()); }
  uint64_t num_blocks() override { return d_->num_blocks(nsid()); }
  uint32_t max_qd() override { return d_->queue_entries() - 1; }
  Status prepare(uint32_t qd, uint32_t bytes) override {
    if (bufs_.size() >= qd && bytes_ == bytes) return Code::kSuccess;
    bufs_.resize(qd);
    bytes_ = bytes;
    for (auto& b : bufs_) {
      if (Status st = d_->alloc(bytes, &b); !st.ok()) return st;
      std::memset(b.host, 0x5a, bytes);
    }
    return Code::kSuccess;
  }
  Status submit(uint16_t slot, bool write, uint64_t lba, uint32_t nlb, uint32_t bytes) override {
    return d_->submit(0, rw_command(slot, write, nsid(), lba, nlb), &bufs_[slot], bytes, nullptr);
  }
  int reap(Cqe* out, int max) override { return d_->reap(0, out, max); }
  void idle_wait() override {
    if (irq_) (void)d_->wait_interrupt(0, 10);
  }

 private:
  std::unique_ptr<VfioUserDriver> d_;
  bool irq_;
  std::vector<DmaBuffer> bufs_;
  uint32_t bytes_ = 0;
};

class TcpInitiator final : public Initiator {
 public:
  explicit TcpInitiator(std::unique_ptr<NvmeTcpHost> h, uint32_t depth)
      : h_(std::move(h)), depth_(depth) {}
  uint32_t nsid() override { return h_->namespaces().empty() ? 0 : h_->namespaces()[0]; }
  uint32_t block_size() override { return h_->block_size(nsid()); }
  uint64_t num_blocks() override { return h_->num_blocks(nsid()); }
  uint32_t max_qd() override { return depth_ - 1; }
  Status prepare(uint32_t qd, uint32_t bytes) override {
    bufs_.assign(qd, std::vector<uint8_t>(bytes, 0x5a));
    return Code::kSuccess;
  }
  Status submit(uint16_t slot, bool write, uint64_t lba, uint32_t nlb, uint32_t bytes) override {
    return h_->submit(0, rw_command(slot, write, nsid(), lba, nlb), bufs_[slot].data(), bytes,
                      write);
  }
  int reap(Cqe* out, int max) override { return h_->reap(0, out, max); }

 private:
  std::unique_ptr<NvmeTcpHost> h_;
  uint32_t depth_;
  std::vector<std::vector<uint8_t>> bufs_;
};

}  // namespace

std::unique_ptr<Initiator> make_vfio_user_initiator(std::unique_ptr<VfioUserDriver> d, bool irq) {
  return std::make_unique<VfioInitiator>(std::move(d), irq);
}

std::unique_ptr<Initiator> make_tcp_initiator(std::unique_ptr<NvmeTcpHost> h, uint32_t depth) {
  return std::make_unique<TcpInitiator>(std::move(h), depth);
}

}  // namespace dpukv::nvme
