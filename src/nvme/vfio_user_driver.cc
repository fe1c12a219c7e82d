#include "nvme/vfio_user_driver.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv::nvme {
namespace vu = vfio_user;
namespace {

constexpr uint32_t kPage = 4096;
constexpr uint32_t kAdminEntries = 32;

}  // namespace

Status VfioUserDriver::attach(const std::string& socket_path, const DriverOptions& o,
                              std::unique_ptr<VfioUserDriver>* out) {
  std::unique_ptr<VfioUserDriver> d(new VfioUserDriver());
  d->opts_ = o;
  if (o.queue_entries < 2 || o.io_queues == 0) return Code::kInvalidValue;
  if (Status st = VfioUserClient::connect(socket_path, o.connect_timeout_ms, &d->client_); !st.ok())
    return st;
  vu::DeviceInfo info{};
  if (Status st = d->client_->device_info(&info); !st.ok()) return st;
  if (!(info.flags & vu::kDeviceFlagsPci) || info.num_regions <= vu::kConfig)
    return Code::kNotSupported;
  uint8_t cls[4];
  if (Status st = d->client_->region_read(vu::kConfig, 0x08, cls, 4); !st.ok()) return st;
  if (cls[1] != 0x02 || cls[2] != 0x08 || cls[3] != 0x01) {
    LOG_ERR("nvme driver: device class %02x%02x%02x is not NVMe", cls[3], cls[2], cls[1]);
    return Code::kNotSupported;
  }
  if (o.mmap_doorbells) {
    vu::RegionInfo ri{};
    int fd = -1;
    uint64_t area_off = 0, area_size = 0;
    if (Status st = d->client_->region_info(vu::kBar0, &ri, &fd, &area_off, &area_size); !st.ok())
      return st;
    if (fd >= 0 && area_off == kDoorbellBase && area_size >= kDoorbellPageSize) {
      void* m = mmap(nullptr, area_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                     static_cast<off_t>(ri.offset + area_off));
      if (m != MAP_FAILED) {
        d->doorbell_map_ = m;
        d->doorbell_map_len_ = area_size;
        d->doorbells_ = static_cast<uint32_t*>(m);
      }
    }
    if (fd >= 0) ::close(fd);
    if (d->doorbells_ == nullptr)
      LOG_WARN("nvme driver: doorbell page not mappable; using messages");
  }
  MemRegionOptions mo;
  mo.name = "dpukv-nvme-host";
  if (Status st = MemRegion::create(o.memory_bytes, mo, &d->mem_); !st.ok()) return st;
  if (Status st = d->map_memory(); !st.ok()) return st;
  d->queues_.resize(o.io_queues + 1);
  if (o.interrupts) {
    std::vector<int> fds;
    for (auto& q : d->queues_) {
      q.irq_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
      if (q.irq_fd < 0) return Code::kDriver;
      fds.push_back(q.irq_fd);
    }
    if (Status st = d->client_->set_irq_eventfds(0, fds); !st.ok()) return st;
  }
  if (Status st = d->setup_pci_function(); !st.ok()) return st;
  if (Status st = d->initialize(); !st.ok()) return st;
  *out = std::move(d);
  return Code::kSuccess;
}

// A clean leave, as SPDK's host leaves: a normal shutdown (CC.SHN) the
// controller completes, then the memory unmapped, then the socket closed. A
// target then ends the association in order instead of finding a host gone
// mid-run. A gone or failed controller is left at once.
void VfioUserDriver::detach() {
  if (client_ == nullptr || detached_) return;
  detached_ = true;
  const uint32_t csts = read32(kRegCsts);
  if (csts == 0xffffffffu || (csts & kCstsCfs)) return;
  if ((csts & kCstsRdy) && (csts & kCstsShstMask) != kCstsShstComplete)
    if (!shutdown(false).ok()) LOG_WARN("nvme driver: the controller did not finish its shutdown");
  if (mem_ != nullptr) (void)unmap_memory();  // already unmapped: refused, harmless
}

