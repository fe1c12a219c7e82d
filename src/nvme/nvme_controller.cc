#include "nvme/nvme_controller.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "runtime/log.h"

namespace dpukv::nvme {
namespace {

constexpr uint16_t kCommandSequenceError = make_status(kSctGeneric, 0x0c);
constexpr uint32_t kAerLimit = 4;  // AERL + 1
constexpr uint32_t kAbortLimit = 4;
constexpr uint32_t kSmartLogSize = 512, kFirmwareLogSize = 512, kErrorEntrySize = 64;

uint32_t load_acquire(const uint32_t* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

void put16(uint8_t* p, uint16_t v) {
  std::memcpy(p, &v, 2);
}
void put32(uint8_t* p, uint32_t v) {
  std::memcpy(p, &v, 4);
}
void put64(uint8_t* p, uint64_t v) {
  std::memcpy(p, &v, 8);
}
// ASCII fields are space padded, not NUL terminated.
void put_ascii(uint8_t* p, size_t n, const std::string& s) {
  std::memset(p, ' ', n);
  std::memcpy(p, s.data(), std::min(n, s.size()));
}

}  // namespace

NvmeController::NvmeController(const ControllerConfig& cfg, DmaMapTable* dma, InterruptSink* irq,
                               uint32_t* doorbells)
    : cfg_(cfg), dma_(dma), irq_(irq), db_(doorbells) {
  cfg_.max_io_queues = std::clamp<uint16_t>(cfg_.max_io_queues, 1, kMaxQueuePairs - 1);
  cfg_.num_vectors = std::clamp<uint16_t>(cfg_.num_vectors, 1, 2048);
  cfg_.mqes = std::clamp<uint16_t>(cfg_.mqes, 1, 0xffff);
  cap_ = uint64_t{cfg_.mqes} | (uint64_t{1} << 16)     // CQR: queues physically contiguous
         | (uint64_t{15} << 24)                        // TO: 7.5 s to become ready
         | (uint64_t{1} << 37)                         // CSS: NVM command set
         | (uint64_t{0} << 48) | (uint64_t{4} << 52);  // MPSMIN 4 KiB, MPSMAX 64 KiB
  sqs_.resize(cfg_.max_io_queues + 1u);
  cqs_.resize(cfg_.max_io_queues + 1u);
  allocated_queues_ = cfg_.max_io_queues;
  requests_.resize(kMaxInflight);
  for (auto& r : requests_) {
    r.ctrl = this;
    free_requests_.push_back(&r);
  }
  aer_cids_.reserve(kAerLimit);
  events_.reserve(16);
}

NvmeController::~NvmeController() {
  drain_inflight();
}

Status NvmeController::add_namespace(uint32_t nsid, std::shared_ptr<Bdev> bdev) {
  if (nsid == 0 || nsid > kMaxNamespaces || !bdev) return Code::kInvalidValue;
  if (ns_[nsid]) return Code::kBadState;
  if (std::find(distinct_bdevs_.begin(), distinct_bdevs_.end(), bdev.get()) ==
      distinct_bdevs_.end())
    distinct_bdevs_.push_back(bdev.get());
  ns_[nsid] = std::move(bdev);
  return Code::kSuccess;
}

Status NvmeController::remove_namespace(uint32_t nsid) {
  if (nsid == 0 || nsid > kMaxNamespaces || !ns_[nsid]) return Code::kNotFound;
  drain_inflight();
  Bdev* b = ns_[nsid].get();
  ns_[nsid].reset();
  bool still_used = false;
  for (const auto& n : ns_) still_used |= n.get() == b;
  if (!still_used) std::erase(distinct_bdevs_, b);
  return Code::kSuccess;
}

// ---- registers --------------------------------------------------------------

uint64_t NvmeController::read_reg(uint32_t offset, uint32_t size) const {
  uint8_t file[kRegEnd] = {};
  put64(file + kRegCap, cap_);
  put32(file + kRegVs, 0x00010400);  // NVMe 1.4
  put32(file + kRegIntms, intms_);
  put32(file + kRegIntmc, intms_);
  put32(file + kRegCc, cc_);
  put32(file + kRegCsts, csts_);
  put32(file + kRegAqa, aqa_);
  put64(file + kRegAsq, asq_);
  put64(file + kRegAcq, acq_);
  uint64_t v = 0;
  if (size >= 1 && size <= 8 && offset < kRegEnd && size <= kRegEnd - offset)
    std::memcpy(&v, file + offset, size);
  return v;  // registers beyond 0x40 (CMB, BP, PMR) are not implemented: read 0
}

void NvmeController::write_reg(uint32_t offset, uint32_t size, uint64_t value) {
  if ((size != 4 && size != 8) || offset % 4 != 0) {
    LOG_WARN("nvme: ignored %u-byte register write at 0x%x", size, offset);
    return;
  }
  if (size == 8) {  // a 64-bit access is two dword accesses, low first
    write_reg(offset, 4, value & 0xffffffffu);
    write_reg(offset + 4, 4, value >> 32);
    return;
  }
  uint32_t v = static_cast<uint32_t>(value);
  switch (offset) {
    case kRegIntms:
      intms_ |= v;
      break;
    case kRegIntmc:
      intms_ &= ~v;
      break;
    case kRegCc:
      write_cc(v);
      break;
    case kRegAqa:
      if (!(cc_ & kCcEn)) aqa_ = v & 0x0fff0fffu;
      break;
    case kRegAsq:
      if (!(cc_ & kCcEn)) asq_ = (asq_ & ~uint64_t{0xffffffff}) | (v & ~0xfffu);
      break;
    case kRegAsq + 4:
      if (!(cc_ & kCcEn)) asq_ = (asq_ & 0xffffffffu) | uint64_t{v} << 32;
      break;
    case kRegAcq:
      if (!(cc_ & kCcEn)) acq_ = (acq_ & ~uint64_t{0xffffffff}) | (v & ~0xfffu);
      break;
    case kRegAcq + 4:
      if (!(cc_ & kCcEn)) acq_ = (acq_ & 0xffffffffu) | uint64_t{v} << 32;
      break;
    case kRegNssr:  // NVM subsystem reset is not supported (CAP.NSSRS = 0)
    default:
      break;  // read-only or reserved: writes have no effect
  }
}

void NvmeController::write_cc(uint32_t v) {
  uint32_t old = cc_;
  cc_ = v & 0x00fffff1u;  // EN, CSS, MPS, AMS, SHN, IOSQES, IOCQES
  if (cc_shn(cc_) != 0 && cc_shn(old) == 0) {
    // Normal or abrupt shutdown: stop taking commands, finish what is in flight,
    // flush the media, then report completion.
    drain_inflight();
    for (Bdev* b : distinct_bdevs_) {
      BdevIo io;
      io.op = BdevOp::kFlush;
      io.done = [](BdevIo*, Status) {};
      b->submit(&io);
      while (b->inflight() > 0) b->poll();
    }
    csts_ = (csts_ & ~kCstsShstMask) | kCstsShstComplete;
  } else if (cc_shn(cc_) == 0 && cc_shn(old) != 0) {
    csts_ &= ~kCstsShstMask;
  }
  if (!(old & kCcEn) && (cc_ & kCcEn)) {
    enable();
  } else if ((old & kCcEn) && !(cc_ & kCcEn)) {
    controller_reset();
  }
}

void NvmeController::enable() {
  uint32_t mps = cc_mps(cc_);
  uint32_t mpsmin = (cap_ >> 48) & 0xf, mpsmax = (cap_ >> 52) & 0xf;
  if (cc_css(cc_) != 0 || mps < mpsmin || mps > mpsmax || cc_ams(cc_) != 0)
    return fatal("CC.EN set with an unsupported CSS, MPS or AMS");
  uint32_t sq_entries = (aqa_ & 0xfff) + 1, cq_entries = ((aqa_ >> 16) & 0xfff) + 1;
  if (sq_entries < 2 || cq_entries < 2) return fatal("AQA: admin queues need at least 2 entries");
  auto* sq = reinterpret_cast<const Sqe*>(
      dma_->translate(asq_, uint64_t{sq_entries} * 64, DmaMapTable::kRead));
  auto* cq =
      reinterpret_cast<Cqe*>(dma_->translate(acq_, uint64_t{cq_entries} * 16, DmaMapTable::kWrite));
  if (sq == nullptr || cq == nullptr) return fatal("ASQ/ACQ outside the host's DMA windows");
  Cq& c = cqs_[0];
  c = Cq{};
  c.active = true;
  c.size = cq_entries;
  c.iova = acq_;
  c.base = cq;
  c.ien = true;
  c.sq_refs = 1;
  Sq& s = sqs_[0];
  s = Sq{};
  s.active = true;
  s.size = sq_entries;
  s.iova = asq_;
  s.base = sq;
  active_sqs_.assign(1, 0);
  db_[0] = 0;
  db_[1] = 0;
  csts_ = (csts_ & ~kCstsCfs) | kCstsRdy;
  LOG_INFO("nvme: controller ready (admin SQ %u, CQ %u entries, %u-byte pages)", sq_entries,
           cq_entries, page_size());
}

void NvmeController::controller_reset() {
  drain_inflight();
  delete_io_queues();
  sqs_[0] = Sq{};
  cqs_[0] = Cq{};
  active_sqs_.clear();
  aer_cids_.clear();
  events_.clear();
  event_masked_.fill(false);
  allocated_queues_ = cfg_.max_io_queues;
  queues_created_since_reset_ = false;
  std::memset(db_, 0, kDoorbellPageSize);
  csts_ &= ~(kCstsRdy | kCstsCfs);
}

void NvmeController::function_reset() {
  controller_reset();
  cc_ = csts_ = aqa_ = intms_ = 0;
  asq_ = acq_ = 0;
  feat_arbitration_ = feat_power_ = feat_error_recovery_ = feat_coalescing_ = feat_aec_ = 0;
  feat_kato_ = feat_write_atomicity_ = 0;
  feat_vwc_ = 1;
  temp_over_ = 343;
  temp_under_ = 0;
  critical_warning_ = 0;
}

void NvmeController::fatal(const char* why) {
  LOG_ERR("nvme: controller fatal status: %s", why);
  ++stats_.fatal;
  drain_inflight();
  delete_io_queues();
  active_sqs_.clear();
  sqs_[0] = Sq{};
  cqs_[0] = Cq{};
  csts_ = (csts_ & ~kCstsRdy) | kCstsCfs;
}

void NvmeController::release_dma(uint64_t iova, uint64_t len) {
  drain_inflight();
  bool hit = false;
  for (size_t i = 0; i < sqs_.size(); ++i) {
    if (sqs_[i].active && sqs_[i].iova < iova + len && iova < sqs_[i].iova + sqs_[i].size * 64ull)
      hit = true;
    if (cqs_[i].active && cqs_[i].iova < iova + len && iova < cqs_[i].iova + cqs_[i].size * 16ull)
      hit = true;
  }
  if (hit) fatal("the host unmapped memory that holds a live queue");
}

void NvmeController::write_doorbell(uint32_t offset, uint32_t value) {
  if (offset >= kDoorbellPageSize || offset % 4 != 0) return;
  uint32_t qid = offset / 8;
  bool is_cq = (offset % 8) != 0;
  bool exists = qid < sqs_.size() && (is_cq ? cqs_[qid].active : sqs_[qid].active);
  if (!exists) {
    ++stats_.invalid_doorbells;
    queue_event(kAerError, kAerInfoInvalidDoorbell, kLogError);
    return;
  }
  __atomic_store_n(&db_[offset / 4], value, __ATOMIC_RELEASE);
}

uint32_t NvmeController::active_io_queues() const {
  uint32_t n = 0;
  for (size_t i = 1; i < sqs_.size(); ++i) n += sqs_[i].active;
  return n;
}

// ---- queues -----------------------------------------------------------------

int NvmeController::poll() {
  int work = 0;
  for (Bdev* b : distinct_bdevs_) work += b->poll();
  if (!(csts_ & kCstsRdy)) return work;
  for (size_t i = 0; i < active_sqs_.size(); ++i) work += process_sq(sqs_[active_sqs_[i]]);
  if (work > 0) {
    for (uint16_t qid : active_sqs_) {
      Cq& cq = cqs_[sqs_[qid].cqid];
      if (!cq.irq_pending) continue;
      cq.irq_pending = false;
      ++stats_.interrupts;
      irq_->raise(cq.vector);
    }
  }
  return work;
}

uint32_t NvmeController::cq_free(Cq& cq) {
  uint32_t h = load_acquire(&db_[2 * cq.id + 1]);
  if (h < cq.size) {
    cq.head = h;
    cq.bad_doorbell = false;
  } else if (!cq.bad_doorbell) {
    cq.bad_doorbell = true;
    ++stats_.invalid_doorbells;
    queue_event(kAerError, kAerInfoInvalidDoorbellValue, kLogError);
  }
  uint32_t used = (cq.tail + cq.size - cq.head) % cq.size;
  uint32_t room = cq.size - 1 - used;
  return room > cq.reserved ? room - cq.reserved : 0;
}

int NvmeController::process_sq(Sq& sq) {
  uint32_t tail = load_acquire(&db_[2 * sq.id]);
  if (tail >= sq.size) {
    if (!sq.bad_doorbell) {
      sq.bad_doorbell = true;
      ++stats_.invalid_doorbells;
      queue_event(kAerError, kAerInfoInvalidDoorbellValue, kLogError);
    }
    return 0;
  }
  sq.bad_doorbell = false;
  if (sq.head == tail) return 0;
  Cq& cq = cqs_[sq.cqid];
  uint32_t room = cq_free(cq);
  int n = 0;
  // A bounded batch keeps one busy queue from starving the others (round robin).
  while (sq.head != tail && room > 0 && !free_requests_.empty() && n < 64) {
    Sqe cmd;
    std::memcpy(&cmd, &sq.base[sq.head], sizeof cmd);
    sq.head = sq.head + 1 == sq.size ? 0 : sq.head + 1;
    ++cq.reserved;
    ++sq.inflight;
    --room;
    ++n;
    if (sq.id == 0)
      admin(cmd);
    else
      io(sq, cmd);
    if (!sq.active) break;  // the command deleted its own queue's controller state
  }
  return n;
}

void NvmeController::post(uint16_t sqid, uint16_t cid, uint16_t status, uint32_t dw0) {
  Sq& sq = sqs_[sqid];
  Cq& cq = cqs_[sq.cqid];
  --sq.inflight;
  --cq.reserved;
  if (status != kSuccess) {
    ++stats_.errors;
  }
  Cqe* e = &cq.base[cq.tail];
  e->dw0 = dw0;
  e->dw1 = 0;
  e->sq_head = static_cast<uint16_t>(sq.head);
  e->sq_id = sqid;
  // The dword with the phase tag goes last: the host may consume the entry as
  // soon as it sees the new phase.
  uint32_t last = uint32_t{cid} | uint32_t{cqe_status(status, cq.phase)} << 16;
  __atomic_store_n(reinterpret_cast<uint32_t*>(&e->cid), last, __ATOMIC_RELEASE);
  if (++cq.tail == cq.size) {
    cq.tail = 0;
    cq.phase = !cq.phase;
  }
  if (cq.ien) cq.irq_pending = true;
}

void NvmeController::delete_io_queues() {
  for (size_t i = 1; i < sqs_.size(); ++i) {
    sqs_[i] = Sq{};
    cqs_[i] = Cq{};
  }
  std::erase_if(active_sqs_, [](uint16_t q) { return q != 0; });
}

// ---- data transfer ----------------------------------------------------------

uint16_t NvmeController::map_prps(uint64_t prp1, uint64_t prp2, uint64_t len, uint32_t prot,
                                  iovec* iov, int* iovcnt) const {
  const uint64_t page = page_size();
  int n = 0;
  auto add = [&](uint64_t addr, uint64_t bytes) -> uint16_t {
    uint8_t* p = dma_->translate(addr, bytes, prot);
    if (p == nullptr) return kDataTransferError;
    if (n > 0 && static_cast<uint8_t*>(iov[n - 1].iov_base) + iov[n - 1].iov_len == p) {
      iov[n - 1].iov_len += bytes;  // contiguous in the host: one segment
    } else {
      if (n == static_cast<int>(kMaxIov)) return kInvalidField;
      iov[n++] = iovec{p, static_cast<size_t>(bytes)};
    }
    return kSuccess;
  };
  if (prp1 & 3) return kPrpOffsetInvalid;
  uint64_t first = std::min(len, page - (prp1 & (page - 1)));
  if (uint16_t s = add(prp1, first); s != kSuccess) return s;
  uint64_t left = len - first;
  if (left == 0) {
    *iovcnt = n;
    return kSuccess;
  }
  if (left <= page) {
    if (prp2 & (page - 1)) return kPrpOffsetInvalid;
    if (uint16_t s = add(prp2, left); s != kSuccess) return s;
    *iovcnt = n;
    return kSuccess;
  }
  // PRP2 points to a list; the last entry of a full list page chains to the next.
  uint64_t list = prp2;
  while (left > 0) {
    if (list & 7) return kPrpOffsetInvalid;
    uint64_t entries = (page - (list & (page - 1))) / 8;
    const uint8_t* lp = dma_->translate(list, entries * 8, DmaMapTable::kRead);
    if (lp == nullptr) return kDataTransferError;
    for (uint64_t i = 0; i < entries && left > 0; ++i) {
      uint64_t e;
      std::memcpy(&e, lp + i * 8, 8);
      if (i == entries - 1 && left > page) {  // chain pointer
        list = e;
        break;
      }
      if (e & (page - 1)) return kPrpOffsetInvalid;
      uint64_t bytes = std::min(left, page);
      if (uint16_t s = add(e, bytes); s != kSuccess) return s;
      left -= bytes;
    }
  }
  *iovcnt = n;
  return kSuccess;
}

uint16_t NvmeController::copy_to_host(const Sqe& cmd, const void* src, size_t len) {
  iovec* iov = scratch_iov_.data();
  int n = 0;
  if (uint16_t s = map_prps(cmd.prp1, cmd.prp2, len, DmaMapTable::kWrite, iov, &n); s != kSuccess)
    return s;
  size_t done = 0;
  for (int i = 0; i < n; ++i) {
    std::memcpy(iov[i].iov_base, static_cast<const uint8_t*>(src) + done, iov[i].iov_len);
    done += iov[i].iov_len;
  }
  return kSuccess;
}

uint16_t NvmeController::copy_from_host(const Sqe& cmd, void* dst, size_t len) {
  iovec* iov = scratch_iov_.data();
  int n = 0;
  if (uint16_t s = map_prps(cmd.prp1, cmd.prp2, len, DmaMapTable::kRead, iov, &n); s != kSuccess)
    return s;
  size_t done = 0;
  for (int i = 0; i < n; ++i) {
    std::memcpy(static_cast<uint8_t*>(dst) + done, iov[i].iov_base, iov[i].iov_len);
    done += iov[i].iov_len;
  }
  return kSuccess;
}

// ---- admin ------------------------------------------------------------------

void NvmeController::admin(const Sqe& cmd) {
  ++stats_.admin_commands;
  uint32_t dw0 = 0;
  uint16_t st;
  if ((cmd.flags & 0xc3) != 0) {  // fused or SGL: not supported
    st = kInvalidField;
  } else {
    switch (cmd.opc) {
      case kAdminIdentify:
        st = identify(cmd);
        break;
      case kAdminGetLogPage:
        st = get_log_page(cmd);
        break;
      case kAdminSetFeatures:
        st = set_features(cmd, &dw0);
        break;
      case kAdminGetFeatures:
        st = get_features(cmd, &dw0);
        break;
      case kAdminCreateCq:
        st = create_cq(cmd);
        break;
      case kAdminCreateSq:
        st = create_sq(cmd);
        break;
      case kAdminDeleteSq:
        st = delete_sq(cmd);
        break;
      case kAdminDeleteCq:
        st = delete_cq(cmd);
        break;
      case kAdminAsyncEvent:
        return async_event_request(cmd);
      case kAdminAbort:
        // Commands here complete before the next one is fetched or are already on
        // the medium; none can be pulled back. Bit 0 set: not aborted.
        dw0 = 1;
        st = kSuccess;
        break;
      case kAdminKeepAlive:
        st = kSuccess;
        break;
      default:
        st = kInvalidOpcode;
        break;
    }
  }
  if (st != kSuccess) record_error(0, cmd.cid, st, 0, cmd.nsid);
  post(0, cmd.cid, st, dw0);
}

// A stable namespace GUID from the serial number and the namespace id.
void NvmeController::nguid(uint32_t nsid, uint8_t* out) const {
  uint64_t h = 0x6470756b766e7630ull ^ (uint64_t{nsid} * 0x9e3779b97f4a7c15ull);
  for (char c : cfg_.serial) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  put64(out, h);
  put64(out + 8, h * 0x9e3779b97f4a7c15ull + nsid);
}

uint16_t NvmeController::identify(const Sqe& cmd) {
  uint8_t cns = cmd.cdw10 & 0xff;
  alignas(8) uint8_t d[kIdentifySize] = {};
  switch (cns) {
    case kCnsController: {
      put16(d + 0, cfg_.vendor_id);
      put16(d + 2, cfg_.vendor_id);
      put_ascii(d + 4, 20, cfg_.serial);
      put_ascii(d + 24, 40, cfg_.model);
      put_ascii(d + 64, 8, cfg_.firmware);
      d[72] = 6;  // RAB
      d[77] = cfg_.mdts;
      put16(d + 78, cfg_.cntlid);
      put32(d + 80, 0x00010400);
      d[111] = 1;  // CNTRLTYPE: I/O controller
      d[258] = kAbortLimit - 1;
      d[259] = kAerLimit - 1;
      d[260] = 0x03;  // FRMW: one slot, read-only
      d[261] = 0x04;  // LPA: extended Get Log Page offsets
      d[262] = static_cast<uint8_t>(error_log_.size() - 1);
      put16(d + 266, 343);  // WCTEMP
      put16(d + 268, 373);  // CCTEMP
      put16(d + 320, 10);   // KAS: 1 s granularity
      d[512] = 0x66;        // SQES: 64 bytes
      d[513] = 0x44;        // CQES: 16 bytes
      put32(d + 516, kMaxNamespaces);
      put16(d + 520, 0x1c);  // ONCS: DSM, Write Zeroes, Save/Select in features
      d[525] = 0x07;         // VWC present; flush with NSID all supported
      std::memcpy(d + 768, cfg_.subnqn.data(), std::min<size_t>(cfg_.subnqn.size(), 255));
      put16(d + 2048, 2500);  // PSD0 max power: 25 W
      break;
    }
    case kCnsNamespace: {
      if (cmd.nsid == 0 || (cmd.nsid > kMaxNamespaces && cmd.nsid != kNsidAll))
        return kInvalidNamespace;
      if (cmd.nsid == kNsidAll) {  // capabilities common to all namespaces
        d[128 + 2] = 12;
        break;
      }
      const Bdev* b = ns_[cmd.nsid].get();
      if (b == nullptr) break;  // allocated but inactive: zeroes
      put64(d + 0, b->num_blocks());
      put64(d + 8, b->num_blocks());
      put64(d + 16, b->num_blocks());
      d[25] = 0;     // NLBAF: one format
      d[26] = 0;     // FLBAS
      d[33] = 0x09;  // DLFEAT: deallocated blocks read zero; Write Zeroes may deallocate
      nguid(cmd.nsid, d + 104);
      d[128 + 2] = static_cast<uint8_t>(std::countr_zero(b->block_size()));  // LBAF0.LBADS
      break;
    }
    case kCnsActiveNsList: {
      if (cmd.nsid >= 0xfffffffeu) return kInvalidNamespace;
      size_t n = 0;
      for (uint32_t id = cmd.nsid + 1; id <= kMaxNamespaces && n < 1024; ++id)
        if (ns_[id]) put32(d + 4 * n++, id);
      break;
    }
    case kCnsNsDescriptors: {
      if (cmd.nsid == 0 || cmd.nsid > kMaxNamespaces || !ns_[cmd.nsid]) return kInvalidNamespace;
      uint8_t nsdata[16];
      nguid(cmd.nsid, nsdata);  // the same NGUID as Identify Namespace: hosts compare them
      d[0] = 2;                 // NIDT: NGUID
      d[1] = 16;
      std::memcpy(d + 4, nsdata, 16);
      break;
    }
    default:
      return kInvalidField;
  }
  return copy_to_host(cmd, d, sizeof d);
}

uint16_t NvmeController::get_log_page(const Sqe& cmd) {
  uint8_t lid = cmd.cdw10 & 0xff;
  bool rae = (cmd.cdw10 >> 15) & 1;
  uint64_t numd = ((uint64_t{cmd.cdw11} & 0xffff) << 16 | (cmd.cdw10 >> 16)) + 1;
  uint64_t offset = uint64_t{cmd.cdw12} | uint64_t{cmd.cdw13} << 32;
  uint64_t len = numd * 4;
  if (len > (uint64_t{page_size()} << cfg_.mdts) || (offset & 3)) return kInvalidField;
  alignas(8) uint8_t log[kIdentifySize] = {};
  uint32_t size;
  switch (lid) {
    case kLogError: {
      size = static_cast<uint32_t>(error_log_.size() * kErrorEntrySize);
      // Newest first, as the log page orders them.
      size_t have = std::min<uint64_t>(error_count_, error_log_.size());
      for (size_t i = 0; i < have; ++i) {
        const ErrorEntry& e = error_log_[(error_count_ - 1 - i) % error_log_.size()];
        uint8_t* p = log + i * kErrorEntrySize;
        put64(p, e.count);
        put16(p + 8, e.sqid);
        put16(p + 10, e.cid);
        put16(p + 12, static_cast<uint16_t>(e.status << 1));
        put16(p + 14, 0xffff);  // parameter location unknown
        put64(p + 16, e.lba);
        put32(p + 24, e.nsid);
      }
      if (!rae) event_masked_[kAerError] = false;
      break;
    }
    case kLogSmart: {
      if (cmd.nsid != 0 && cmd.nsid != kNsidAll) return kInvalidField;  // no per-namespace log
      size = kSmartLogSize;
      log[0] = critical_warning_;
      put16(log + 1, temperature_);
      log[3] = 100;  // available spare
      log[4] = 10;   // spare threshold
      // Data units are thousands of 512-byte units, rounded up.
      put64(log + 32, (stats_.bytes_read / 512 + 999) / 1000);
      put64(log + 48, (stats_.bytes_written / 512 + 999) / 1000);
      put64(log + 64, stats_.reads);
      put64(log + 80, stats_.writes);
      put64(log + 176, error_count_);
      put16(log + 200, temperature_);  // temperature sensor 1
      if (!rae) event_masked_[kAerSmart] = false;
      break;
    }
    case kLogFirmwareSlot:
      size = kFirmwareLogSize;
      log[0] = 1;  // active slot 1
      put_ascii(log + 8, 8, cfg_.firmware);
      break;
    default:
      return kInvalidLogPage;
  }
  if (offset >= size) return kInvalidField;
  std::vector<uint8_t> out(len, 0);  // admin path: a small allocation is fine
  std::memcpy(out.data(), log + offset, std::min<uint64_t>(len, size - offset));
  return copy_to_host(cmd, out.data(), out.size());
}

uint16_t NvmeController::set_features(const Sqe& cmd, uint32_t* dw0) {
  if (cmd.cdw10 >> 31) return kFeatureNotSaveable;
  uint32_t v = cmd.cdw11;
  switch (cmd.cdw10 & 0xff) {
    case kFeatArbitration:
      feat_arbitration_ = v;
      break;
    case kFeatPowerMgmt:
      if ((v & 0x1f) != 0) return kInvalidField;  // one power state (NPSS = 0)
      feat_power_ = v;
      break;
    case kFeatTempThreshold: {
      uint32_t sel = (v >> 16) & 0xf, type = (v >> 20) & 3;
      if (sel != 0 || type > 1) return kInvalidField;  // composite sensor, over/under
      (type == 0 ? temp_over_ : temp_under_) = static_cast<uint16_t>(v & 0xffff);
      bool hot = temperature_ >= temp_over_ || (temp_under_ != 0 && temperature_ <= temp_under_);
      if (hot && !(critical_warning_ & 0x02)) {
        critical_warning_ |= 0x02;
        if (feat_aec_ & 0x02) queue_event(kAerSmart, kAerInfoTemperature, kLogSmart);
      } else if (!hot) {
        critical_warning_ &= ~0x02;
      }
      break;
    }
    case kFeatErrorRecovery:
      feat_error_recovery_ = v & 0x1ffff;
      break;
    case kFeatVolatileWc:
      feat_vwc_ = v & 1;
      break;
    case kFeatNumQueues: {
      if (queues_created_since_reset_) return kCommandSequenceError;
      uint32_t nsq = v & 0xffff, ncq = v >> 16;
      if (nsq == 0xffff || ncq == 0xffff) return kInvalidField;
      allocated_queues_ =
          static_cast<uint16_t>(std::min<uint32_t>({nsq + 1, ncq + 1, cfg_.max_io_queues}));
      uint32_t a = allocated_queues_ - 1u;
      *dw0 = a | a << 16;
      break;
    }
    case kFeatIntCoalescing:
      feat_coalescing_ = v & 0xffff;
      break;
    case kFeatIntVectorConfig:
      if ((v & 0xffff) >= cfg_.num_vectors) return kInvalidField;
      break;
    case kFeatWriteAtomicity:
      feat_write_atomicity_ = v & 1;
      break;
    case kFeatAsyncEventConfig:
      feat_aec_ = v;
      break;
    case kFeatKeepAlive:
      feat_kato_ = v;
      break;
    default:
      return kInvalidField;
  }
  return kSuccess;
}

uint16_t NvmeController::get_features(const Sqe& cmd, uint32_t* dw0) {
  uint32_t sel = (cmd.cdw10 >> 8) & 7;
  uint8_t fid = cmd.cdw10 & 0xff;
  if (sel > 3) return kInvalidField;
  if (sel == 3) {  // supported capabilities: changeable, not saveable
    *dw0 = 0x4;
    return kSuccess;
  }
  bool dflt = sel == 1 || sel == 2;  // nothing is saveable, so saved = default
  switch (fid) {
    case kFeatArbitration:
      *dw0 = dflt ? 0 : feat_arbitration_;
      break;
    case kFeatPowerMgmt:
      *dw0 = dflt ? 0 : feat_power_;
      break;
    case kFeatTempThreshold: {
      uint32_t sel_sensor = (cmd.cdw11 >> 16) & 0xf, type = (cmd.cdw11 >> 20) & 3;
      if (sel_sensor != 0 || type > 1) return kInvalidField;
      *dw0 = type == 0 ? (dflt ? 343u : temp_over_) : (dflt ? 0u : temp_under_);
      break;
    }
    case kFeatErrorRecovery:
      *dw0 = dflt ? 0 : feat_error_recovery_;
      break;
    case kFeatVolatileWc:
      *dw0 = dflt ? 1 : feat_vwc_;
      break;
    case kFeatNumQueues: {
      uint32_t a = (dflt ? cfg_.max_io_queues : allocated_queues_) - 1u;
      *dw0 = a | a << 16;
      break;
    }
    case kFeatIntCoalescing:
      *dw0 = dflt ? 0 : feat_coalescing_;
      break;
    case kFeatIntVectorConfig:
      if ((cmd.cdw11 & 0xffff) >= cfg_.num_vectors) return kInvalidField;
      *dw0 = cmd.cdw11 & 0xffff;
      break;
    case kFeatWriteAtomicity:
      *dw0 = dflt ? 0 : feat_write_atomicity_;
      break;
    case kFeatAsyncEventConfig:
      *dw0 = dflt ? 0 : feat_aec_;
      break;
    case kFeatKeepAlive:
      *dw0 = dflt ? 0 : feat_kato_;
      break;
    default:
      return kInvalidField;
  }
  return kSuccess;
}

uint16_t NvmeController::create_cq(const Sqe& cmd) {
  uint16_t qid = cmd.cdw10 & 0xffff;
  uint32_t qsize = (cmd.cdw10 >> 16) + 1;
  bool pc = cmd.cdw11 & 1, ien = (cmd.cdw11 >> 1) & 1;
  uint16_t iv = static_cast<uint16_t>(cmd.cdw11 >> 16);
  if (qid == 0 || qid > allocated_queues_ || cqs_[qid].active) return kInvalidQueueId;
  if (qsize < 2 || qsize > cfg_.mqes + 1u) return kInvalidQueueSize;
  if (!pc) return kInvalidField;  // CAP.CQR: only physically contiguous queues
  if (cc_iocqes(cc_) != 4) return kInvalidField;
  if (iv >= cfg_.num_vectors) return kInvalidInterruptVector;
  if (cmd.prp1 & (page_size() - 1)) return kPrpOffsetInvalid;
  auto* base =
      reinterpret_cast<Cqe*>(dma_->translate(cmd.prp1, uint64_t{qsize} * 16, DmaMapTable::kWrite));
  if (base == nullptr) return kDataTransferError;
  Cq& c = cqs_[qid];
  c = Cq{};
  c.active = true;
  c.id = qid;
  c.size = qsize;
  c.iova = cmd.prp1;
  c.base = base;
  c.ien = ien;
  c.vector = iv;
  __atomic_store_n(&db_[2 * qid + 1], 0u, __ATOMIC_RELAXED);
  queues_created_since_reset_ = true;
  return kSuccess;
}

uint16_t NvmeController::create_sq(const Sqe& cmd) {
  uint16_t qid = cmd.cdw10 & 0xffff;
  uint32_t qsize = (cmd.cdw10 >> 16) + 1;
  bool pc = cmd.cdw11 & 1;
  uint16_t cqid = static_cast<uint16_t>(cmd.cdw11 >> 16);
  if (qid == 0 || qid > allocated_queues_ || sqs_[qid].active) return kInvalidQueueId;
  if (qsize < 2 || qsize > cfg_.mqes + 1u) return kInvalidQueueSize;
  if (!pc) return kInvalidField;
  if (cc_iosqes(cc_) != 6) return kInvalidField;
  if (cqid == 0 || cqid >= cqs_.size() || !cqs_[cqid].active) return kCqInvalid;
  if (cmd.prp1 & (page_size() - 1)) return kPrpOffsetInvalid;
  auto* base = reinterpret_cast<const Sqe*>(
      dma_->translate(cmd.prp1, uint64_t{qsize} * 64, DmaMapTable::kRead));
  if (base == nullptr) return kDataTransferError;
  Sq& s = sqs_[qid];
  s = Sq{};
  s.active = true;
  s.id = qid;
  s.size = qsize;
  s.iova = cmd.prp1;
  s.base = base;
  s.cqid = cqid;
  ++cqs_[cqid].sq_refs;
  __atomic_store_n(&db_[2 * qid], 0u, __ATOMIC_RELAXED);
  active_sqs_.push_back(qid);
  queues_created_since_reset_ = true;
  return kSuccess;
}

uint16_t NvmeController::delete_sq(const Sqe& cmd) {
  uint16_t qid = cmd.cdw10 & 0xffff;
  if (qid == 0 || qid >= sqs_.size() || !sqs_[qid].active) return kInvalidQueueId;
  Sq& s = sqs_[qid];
  // Commands still on the medium finish first: their completions go to the CQ
  // before the deletion's own completion, as the host expects.
  while (s.inflight > 0)
    for (Bdev* b : distinct_bdevs_) b->poll();
  // Commands the host submitted but the controller never fetched are dropped; the
  // reservation they would have needed was never taken.
  --cqs_[s.cqid].sq_refs;
  s = Sq{};
  std::erase(active_sqs_, qid);
  return kSuccess;
}

uint16_t NvmeController::delete_cq(const Sqe& cmd) {
  uint16_t qid = cmd.cdw10 & 0xffff;
  if (qid == 0 || qid >= cqs_.size() || !cqs_[qid].active) return kInvalidQueueId;
  if (cqs_[qid].sq_refs > 0) return kInvalidQueueDeletion;
  cqs_[qid] = Cq{};
  return kSuccess;
}

void NvmeController::async_event_request(const Sqe& cmd) {
  if (aer_cids_.size() >= kAerLimit) {
    record_error(0, cmd.cid, kAerLimitExceeded, 0, 0);
    post(0, cmd.cid, kAerLimitExceeded, 0);
    return;
  }
  aer_cids_.push_back(cmd.cid);  // completes when an event arrives; keeps its CQ slot
  deliver_events();
}

void NvmeController::queue_event(uint8_t type, uint8_t info, uint8_t log_page) {
  if (type >= event_masked_.size() || event_masked_[type]) return;
  for (const Event& e : events_)
    if (e.type == type && e.info == info) return;
  if (events_.size() < 16) events_.push_back(Event{type, info, log_page});
  deliver_events();
}

void NvmeController::deliver_events() {
  if (!(csts_ & kCstsRdy)) return;
  while (!aer_cids_.empty() && !events_.empty()) {
    Event e = events_.front();
    events_.erase(events_.begin());
    if (event_masked_[e.type]) continue;
    event_masked_[e.type] = true;  // until the host reads the log page
    uint16_t cid = aer_cids_.front();
    aer_cids_.erase(aer_cids_.begin());
    post(0, cid, kSuccess, uint32_t{e.type} | uint32_t{e.info} << 8 | uint32_t{e.log} << 16);
    cqs_[0].irq_pending = true;
  }
}

void NvmeController::record_error(uint16_t sqid, uint16_t cid, uint16_t status, uint64_t lba,
                                  uint32_t nsid) {
  ErrorEntry& e = error_log_[error_count_ % error_log_.size()];
  e = ErrorEntry{++error_count_, sqid, cid, status, lba, nsid};
}

// ---- I/O --------------------------------------------------------------------

NvmeController::Request* NvmeController::alloc_request() {
  Request* r = free_requests_.back();
  free_requests_.pop_back();
  ++inflight_;
  return r;
}

void NvmeController::free_request(Request* r) {
  free_requests_.push_back(r);
  --inflight_;
}

void NvmeController::io(Sq& sq, const Sqe& cmd) {
  ++stats_.io_commands;
  Request* r = alloc_request();
  r->sqid = sq.id;
  r->cid = cmd.cid;
  r->opc = cmd.opc;
  r->nsid = cmd.nsid;
  r->slba = uint64_t{cmd.cdw10} | uint64_t{cmd.cdw11} << 32;
  r->io = BdevIo{};
  r->io.done = &NvmeController::bdev_done;
  r->io.ctx = r;
  auto fail = [&](uint16_t st) { finish_request(r, st); };

  if ((cmd.flags & 0xc3) != 0) return fail(kInvalidField);  // fused / SGL
  if (cmd.opc == kNvmFlush && cmd.nsid == kNsidAll) {
    r->step = 0;
    r->steps = static_cast<uint32_t>(distinct_bdevs_.size());
    if (r->steps == 0) return fail(kSuccess);
    r->io.op = BdevOp::kFlush;
    return start_chain(r);
  }
  if (cmd.nsid == 0 || cmd.nsid > kMaxNamespaces || !ns_[cmd.nsid]) return fail(kInvalidNamespace);
  Bdev* b = ns_[cmd.nsid].get();
  switch (cmd.opc) {
    case kNvmRead:
    case kNvmWrite:
    case kNvmWriteZeroes: {
      uint64_t nlb = (cmd.cdw12 & 0xffff) + 1u;
      if (r->slba >= b->num_blocks() || nlb > b->num_blocks() - r->slba)
        return fail(kLbaOutOfRange);
      r->io.lba = r->slba;
      r->io.nblocks = nlb;
      if (cmd.opc == kNvmWriteZeroes) {
        r->io.op = (cmd.cdw12 >> 25) & 1 ? BdevOp::kUnmap : BdevOp::kWriteZeroes;  // DEAC
        return b->submit(&r->io);
      }
      uint64_t len = nlb * b->block_size();
      if (len > (uint64_t{page_size()} << cfg_.mdts)) return fail(kInvalidField);
      bool read = cmd.opc == kNvmRead;
      int n = 0;
      uint16_t st = map_prps(cmd.prp1, cmd.prp2, len,
                             read ? DmaMapTable::kWrite : DmaMapTable::kRead, r->iov, &n);
      if (st != kSuccess) return fail(st);
      r->io.op = read ? BdevOp::kRead : BdevOp::kWrite;
      r->io.iov = r->iov;
      r->io.iovcnt = n;
      return b->submit(&r->io);
    }
    case kNvmFlush:
      r->io.op = BdevOp::kFlush;
      return b->submit(&r->io);
    case kNvmDsm: {
      uint32_t nr = (cmd.cdw10 & 0xff) + 1;
      if (!((cmd.cdw11 >> 2) & 1)) return fail(kSuccess);  // no deallocate: hints only
      uint16_t st = copy_from_host(cmd, r->ranges, nr * sizeof(DsmRange));
      if (st != kSuccess) return fail(st);
      for (uint32_t i = 0; i < nr; ++i) {
        const DsmRange& g = r->ranges[i];
        if (g.slba >= b->num_blocks() || g.nlb > b->num_blocks() - g.slba)
          return fail(kLbaOutOfRange);
      }
      r->step = 0;
      r->steps = nr;
      r->io.op = BdevOp::kUnmap;
      return start_chain(r);
    }
    default:
      return fail(kInvalidOpcode);
  }
}

// Multi-step commands (DSM ranges, flush of every namespace) run one bdev request
// at a time through the same BdevIo.
void NvmeController::start_chain(Request* r) {
  while (r->step < r->steps) {
    if (r->opc == kNvmDsm) {
      const DsmRange& g = r->ranges[r->step];
      if (g.nlb == 0) {
        ++r->step;
        continue;
      }
      r->io.lba = g.slba;
      r->io.nblocks = g.nlb;
      ns_[r->nsid]->submit(&r->io);
    } else {
      distinct_bdevs_[r->step]->submit(&r->io);
    }
    return;
  }
  finish_request(r, kSuccess);
}

void NvmeController::bdev_done(BdevIo* io, Status st) {
  auto* r = static_cast<Request*>(io->ctx);
  NvmeController* c = r->ctrl;
  if (!st.ok()) {
    uint16_t s = io->op == BdevOp::kRead    ? kUnrecoveredReadError
                 : io->op == BdevOp::kWrite ? kWriteFault
                                            : kInternalError;
    return c->finish_request(r, s);
  }
  if (r->steps > 0 && ++r->step < r->steps) return c->start_chain(r);
  if (io->op == BdevOp::kRead) {
    ++c->stats_.reads;
    c->stats_.bytes_read += io->nblocks * c->ns_[r->nsid]->block_size();
  } else if (io->op == BdevOp::kWrite) {
    ++c->stats_.writes;
    c->stats_.bytes_written += io->nblocks * c->ns_[r->nsid]->block_size();
  }
  c->finish_request(r, kSuccess);
}

void NvmeController::finish_request(Request* r, uint16_t status) {
  if (status != kSuccess) record_error(r->sqid, r->cid, status, r->slba, r->nsid);
  uint16_t sqid = r->sqid, cid = r->cid;
  r->steps = 0;
  free_request(r);
  post(sqid, cid, status, 0);
}

void NvmeController::drain_inflight() {
  while (inflight_ > 0)
    for (Bdev* b : distinct_bdevs_) b->poll();
}

}  // namespace dpukv::nvme
