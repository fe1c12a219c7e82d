#include "nvmf/vfio_user/nvme_pci_function.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/log.h"

namespace dpukv::nvme {
namespace vu = vfio_user;
namespace {

template <typename T>
bool read_struct(const uint8_t* p, size_t n, T* out) {
  if (n < sizeof(T)) return false;
  std::memcpy(out, p, sizeof(T));
  return true;
}
template <typename T>
void append(std::vector<uint8_t>* out, const T& v) {
  const auto* b = reinterpret_cast<const uint8_t*>(&v);
  out->insert(out->end(), b, b + sizeof(T));
}

constexpr uint32_t kMsixEnable = 1u << 15, kMsixFunctionMask = 1u << 14;

}  // namespace

Status NvmePciFunction::create(const FunctionConfig& cfg, std::shared_ptr<NamespaceSet> ns,
                               std::unique_ptr<NvmePciFunction>* out) {
  std::unique_ptr<NvmePciFunction> f(new NvmePciFunction(cfg));
  if (Status st = f->init(std::move(ns)); !st.ok()) return st;
  *out = std::move(f);
  return Code::kSuccess;
}

Status NvmePciFunction::init(std::shared_ptr<NamespaceSet> ns) {
  doorbell_fd_ = memfd_create("dpukv-nvme-bar0", MFD_CLOEXEC);
  if (doorbell_fd_ < 0 || ftruncate(doorbell_fd_, 2 * kDoorbellPageSize) != 0) return Code::kDriver;
  void* m =
      mmap(nullptr, 2 * kDoorbellPageSize, PROT_READ | PROT_WRITE, MAP_SHARED, doorbell_fd_, 0);
  if (m == MAP_FAILED) return Code::kNoMemory;
  doorbell_map_ = static_cast<uint8_t*>(m);
  uint16_t n = cfg_.controller.num_vectors;
  if (n == 0 || n > 2048) return Code::kInvalidValue;
  msix_table_.assign(size_t{n} * 16, 0);
  irq_fds_.assign(n, -1);
  irq_masked_.assign(n, 0);
  irq_pending_.assign(n, 0);
  build_config_space();
  device_reset();
  ctrl_ = std::make_unique<PcieController>(
      cfg_.controller, std::move(ns), &dma_, this,
      reinterpret_cast<uint32_t*>(doorbell_map_ + kDoorbellPageSize));
  return Code::kSuccess;
}

Status NvmePciFunction::add_namespace(uint32_t nsid, std::shared_ptr<Bdev> bdev) {
  return ctrl_->add_namespace(nsid, std::move(bdev));
}

NvmePciFunction::~NvmePciFunction() {
  ctrl_.reset();
  for (int& fd : irq_fds_)
    if (fd >= 0) ::close(fd);
  if (doorbell_map_ != nullptr) munmap(doorbell_map_, 2 * kDoorbellPageSize);
  if (doorbell_fd_ >= 0) ::close(doorbell_fd_);
}

// PCI header type 0 with three capabilities: power management, MSI-X and PCI
// Express (endpoint, FLR capable). No extended capabilities.
void NvmePciFunction::build_config_space() {
  uint8_t* c = config_.data();
  uint8_t* w = wmask_.data();
  put16(c + 0x00, cfg_.controller.vendor_id);
  put16(c + 0x02, cfg_.device_id);
  put16(w + 0x04, 0x0547);  // command: I/O, memory, bus master, parity, SERR, INTx disable
  put16(c + 0x06, 0x0010);  // status: capabilities list
  c[0x09] = 0x02;           // NVM Express
  c[0x0a] = 0x08;           // non-volatile memory controller
  c[0x0b] = 0x01;           // mass storage
  w[0x0c] = 0xff;           // cache line size
  put32(c + 0x10, 0x4);     // BAR0: 64-bit memory, not prefetchable
  put32(w + 0x10, ~(kBar0Size - 1) & ~0xfu);
  put32(w + 0x14, 0xffffffffu);
  put16(c + 0x2c, cfg_.controller.vendor_id);
  put16(c + 0x2e, cfg_.subsystem_id);
  c[0x34] = kCapPm;
  w[0x3c] = 0xff;  // interrupt line; no INTx pin
  // Power management, version 3; D0/D3hot in PMCSR.
  c[kCapPm] = 0x01;
  c[kCapPm + 1] = kCapMsix;
  put16(c + kCapPm + 2, 0x0003);
  w[kCapPm + 4] = 0x03;
  // MSI-X: table in BAR0 at 0x2000, PBA at 0x3000.
  c[kCapMsix] = 0x11;
  c[kCapMsix + 1] = kCapPcie;
  put16(c + kCapMsix + 2, static_cast<uint16_t>(cfg_.controller.num_vectors - 1));
  w[kCapMsix + 3] = 0xc0;  // enable, function mask
  put32(c + kCapMsix + 4, kMsixTableOffset);
  put32(c + kCapMsix + 8, kMsixPbaOffset);
  // PCI Express v2 endpoint: FLR capable, 8 GT/s x4 link.
  c[kCapPcie] = 0x10;
  c[kCapPcie + 1] = 0x00;
  put16(c + kCapPcie + 2, 0x0002);
  put32(c + kCapPcie + 4, 1u << 28);
  put16(w + kCapPcie + 8, 0xffff);  // device control (bit 15: initiate FLR)
  put32(c + kCapPcie + 0x0c, 0x00000043);
  put16(w + kCapPcie + 0x10, 0x01c3);      // link control
  put16(c + kCapPcie + 0x12, 0x0043);      // link status: 8 GT/s, x4
  put32(c + kCapPcie + 0x24, 0x00000010);  // device capabilities 2: completion timeout disable
  put16(w + kCapPcie + 0x28, 0x0010);
}

bool NvmePciFunction::msix_enabled_by_config() const {
  uint16_t mc;
  std::memcpy(&mc, config_.data() + kCapMsix + 2, 2);
  return (mc & kMsixEnable) != 0;
}

// The vfio-user mask always applies. The table and function masks apply when
// the client drives MSI-X through this config space; a client that emulates the
// table itself (as QEMU does) leaves MSI-X disabled here and masks with SET_IRQS.
bool NvmePciFunction::vector_masked(uint16_t v) const {
  if (irq_masked_[v]) return true;
  if (!msix_enabled_by_config()) return false;
  uint16_t mc;
  std::memcpy(&mc, config_.data() + kCapMsix + 2, 2);
  return (mc & kMsixFunctionMask) != 0 || (msix_table_[v * 16u + 12] & 1) != 0;
}

void NvmePciFunction::raise(uint16_t v) {
  if (v >= irq_fds_.size()) return;
  if (irq_fds_[v] < 0 || vector_masked(v)) {
    if (!irq_pending_[v]) ++counters_.irqs_pending;
    irq_pending_[v] = 1;
    return;
  }
  uint64_t one = 1;
  if (::write(irq_fds_[v], &one, sizeof one) == sizeof one) ++counters_.irqs_sent;
}

void NvmePciFunction::fire_pending() {
  for (uint16_t v = 0; v < irq_pending_.size(); ++v) {
    if (!irq_pending_[v] || irq_fds_[v] < 0 || vector_masked(v)) continue;
    irq_pending_[v] = 0;
    raise(v);
  }
}

void NvmePciFunction::device_reset() {
  if (ctrl_) ctrl_->function_reset();
  std::fill(irq_masked_.begin(), irq_masked_.end(), 0);
  std::fill(irq_pending_.begin(), irq_pending_.end(), 0);
  std::fill(msix_table_.begin(), msix_table_.end(), 0);
  for (size_t v = 0; v < irq_fds_.size(); ++v) msix_table_[v * 16 + 12] = 1;  // masked at reset
  put16(config_.data() + 0x04, 0);
  put16(config_.data() + kCapMsix + 2, static_cast<uint16_t>(cfg_.controller.num_vectors - 1));
  put16(config_.data() + kCapPcie + 8, 0);
  std::memset(doorbell_map_ + kDoorbellPageSize, 0, kDoorbellPageSize);
}

void NvmePciFunction::disconnect() {
  device_reset();
  dma_.clear();
  for (int& fd : irq_fds_)
    if (fd >= 0) {
      ::close(fd);
      fd = -1;
    }
  negotiated_ = false;
}

// ---- messages ---------------------------------------------------------------

void NvmePciFunction::handle(const uint8_t* msg, size_t len, int* fds, int nfds,
                             std::vector<uint8_t>* reply, std::vector<int>* reply_fds) {
  reply->clear();
  reply_fds->clear();
  ++counters_.messages;
  vu::Header h{};
  if (len > 0) std::memcpy(&h, msg, std::min(len, sizeof h));
  std::vector<uint8_t> body;
  int err = 0;
  const uint8_t* p = len >= sizeof h ? msg + sizeof h : nullptr;
  size_t n = len >= sizeof h ? len - sizeof h : 0;
  if (len < sizeof h || h.msg_size != len || (h.flags & vu::kFlagTypeMask) != vu::kFlagCommand) {
    err = EINVAL;
  } else if (!negotiated_ && h.command != vu::kVersion) {
    err = EINVAL;  // VERSION comes first
  } else {
    switch (h.command) {
      case vu::kVersion:
        err = on_version(p, n, &body);
        break;
      case vu::kDmaMap:
        err = on_dma_map(p, n, fds, nfds);
        break;
      case vu::kDmaUnmap:
        err = on_dma_unmap(p, n, &body);
        break;
      case vu::kDeviceGetInfo:
        err = on_device_info(p, n, &body);
        break;
      case vu::kDeviceGetRegionInfo:
        err = on_region_info(p, n, &body, reply_fds);
        break;
      case vu::kDeviceGetIrqInfo:
        err = on_irq_info(p, n, &body);
        break;
      case vu::kDeviceSetIrqs:
        err = on_set_irqs(p, n, fds, nfds);
        break;
      case vu::kRegionRead:
        err = on_region_read(p, n, &body);
        break;
      case vu::kRegionWrite:
        err = on_region_write(p, n, &body);
        break;
      case vu::kDeviceReset:
        err = n == 0 ? 0 : EINVAL;
        if (!err) device_reset();
        break;
      default:
        err = ENOTSUP;  // GET_REGION_IO_FDS, WRITE_MULTI, DEVICE_FEATURE, migration
        break;
    }
  }
  for (int i = 0; i < nfds; ++i)
    if (fds[i] >= 0) {
      ::close(fds[i]);
      fds[i] = -1;
    }
  if (err != 0) {
    ++counters_.errors;
    LOG_DBG("vfio-user: command %u (id %u) failed: %s", h.command, h.msg_id, strerror(err));
    body.clear();
    reply_fds->clear();
  }
  if ((h.flags & vu::kFlagNoReply) && err == 0) return;
  vu::Header r{};
  r.msg_id = h.msg_id;
  r.command = h.command;
  r.msg_size = static_cast<uint32_t>(sizeof r + body.size());
  r.flags = vu::kFlagReply | (err ? vu::kFlagError : 0);
  r.error_no = static_cast<uint32_t>(err);
  append(reply, r);
  reply->insert(reply->end(), body.begin(), body.end());
}

int NvmePciFunction::on_version(const uint8_t* p, size_t n, std::vector<uint8_t>* out) {
  vu::Version v{};
  if (negotiated_ || !read_struct(p, n, &v)) return EINVAL;
  if (v.major != vu::kVersionMajor) return ENOTSUP;
  if (n > sizeof v) {  // optional JSON capabilities, NUL terminated
    const char* js = reinterpret_cast<const char*>(p + sizeof v);
    size_t jn = n - sizeof v;
    if (js[jn - 1] != '\0') return EINVAL;
    auto caps = nlohmann::json::parse(js, js + jn - 1, nullptr, false);
    if (caps.is_discarded() || !caps.is_object()) return EINVAL;
  }
  vu::Version r{vu::kVersionMajor, std::min(v.minor, vu::kVersionMinor)};
  append(out, r);
  std::string caps = "{\"capabilities\":{\"max_msg_fds\":" + std::to_string(vu::kMaxMsgFds) +
                     ",\"max_data_xfer_size\":" + std::to_string(vu::kMaxDataXfer) +
                     ",\"pgsizes\":4096,\"max_dma_maps\":" + std::to_string(DmaMapTable::kMaxMaps) +
                     "}}";
  out->insert(out->end(), caps.begin(), caps.end());
  out->push_back('\0');
  negotiated_ = true;
  return 0;
}

int NvmePciFunction::on_dma_map(const uint8_t* p, size_t n, int* fds, int nfds) {
  vu::DmaMap m{};
  if (!read_struct(p, n, &m) || m.argsz < sizeof m || n != sizeof m) return EINVAL;
  if ((m.flags & ~(vu::kDmaRead_ | vu::kDmaWrite_)) != 0 || m.flags == 0) return EINVAL;
  if (nfds != 1) return nfds == 0 ? ENOTSUP : EINVAL;  // no DMA_READ/WRITE fallback
  Status st = dma_.add(m.addr, m.size, fds[0], m.offset, m.flags);
  if (st.code() == Code::kBadState) return EEXIST;
  if (st.code() == Code::kFull) return ENOSPC;
  if (!st.ok()) return EINVAL;
  ctrl_->dma_mapped();
  return 0;
}

int NvmePciFunction::on_dma_unmap(const uint8_t* p, size_t n, std::vector<uint8_t>* out) {
  vu::DmaUnmap u{};
  if (!read_struct(p, n, &u) || u.argsz < sizeof u || n != sizeof u) return EINVAL;
  if (u.flags == vu::kDmaUnmapAll) {
    if (u.addr != 0 || u.size != 0) return EINVAL;
    ctrl_->release_dma(0, ~uint64_t{0});
    dma_.clear();
  } else {
    if (u.flags != 0) return ENOTSUP;  // dirty page tracking is not implemented
    if (u.size == 0 || u.addr + u.size < u.addr) return EINVAL;
    if (!dma_.overlaps(u.addr, u.size)) return ENOENT;
    // Every reference into the window ends before the reply, as the spec requires.
    ctrl_->release_dma(u.addr, u.size);
    Status st = dma_.remove(u.addr, u.size);
    if (!st.ok()) return st.code() == Code::kNotFound ? ENOENT : EINVAL;
  }
  append(out, u);
  return 0;
}

int NvmePciFunction::on_device_info(const uint8_t* p, size_t n, std::vector<uint8_t>* out) {
  vu::DeviceInfo in{};
  if (!read_struct(p, n, &in) || in.argsz < sizeof in) return EINVAL;
  append(out, vu::DeviceInfo{sizeof(vu::DeviceInfo), vu::kDeviceFlagsReset | vu::kDeviceFlagsPci,
                             vu::kNumRegions, vu::kNumIrqs});
  return 0;
}

int NvmePciFunction::on_region_info(const uint8_t* p, size_t n, std::vector<uint8_t>* out,
                                    std::vector<int>* out_fds) {
  vu::RegionInfo in{};
  if (!read_struct(p, n, &in) || in.argsz < sizeof in) return EINVAL;
  if (in.index >= vu::kNumRegions) return EINVAL;
  vu::RegionInfo r{};
  r.argsz = sizeof r;
  r.index = in.index;
  if (in.index == vu::kBar0 && !cfg_.mappable_doorbells) {
    r.flags = vu::kRegionRead_ | vu::kRegionWrite_;
    r.size = kBar0Size;
  } else if (in.index == vu::kBar0) {
    vu::SparseMmap cap{};
    cap.header = vu::CapHeader{vu::kCapSparseMmap, 1, 0};
    cap.nr_areas = 1;
    cap.offset = kDoorbellBase;  // only the doorbell page is mappable
    cap.size = kDoorbellPageSize;
    r.argsz = sizeof r + sizeof cap;
    r.flags = vu::kRegionRead_ | vu::kRegionWrite_ | vu::kRegionMmap | vu::kRegionCaps;
    r.size = kBar0Size;
    r.offset = 0;  // mmap(fd, offset 0 + area offset 0x1000) gives the doorbells
    if (in.argsz >= r.argsz) {
      r.cap_offset = sizeof r;
      append(out, r);
      append(out, cap);
      out_fds->push_back(doorbell_fd_);
      return 0;
    }
    // Too small for the capability: report the size needed, as VFIO does.
  } else if (in.index == vu::kConfig) {
    r.flags = vu::kRegionRead_ | vu::kRegionWrite_;
    r.size = kConfigSize;
  }
  append(out, r);
  return 0;
}

int NvmePciFunction::on_irq_info(const uint8_t* p, size_t n, std::vector<uint8_t>* out) {
  vu::IrqInfo in{};
  if (!read_struct(p, n, &in) || in.argsz < sizeof in || in.index >= vu::kNumIrqs) return EINVAL;
  vu::IrqInfo r{sizeof r, vu::kIrqInfoEventfd, in.index, 0};
  if (in.index == vu::kIrqMsix) {
    r.flags |= vu::kIrqInfoMaskable;
    r.count = static_cast<uint32_t>(irq_fds_.size());
  }
  append(out, r);
  return 0;
}

int NvmePciFunction::on_set_irqs(const uint8_t* p, size_t n, int* fds, int nfds) {
  vu::IrqSet s{};
  if (!read_struct(p, n, &s) || s.argsz != n || s.index >= vu::kNumIrqs) return EINVAL;
  uint32_t data = s.flags & (vu::kIrqDataNone | vu::kIrqDataBool | vu::kIrqDataEventfd);
  uint32_t action = s.flags & (vu::kIrqActionMask | vu::kIrqActionUnmask | vu::kIrqActionTrigger);
  if (std::popcount(data) != 1 || std::popcount(action) != 1 || (s.flags & ~(data | action)) != 0)
    return EINVAL;
  uint32_t count = s.index == vu::kIrqMsix ? static_cast<uint32_t>(irq_fds_.size()) : 0;
  // start = count = 0 with DATA_NONE | TRIGGER turns the whole index off.
  if (s.start == 0 && s.count == 0) {
    if (data != vu::kIrqDataNone || action != vu::kIrqActionTrigger || nfds != 0) return EINVAL;
    if (s.index == vu::kIrqMsix)
      for (int& fd : irq_fds_)
        if (fd >= 0) {
          ::close(fd);
          fd = -1;
        }
    return 0;
  }
  if (s.start >= count || s.count > count - s.start) return EINVAL;
  size_t extra = n - sizeof s;
  if (data == vu::kIrqDataBool ? extra != s.count : extra != 0) return EINVAL;
  if (data != vu::kIrqDataEventfd && nfds != 0) return EINVAL;
  const uint8_t* bools = p + sizeof s;
  if (data == vu::kIrqDataEventfd) {
    if (action != vu::kIrqActionTrigger) return ENOTSUP;  // mask/unmask notification fds
    if (nfds != 0 && static_cast<uint32_t>(nfds) != s.count) return EINVAL;
    for (uint32_t i = 0; i < s.count; ++i) {
      int& slot = irq_fds_[s.start + i];
      if (slot >= 0) ::close(slot);
      slot = nfds == 0 ? -1 : fds[i];  // no fds: de-assign
      if (nfds != 0) fds[i] = -1;
    }
    fire_pending();
    return 0;
  }
  for (uint32_t i = 0; i < s.count; ++i) {
    if (data == vu::kIrqDataBool && !bools[i]) continue;
    uint16_t v = static_cast<uint16_t>(s.start + i);
    if (action == vu::kIrqActionMask) {
      irq_masked_[v] = 1;
    } else if (action == vu::kIrqActionUnmask) {
      irq_masked_[v] = 0;
    } else {
      raise(v);
    }
  }
  if (action == vu::kIrqActionUnmask) fire_pending();
  return 0;
}

int NvmePciFunction::on_region_read(const uint8_t* p, size_t n, std::vector<uint8_t>* out) {
  vu::RegionAccess a{};
  if (!read_struct(p, n, &a) || n != sizeof a || a.count == 0 || a.count > vu::kMaxDataXfer)
    return EINVAL;
  if (a.region == vu::kConfig) {
    if (a.offset >= kConfigSize || a.count > kConfigSize - a.offset) return EINVAL;
    append(out, a);
    out->insert(out->end(), config_.begin() + static_cast<long>(a.offset),
                config_.begin() + static_cast<long>(a.offset + a.count));
    return 0;
  }
  if (a.region != vu::kBar0) return EINVAL;
  if ((a.count != 1 && a.count != 2 && a.count != 4 && a.count != 8) || a.offset % a.count != 0 ||
      a.offset >= kBar0Size)
    return EINVAL;
  uint64_t v = bar0_read(static_cast<uint32_t>(a.offset), a.count);
  append(out, a);
  const auto* b = reinterpret_cast<const uint8_t*>(&v);
  out->insert(out->end(), b, b + a.count);
  return 0;
}

int NvmePciFunction::on_region_write(const uint8_t* p, size_t n, std::vector<uint8_t>* out) {
  vu::RegionAccess a{};
  if (!read_struct(p, n, &a) || a.count == 0 || a.count > vu::kMaxDataXfer ||
      n != sizeof a + a.count)
    return EINVAL;
  const uint8_t* data = p + sizeof a;
  if (a.region == vu::kConfig) {
    if (a.offset >= kConfigSize || a.count > kConfigSize - a.offset) return EINVAL;
    config_write(static_cast<uint32_t>(a.offset), data, a.count);
  } else if (a.region == vu::kBar0) {
    if ((a.count != 1 && a.count != 2 && a.count != 4 && a.count != 8) || a.offset % a.count != 0 ||
        a.offset >= kBar0Size)
      return EINVAL;
    uint64_t v = 0;
    std::memcpy(&v, data, a.count);
    bar0_write(static_cast<uint32_t>(a.offset), a.count, v);
  } else {
    return EINVAL;
  }
  append(out, a);
  return 0;
}

uint64_t NvmePciFunction::bar0_read(uint32_t off, uint32_t size) {
  uint64_t v = 0;
  if (off < kDoorbellBase) return ctrl_->read_reg(off, size);
  if (off < kDoorbellBase + kDoorbellPageSize) {
    std::memcpy(&v, doorbell_map_ + off, size);
  } else if (off >= kMsixTableOffset && off - kMsixTableOffset < msix_table_.size()) {
    std::memcpy(&v, msix_table_.data() + (off - kMsixTableOffset),
                std::min<size_t>(size, msix_table_.size() - (off - kMsixTableOffset)));
  } else if (off >= kMsixPbaOffset) {
    for (uint32_t bit = 0; bit < size * 8; ++bit) {
      uint64_t vec = uint64_t{off - kMsixPbaOffset} * 8 + bit;
      if (vec < irq_pending_.size() && irq_pending_[vec]) v |= uint64_t{1} << bit;
    }
  }
  return v;
}

void NvmePciFunction::bar0_write(uint32_t off, uint32_t size, uint64_t v) {
  if (off < kDoorbellBase) return ctrl_->write_reg(off, size, v);
  if (off < kDoorbellBase + kDoorbellPageSize) {
    if (size == 4) ctrl_->write_doorbell(off - kDoorbellBase, static_cast<uint32_t>(v));
    return;
  }
  if (off >= kMsixTableOffset && off - kMsixTableOffset < msix_table_.size()) {
    std::memcpy(msix_table_.data() + (off - kMsixTableOffset), &v,
                std::min<size_t>(size, msix_table_.size() - (off - kMsixTableOffset)));
    fire_pending();
  }
  // The PBA and the gaps are read-only.
}

void NvmePciFunction::config_write(uint32_t off, const uint8_t* data, uint32_t size) {
  for (uint32_t i = 0; i < size; ++i) {
    uint8_t m = wmask_[off + i];
    config_[off + i] = static_cast<uint8_t>((config_[off + i] & ~m) | (data[i] & m));
  }
  uint32_t devctl = kCapPcie + 8;
  if (config_[devctl + 1] & 0x80) {  // initiate function-level reset
    LOG_INFO("nvme function: function-level reset");
    device_reset();
    config_[devctl + 1] &= 0x7f;
  }
  fire_pending();
}

}  // namespace dpukv::nvme