VfioUserDriver::~VfioUserDriver() {
  detach();
  for (auto& q : queues_)
    if (q.irq_fd >= 0) ::close(q.irq_fd);
  if (doorbell_map_ != nullptr) munmap(doorbell_map_, doorbell_map_len_);
}

uint32_t VfioUserDriver::read32(uint32_t reg) {
  uint32_t v = 0xffffffffu;  // what a PCIe read of a gone device returns
  (void)client_->region_read(vu::kBar0, reg, &v, 4);
  return v;
}
uint64_t VfioUserDriver::read64(uint32_t reg) {
  uint64_t v = ~uint64_t{0};
  (void)client_->region_read(vu::kBar0, reg, &v, 8);
  return v;
}
Status VfioUserDriver::write32(uint32_t reg, uint32_t v) {
  return client_->region_write(vu::kBar0, reg, &v, 4);
}
Status VfioUserDriver::write64(uint32_t reg, uint64_t v) {
  return client_->region_write(vu::kBar0, reg, &v, 8);
}

Status VfioUserDriver::map_memory() {
  return client_->dma_map(kIovaBase, mem_->size(), mem_->fd(), 0, vu::kDmaRead_ | vu::kDmaWrite_);
}

Status VfioUserDriver::unmap_memory() {
  return client_->dma_unmap(kIovaBase, mem_->size());
}

Status VfioUserDriver::alloc(size_t len, DmaBuffer* out) {
  size_t n = (len + kPage - 1) / kPage * kPage;
  if (n == 0 || n > mem_->size() - mem_used_) return Code::kNoMemory;
  out->host = static_cast<uint8_t*>(mem_->data()) + mem_used_;
  out->iova = kIovaBase + mem_used_;
  out->len = n;
  std::memset(out->host, 0, n);
  mem_used_ += n;
  return Code::kSuccess;
}

