#include "cache/tier/nvme_store.h"

#include <algorithm>
#include <cerrno>

#include "cache/tier/slab_allocator.h"
#include "runtime/host_port.h"
#include "runtime/log.h"

namespace dpukv {

namespace {
uint64_t round_up(uint64_t v) {
  return (v + SlabAllocator::kAlign - 1) / SlabAllocator::kAlign * SlabAllocator::kAlign;
}
}  // namespace

Status NvmeStore::open(const NvmeStoreOptions& o, std::unique_ptr<ChunkStore>* out) {
  std::unique_ptr<NvmeStore> s(new NvmeStore());
  nvme::TcpHostOptions h;
  if (!parse_host_port(o.address, &h.addr, &h.port)) {
    LOG_ERR("disk tier: the NVMe tier's address '%s' is not ADDR:PORT", o.address.c_str());
    return Code::kInvalidValue;
  }
  h.subnqn = o.nqn;
  h.queue_depth = static_cast<uint16_t>(std::min<uint32_t>(o.queue_depth + 1, 128));
  if (Status st = nvme::NvmeTcpHost::connect(h, &s->host_); !st.ok()) {
    LOG_ERR("disk tier: cannot connect to the NVMe/TCP target %s (%s): %s", o.address.c_str(),
            o.nqn.c_str(), std::string(st.name()).c_str());
    return Code::kIoFailed;
  }
  s->nsid_ = o.nsid;
  s->bs_ = s->host_->block_size(s->nsid_);
  if (s->bs_ == 0 || 4096 % s->bs_ != 0) {
    LOG_ERR("disk tier: namespace %u of %s is missing or has %u-byte blocks", s->nsid_,
            o.nqn.c_str(), s->bs_);
    return Code::kInvalidValue;
  }
  uint64_t bytes = s->host_->num_blocks(s->nsid_) * s->bs_;
  if (bytes < o.capacity) {
    LOG_ERR("disk tier: namespace %u holds %llu bytes, less than the tier's %llu", s->nsid_,
            static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(o.capacity));
    return Code::kNoMemory;
  }
  s->max_ = s->host_->max_transfer();
  uint16_t depth = static_cast<uint16_t>(s->host_->queue_depth() - 1);
  s->slots_.assign(depth, Piece{});
  for (uint16_t i = depth; i-- > 0;) s->free_.push_back(i);
  LOG_INFO("disk tier: data on NVMe/TCP %s %s namespace %u (%llu bytes)", o.address.c_str(),
           o.nqn.c_str(), s->nsid_, static_cast<unsigned long long>(bytes));
  *out = std::move(s);
  return Code::kSuccess;
}

Status NvmeStore::write(uint64_t offset, const void* buf, uint64_t len, uint64_t tag) {
  return io(true, offset, static_cast<uint8_t*>(const_cast<void*>(buf)), len, tag);
}

Status NvmeStore::read(uint64_t offset, void* buf, uint64_t len, uint64_t tag) {
  return io(false, offset, static_cast<uint8_t*>(buf), len, tag);
}

Status NvmeStore::io(bool write, uint64_t offset, uint8_t* buf, uint64_t len, uint64_t tag) {
  const uint64_t n = round_up(len);
  if (offset % bs_ != 0) return Code::kInvalidValue;
  TagState ts;
  for (uint64_t done = 0; done < n;) {
    uint64_t k = std::min<uint64_t>(n - done, max_);
    waiting_.push_back(
        Piece{tag, (offset + done) / bs_, static_cast<uint32_t>(k / bs_), buf + done, write});
    ++ts.remaining;
    done += k;
  }
  tags_.emplace_back(tag, ts);
  ++inflight_;
  submit();
  return Code::kSuccess;
}

void NvmeStore::submit() {
  while (waiting_head_ < waiting_.size() && !free_.empty()) {
    Piece p = waiting_[waiting_head_++];
    uint16_t cid = free_.back();
    free_.pop_back();
    slots_[cid] = p;
    const nvme::Sqe c = nvme::rw_command(cid, p.write, nsid_, p.lba, p.nlb);
    if (!host_->submit(0, c, p.buf, p.nlb * bs_, p.write).ok()) {
      for (auto& [t, s] : tags_)
        if (t == p.tag) s.failed = true;
    }
  }
  if (waiting_head_ == waiting_.size()) {
    waiting_.clear();
    waiting_head_ = 0;
  }
  (void)host_->flush_queue(0);  // the engine may sleep next: send what was queued
}

size_t NvmeStore::poll(Completion* out, size_t max) {
  nvme::Cqe cqes[64];
  int got = host_->reap(0, cqes, 64);
  bool broken = got < 0;
  for (int i = 0; i < got; ++i) {
    uint16_t cid = cqes[i].cid;
    if (cid >= slots_.size()) continue;
    uint64_t tag = slots_[cid].tag;
    free_.push_back(cid);
    for (auto& [t, s] : tags_)
      if (t == tag) {
        --s.remaining;
        if (nvme::status_of_cqe(cqes[i].status) != nvme::kSuccess) s.failed = true;
        break;
      }
  }
  size_t n = 0;
  for (size_t i = 0; i < tags_.size() && n < max;) {
    TagState& s = tags_[i].second;
    if (s.remaining == 0 || broken) {
      const bool bad = s.failed || broken;
      out[n++] =
          Completion{tags_[i].first, bad ? Status(Code::kIoFailed) : Status(), bad ? EIO : 0};
      tags_.erase(tags_.begin() + static_cast<long>(i));
      --inflight_;
    } else {
      ++i;
    }
  }
  submit();
  return n;
}

}  // namespace dpukv