Status VfioUserDriver::wait_ready(bool ready) {
  uint64_t deadline = monotonic_ms() + timeout_ms_;
  for (;;) {
    uint32_t csts = read32(kRegCsts);
    if (csts == 0xffffffffu) return Code::kConnectionReset;
    if (ready && (csts & kCstsCfs)) return Code::kIoFailed;
    if (((csts & kCstsRdy) != 0) == ready) return Code::kSuccess;
    if (monotonic_ms() > deadline) return Code::kTimeout;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

Status VfioUserDriver::reset_controller() {
  uint32_t cc = read32(kRegCc);
  if (Status st = write32(kRegCc, cc & ~kCcEn); !st.ok()) return st;
  return wait_ready(false);
}

// A PCI capability, found as a driver finds it: by walking the capability list
// from the pointer at 0x34 (ids and next pointers, bounded).
Status VfioUserDriver::find_capability(uint8_t id, uint16_t* offset) {
  uint8_t pos = 0;
  if (Status st = client_->region_read(vu::kConfig, 0x34, &pos, 1); !st.ok()) return st;
  for (int hops = 0; hops < 48 && pos >= 0x40; ++hops) {
    uint8_t hdr[2] = {};
    if (Status st = client_->region_read(vu::kConfig, pos & 0xfc, hdr, 2); !st.ok()) return st;
    if (hdr[0] == id) {
      *offset = pos & 0xfc;
      return Code::kSuccess;
    }
    pos = hdr[1];
  }
  return Code::kNotFound;
}

// PCI COMMAND as SPDK's host sets it: memory space, bus master, and INTx
// disabled. A target that sees INTx enabled counts it as an interrupt mode and
// tries to signal completions through it (SPDK's fails the controller when it
// has no eventfd for it). With interrupts, MSI-X is enabled in its capability.
Status VfioUserDriver::setup_pci_function() {
  uint16_t cmd = 0x0406;
  if (Status st = client_->region_write(vu::kConfig, 0x04, &cmd, 2); !st.ok()) return st;
  if (!opts_.interrupts) return Code::kSuccess;
  uint16_t msix = 0;
  if (Status st = find_capability(0x11, &msix); !st.ok()) {
    LOG_ERR("nvme driver: interrupts asked for, but the function has no MSI-X capability");
    return Code::kNotSupported;
  }
  uint16_t ctl = 0;
  uint32_t table = 0;
  if (Status st = client_->region_read(vu::kConfig, msix + 2u, &ctl, 2); !st.ok()) return st;
  if (Status st = client_->region_read(vu::kConfig, msix + 4u, &table, 4); !st.ok()) return st;
  // Each vector this driver uses is unmasked in the table (vector control resets
  // to masked), then MSI-X is enabled without the function mask.
  const uint32_t bir = table & 7, base = table & ~7u;
  if (bir > vu::kBar5 || queues_.size() > (ctl & 0x7ffu) + 1u) return Code::kNotSupported;
  // A target that leaves the table to its client (SPDK's, as QEMU emulates it)
  // refuses the write: it masks with SET_IRQS only, and nothing is masked there.
  for (uint32_t v = 0; v < queues_.size(); ++v) {
    uint32_t vector_control = 0;
    if (!client_->region_write(bir, base + 16 * v + 12, &vector_control, 4).ok()) {
      LOG_DBG("nvme driver: the MSI-X table is not the target's; masks through SET_IRQS only");
      break;
    }
  }
  ctl = static_cast<uint16_t>((ctl | 0x8000) & ~0x4000);
  return client_->region_write(vu::kConfig, msix + 2u, &ctl, 2);
}

// CSTS as a driver reads it when something takes too long: a gone device reads
// all ones; Controller Fatal Status means no command will complete.
Status VfioUserDriver::check_controller() {
  const uint32_t csts = read32(kRegCsts);
  if (csts == 0xffffffffu) return Code::kConnectionReset;
  if (csts & kCstsCfs) {
    if (!fatal_logged_) LOG_ERR("nvme driver: the controller reports fatal status (CSTS.CFS)");
    fatal_logged_ = true;
    return Code::kIoFailed;
  }
  return Code::kSuccess;
}

Status VfioUserDriver::function_level_reset() {
  uint16_t cap = 0;
  if (Status st = find_capability(0x10, &cap); !st.ok()) {  // PCI Express
    LOG_ERR("nvme: the function has no PCI Express capability (no function level reset)");
    return Code::kNotSupported;
  }
  uint16_t devctl = 0x8000;  // Device Control: Initiate Function Level Reset
  if (Status st = client_->region_write(vu::kConfig, cap + 8u, &devctl, 2); !st.ok()) return st;
  return setup_pci_function();  // FLR cleared the command register and MSI-X
}

Status VfioUserDriver::shutdown(bool abrupt) {
  uint32_t cc = read32(kRegCc);
  cc = (cc & ~(3u << 14)) | ((abrupt ? 2u : 1u) << 14);
  if (Status st = write32(kRegCc, cc); !st.ok()) return st;
  uint64_t deadline = monotonic_ms() + timeout_ms_;
  while ((read32(kRegCsts) & kCstsShstMask) != kCstsShstComplete) {
    if (monotonic_ms() > deadline) return Code::kTimeout;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return Code::kSuccess;
}

Status VfioUserDriver::initialize() {
  cap_ = read64(kRegCap);
  if (cap_ == ~uint64_t{0}) return Code::kConnectionReset;
  timeout_ms_ = std::max<uint32_t>(500, static_cast<uint32_t>((cap_ >> 24) & 0xff) * 500);
  uint32_t mqes = static_cast<uint32_t>(cap_ & 0xffff) + 1;
  if (opts_.queue_entries > mqes) opts_.queue_entries = mqes;
  if (read32(kRegCc) & kCcEn)
    if (Status st = reset_controller(); !st.ok()) return st;
  // Queue memory is carved again on every bring-up; everything before the mark
  // (nothing today) survives.
  mem_used_ = mem_reset_mark_;
  Queue& a = queues_[0];
  int irq_fd = a.irq_fd;
  a = Queue{};
  a.irq_fd = irq_fd;
  a.entries = kAdminEntries;
  if (Status st = alloc(kAdminEntries * sizeof(Sqe), &a.sq); !st.ok()) return st;
  if (Status st = alloc(kAdminEntries * sizeof(Cqe), &a.cq); !st.ok()) return st;
  a.prp_lists.resize(kAdminEntries);
  for (auto& l : a.prp_lists)
    if (Status st = alloc(kPage, &l); !st.ok()) return st;
  (void)write32(kRegAqa, (kAdminEntries - 1) << 16 | (kAdminEntries - 1));
  (void)write64(kRegAsq, a.sq.iova);
  (void)write64(kRegAcq, a.cq.iova);
  if (Status st = write32(kRegCc, kCcEn | 6u << 16 | 4u << 20); !st.ok()) return st;
  if (Status st = wait_ready(true); !st.ok()) return st;

  uint8_t id[kIdentifySize];
  uint16_t status = 0;
  if (Status st = identify(kCnsController, 0, id, &status); !st.ok() || status != kSuccess)
    return Code::kIoFailed;
  max_transfer_ = id[77] == 0 ? (1u << 20) : std::min<uint32_t>(1u << 20, kPage << id[77]);
  if (Status st = identify(kCnsActiveNsList, 0, id, &status); !st.ok() || status != kSuccess)
    return Code::kIoFailed;
  active_ns_.clear();
  for (size_t i = 0; i < 1024; ++i) {
    uint32_t nsid;
    std::memcpy(&nsid, id + 4 * i, 4);
    if (nsid == 0) break;
    active_ns_.push_back(nsid);
  }
  // Per-namespace geometry indexed by nsid; ids beyond the list's 1024 entries
  // are not tracked (no controller here has them).
  constexpr uint32_t kMaxTrackedNsid = 1024;
  ns_block_size_.assign(kMaxTrackedNsid + 1, 0);
  ns_blocks_.assign(kMaxTrackedNsid + 1, 0);
  for (uint32_t nsid : active_ns_) {
    if (nsid > kMaxTrackedNsid) continue;
    if (Status st = identify(kCnsNamespace, nsid, id, &status); !st.ok() || status != kSuccess)
      return Code::kIoFailed;
    uint64_t nsze;
    std::memcpy(&nsze, id, 8);
    ns_blocks_[nsid] = nsze;
    ns_block_size_[nsid] = 1u << id[128 + 2 + 4 * (id[26] & 0xf)];
  }
  return create_io_queues();
}

Status VfioUserDriver::create_io_queues() {
  uint32_t want = static_cast<uint32_t>(queues_.size()) - 1;
  Sqe c{};
  c.opc = kAdminSetFeatures;
  c.cdw10 = kFeatNumQueues;
  c.cdw11 = (want - 1) | (want - 1) << 16;
  Cqe e{};
  if (Status st = admin(c, &e); !st.ok()) return st;
  if (status_of_cqe(e.status) != kSuccess) return Code::kIoFailed;
  uint32_t granted = std::min((e.dw0 & 0xffff) + 1, (e.dw0 >> 16) + 1);
  if (granted < want) {
    LOG_WARN("nvme driver: controller grants %u I/O queues of %u", granted, want);
    return Code::kNoMemory;
  }
  prp_pages_per_slot_ = max_transfer_ > 2 * kPage ? 1 : 0;  // 512 entries cover 2 MiB
  for (uint32_t i = 1; i <= want; ++i) {
    Queue& q = queues_[i];
    int irq_fd = q.irq_fd;
    q = Queue{};
    q.irq_fd = irq_fd;
    q.qid = static_cast<uint16_t>(i);
    q.entries = opts_.queue_entries;
    if (Status st = alloc(q.entries * sizeof(Sqe), &q.sq); !st.ok()) return st;
    if (Status st = alloc(q.entries * sizeof(Cqe), &q.cq); !st.ok()) return st;
    q.prp_lists.resize(prp_pages_per_slot_ ? q.entries : 0);
    for (auto& l : q.prp_lists)
      if (Status st = alloc(kPage, &l); !st.ok()) return st;
    Sqe cq{};
    cq.opc = kAdminCreateCq;
    cq.prp1 = q.cq.iova;
    cq.cdw10 = (q.entries - 1) << 16 | i;
    cq.cdw11 = 1u | (opts_.interrupts ? 2u : 0u) | i << 16;
    if (Status st = admin(cq, &e); !st.ok()) return st;
    if (status_of_cqe(e.status) != kSuccess) return Code::kIoFailed;
    Sqe sq{};
    sq.opc = kAdminCreateSq;
    sq.prp1 = q.sq.iova;
    sq.cdw10 = (q.entries - 1) << 16 | i;
    sq.cdw11 = 1u | i << 16;
    if (Status st = admin(sq, &e); !st.ok()) return st;
    if (status_of_cqe(e.status) != kSuccess) return Code::kIoFailed;
  }
  return Code::kSuccess;
}

void VfioUserDriver::ring(uint32_t offset, uint32_t value) {
  if (doorbells_ != nullptr)
    __atomic_store_n(&doorbells_[offset / 4], value, __ATOMIC_RELEASE);
  else
    (void)client_->region_write(vu::kBar0, kDoorbellBase + offset, &value, 4);
}

void VfioUserDriver::ring_doorbell_raw(uint32_t offset, uint32_t value) {
  ring(offset, value);
}

Status VfioUserDriver::build_prps(Queue& q, uint16_t slot, uint64_t iova, uint64_t len, Sqe* cmd) {
  cmd->prp1 = iova;
  cmd->prp2 = 0;
  uint64_t first = std::min<uint64_t>(len, kPage - (iova & (kPage - 1)));
  uint64_t left = len - first;
  if (left == 0) return Code::kSuccess;
  uint64_t next = iova + first;
  if (left <= kPage) {
    cmd->prp2 = next;
    return Code::kSuccess;
  }
  if (slot >= q.prp_lists.size() || left > 511ull * kPage) return Code::kTooBig;
  DmaBuffer& l = q.prp_lists[slot];
  uint64_t* e = reinterpret_cast<uint64_t*>(l.host);
  size_t n = 0;
  for (; left > 0; ++n) {
    e[n] = next;
    uint64_t b = std::min<uint64_t>(left, kPage);
    next += b;
    left -= b;
  }
  cmd->prp2 = l.iova;
  return Code::kSuccess;
}

Status VfioUserDriver::submit_raw(uint32_t qi, const Sqe& cmd) {
  Queue& q = queues_[qi];
  std::memcpy(reinterpret_cast<Sqe*>(q.sq.host) + q.sq_tail, &cmd, sizeof cmd);
  q.sq_tail = q.sq_tail + 1 == q.entries ? 0 : q.sq_tail + 1;
  ring(8 * q.qid, q.sq_tail);
  return Code::kSuccess;
}

Status VfioUserDriver::admin(Sqe cmd, Cqe* cqe, const DmaBuffer* data, int timeout_ms) {
  Queue& a = queues_[0];
  cmd.cid = a.next_cid++ % kAdminEntries;
  if (data != nullptr)
    if (Status st = build_prps(a, cmd.cid, data->iova, data->len, &cmd); !st.ok()) return st;
  (void)submit_raw(0, cmd);
  // Other completions (an AER answered late) are skipped: wait for this cid.
  uint64_t now = monotonic_ms(), deadline = now + static_cast<uint64_t>(timeout_ms);
  uint64_t next_check = now + kCheckControllerMs;
  for (;;) {
    Cqe e;
    if (reap(static_cast<uint32_t>(-1), &e, 1) == 1) {
      if (e.cid == cmd.cid) {
        *cqe = e;
        return Code::kSuccess;
      }
      if (stray_.size() < 64) stray_.push_back(e);
      continue;
    }
    now = monotonic_ms();
    if (now >= next_check) {
      if (Status st = check_controller(); !st.ok()) return st;
      next_check = now + kCheckControllerMs;
    }
    if (now > deadline) return Code::kTimeout;
  }
}

Status VfioUserDriver::identify(uint8_t cns, uint32_t nsid, uint8_t* out4k, uint16_t* status) {
  DmaBuffer b;
  size_t mark = mem_used_;
  if (Status st = alloc(kIdentifySize, &b); !st.ok()) return st;
  Sqe c{};
  c.opc = kAdminIdentify;
  c.nsid = nsid;
  c.cdw10 = cns;
  Cqe e{};
  Status st = admin(c, &e, &b);
  if (st.ok()) {
    *status = status_of_cqe(e.status);
    std::memcpy(out4k, b.host, kIdentifySize);
  }
  mem_used_ = mark;  // scratch
  return st;
}

Status VfioUserDriver::submit(uint32_t qi, Sqe cmd, const DmaBuffer* buf, uint64_t len,
                              uint16_t* cid_out) {
  Queue& q = queues_[qi + 1];
  if (buf != nullptr)
    if (Status st = build_prps(q, cmd.cid, buf->iova, len, &cmd); !st.ok()) return st;
  if (cid_out != nullptr) *cid_out = cmd.cid;
  return submit_raw(qi + 1, cmd);
}

// q == -1 (as unsigned) is the admin queue; others are I/O queue indices.
int VfioUserDriver::reap(uint32_t qi, Cqe* out, int max) {
  Queue& q = queues_[qi == static_cast<uint32_t>(-1) ? 0 : qi + 1];
  const Cqe* cq = reinterpret_cast<const Cqe*>(q.cq.host);
  int n = 0;
  while (n < max) {
    const Cqe* e = &cq[q.cq_head];
    uint32_t last = __atomic_load_n(reinterpret_cast<const uint32_t*>(&e->cid), __ATOMIC_ACQUIRE);
    if (((last >> 16) & 1) != (q.phase ? 1u : 0u)) break;
    std::memcpy(&out[n], e, sizeof(Cqe));
    ++n;
    if (++q.cq_head == q.entries) {
      q.cq_head = 0;
      q.phase = !q.phase;
    }
  }
  if (n > 0) ring(8 * q.qid + 4, q.cq_head);
  return n;
}

Status VfioUserDriver::wait_interrupt(uint32_t qi, int timeout_ms) {
  Queue& q = queues_[qi == static_cast<uint32_t>(-1) ? 0 : qi + 1];
  if (q.irq_fd < 0) return Code::kBadState;
  pollfd p{q.irq_fd, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) != 1) return Code::kTimeout;
  uint64_t v;
  if (::read(q.irq_fd, &v, sizeof v) == sizeof v) irqs_seen_ += static_cast<uint32_t>(v);
  return Code::kSuccess;
}

Status VfioUserDriver::wait_one(uint32_t qi, Cqe* out, int timeout_ms) {
  uint64_t now = monotonic_ms(), deadline = now + static_cast<uint64_t>(timeout_ms);
  uint64_t next_check = now + kCheckControllerMs;
  for (;;) {
    if (reap(qi, out, 1) == 1) return Code::kSuccess;
    now = monotonic_ms();
    if (now >= next_check) {
      if (Status st = check_controller(); !st.ok()) return st;
      next_check = now + kCheckControllerMs;
    }
    if (now > deadline) return Code::kTimeout;
    if (opts_.interrupts) (void)wait_interrupt(qi, 10);
  }
}

}  // namespace dpukv::nvme
