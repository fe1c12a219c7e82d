#include "nvmf/core/controller_core.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "nvmf/core/identify.h"
#include "runtime/log.h"

namespace dpukv::nvme {

ControllerCore::ControllerCore(const ControllerConfig& cfg,
                               std::shared_ptr<NamespaceSet> namespaces, uint32_t pool_size)
    : cfg_(cfg), ns_(namespaces ? std::move(namespaces) : std::make_shared<NamespaceSet>()) {
  cfg_.max_io_queues = std::clamp<uint16_t>(cfg_.max_io_queues, 1, kMaxQueuePairs - 1);
  cfg_.num_vectors = std::clamp<uint16_t>(cfg_.num_vectors, 1, 2048);
  cfg_.mqes = std::clamp<uint16_t>(cfg_.mqes, 1, 0xffff);
  cap_ = uint64_t{cfg_.mqes} | (uint64_t{1} << 16)  // CQR: queues physically contiguous
         | (uint64_t{15} << 24)                     // TO: 7.5 s to become ready
         | (uint64_t{1} << 37)                      // CSS: NVM command set
         | (uint64_t{0} << 48) | (uint64_t{cfg_.fabrics ? 0u : 4u} << 52);  // MPSMIN 4K, MPSMAX
  allocated_sqs_ = allocated_cqs_ = cfg_.max_io_queues;
  requests_.resize(std::max<uint32_t>(pool_size, 1));
  for (auto& r : requests_) {
    r.ctrl = this;
    free_requests_.push_back(&r);
  }
  aers_.reserve(kAerLimit);
  events_.reserve(16);
}

ControllerCore::~ControllerCore() = default;

Status ControllerCore::add_namespace(uint32_t nsid, std::shared_ptr<Bdev> bdev) {
  if (nsid == 0 || nsid > kMaxNamespaces || !bdev) return Code::kInvalidValue;
  if (ns_->ns[nsid]) return Code::kBadState;
  ns_->ns[nsid] = std::move(bdev);
  ++ns_->generation;
  return Code::kSuccess;
}

Status ControllerCore::remove_namespace(uint32_t nsid) {
  if (nsid == 0 || nsid > kMaxNamespaces || !ns_->ns[nsid]) return Code::kNotFound;
  drain_inflight();
  ns_->ns[nsid].reset();
  ++ns_->generation;
  return Code::kSuccess;
}

void ControllerCore::rebuild_bdev_list() {
  distinct_bdevs_.clear();
  for (const auto& n : ns_->ns)
    if (n &&
        std::find(distinct_bdevs_.begin(), distinct_bdevs_.end(), n.get()) == distinct_bdevs_.end())
      distinct_bdevs_.push_back(n.get());
  seen_generation_ = ns_->generation;
}

int ControllerCore::poll_bdevs() {
  if (seen_generation_ != ns_->generation) rebuild_bdev_list();
  int n = 0;
  for (Bdev* b : distinct_bdevs_) n += b->poll();
  return n;
}

void ControllerCore::drain_inflight() {
  while (at_bdev_ > 0) poll_bdevs();
}

void ControllerCore::submit_bdev(Bdev* b, Request* r) {
  ++at_bdev_;
  b->submit(&r->io);
}

// ---- registers --------------------------------------------------------------

uint64_t ControllerCore::read_reg(uint32_t offset, uint32_t size) const {
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

void ControllerCore::write_reg(uint32_t offset, uint32_t size, uint64_t value) {
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
  bool en = (cc_ & kCcEn) != 0;
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
      if (!en) aqa_ = v & 0x0fff0fffu;
      break;
    case kRegAsq:
      if (!en) asq_ = (asq_ & ~uint64_t{0xffffffff}) | (v & ~0xfffu);
      break;
    case kRegAsq + 4:
      if (!en) asq_ = (asq_ & 0xffffffffu) | uint64_t{v} << 32;
      break;
    case kRegAcq:
      if (!en) acq_ = (acq_ & ~uint64_t{0xffffffff}) | (v & ~0xfffu);
      break;
    case kRegAcq + 4:
      if (!en) acq_ = (acq_ & 0xffffffffu) | uint64_t{v} << 32;
      break;
    default:
      break;  // read-only, reserved, or NSSR (CAP.NSSRS = 0): no effect
  }
}

void ControllerCore::write_cc(uint32_t v) {
  uint32_t old = cc_;
  cc_ = v & 0x00fffff1u;  // EN, CSS, MPS, AMS, SHN, IOSQES, IOCQES
  if (cc_shn(cc_) != 0 && cc_shn(old) == 0) {
    // Normal or abrupt shutdown: finish what is in flight, flush the media,
    // then report completion.
    drain_inflight();
    if (seen_generation_ != ns_->generation) rebuild_bdev_list();
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
    uint32_t mps = cc_mps(cc_);
    uint32_t mpsmin = (cap_ >> 48) & 0xf, mpsmax = (cap_ >> 52) & 0xf;
    if (cc_css(cc_) != 0 || mps < mpsmin || mps > mpsmax || cc_ams(cc_) != 0)
      return fatal("CC.EN set with an unsupported CSS, MPS or AMS");
    if (!on_enable()) return;  // the transport reported why
    csts_ = (csts_ & ~kCstsCfs) | kCstsRdy;
  } else if ((old & kCcEn) && !(cc_ & kCcEn)) {
    controller_reset();
  }
}

void ControllerCore::controller_reset() {
  drain_inflight();
  drop_async_events();  // outstanding AERs end with the reset, unanswered
  events_.clear();
  event_masked_.fill(false);
  on_disable();
  allocated_sqs_ = allocated_cqs_ = cfg_.max_io_queues;
  queues_created_since_reset_ = false;
  csts_ &= ~(kCstsRdy | kCstsCfs);
}

void ControllerCore::drop_async_events() {
  std::vector<Request*> aers;
  aers.swap(aers_);
  for (Request* r : aers) drop(r);
  aers_.reserve(kAerLimit);
}

void ControllerCore::registers_to_power_on() {
  cc_ = csts_ = aqa_ = intms_ = 0;
  asq_ = acq_ = 0;
  features_.reset();
  critical_warning_ = 0;
}

void ControllerCore::fatal(const char* why) {
  LOG_ERR("nvme: controller fatal status: %s", why);
  ++stats_.fatal;
  drain_inflight();
  for (Request* r : aers_) release(r);
  aers_.clear();
  on_disable();
  csts_ = (csts_ & ~kCstsRdy) | kCstsCfs;
}

// ---- admin ------------------------------------------------------------------

void ControllerCore::execute_admin(Request* r) {
  ++stats_.admin_commands;
  const Sqe& cmd = r->cmd;
  uint16_t st;
  // PCIe: PSDT must be PRPs; Fabrics: SGLs (the transport has resolved them).
  uint8_t psdt = (cmd.flags >> 6) & 3;
  if ((cmd.flags & 0x03) != 0 || (cfg_.fabrics ? psdt != 1 : psdt != 0))
    return finish(r, kInvalidField);
  switch (cmd.opc) {
    case kAdminIdentify:
      st = identify(r);
      break;
    case kAdminGetLogPage:
      st = get_log_page(r);
      break;
    case kAdminSetFeatures:
      st = set_features(r);
      break;
    case kAdminGetFeatures:
      st = get_features(r);
      break;
    case kAdminAsyncEvent:
      return async_event_request(r);
    case kAdminAbort:
      // Commands here complete before the next one is fetched or are already on
      // the medium; none can be pulled back. Bit 0 set: not aborted.
      r->dw0 = 1;
      st = kSuccess;
      break;
    case kAdminKeepAlive:
      st = kSuccess;
      break;
    default:
      st = admin_transport(r);
      if (st == kPending) return;
      break;
  }
  finish(r, st);
}

uint16_t ControllerCore::identify(Request* r) {
  const Sqe& cmd = r->cmd;
  uint8_t cns = cmd.cdw10 & 0xff;
  alignas(8) uint8_t d[kIdentifySize] = {};
  switch (cns) {
    case kCnsController:
      identify_controller(
          cfg_, IdentifyLimits{kAbortLimit, kAerLimit, ErrorLog::kEntries, kMaxNamespaces}, d);
      break;
    case kCnsNamespace: {
      // NSID FFFFFFFFh (capabilities common to all namespaces) is for controllers
      // with namespace management (OACS bit 3), which this one is not.
      if (cmd.nsid == 0 || cmd.nsid > kMaxNamespaces) return kInvalidNamespace;
      const Bdev* b = ns_->get(cmd.nsid);
      if (b == nullptr) break;  // allocated but inactive: zeroes
      uint8_t id[16];
      namespace_nguid(cfg_.serial, cmd.nsid, id);
      identify_namespace(b->num_blocks(), b->block_size(), id, d);
      break;
    }
    case kCnsActiveNsList: {
      if (cmd.nsid >= 0xfffffffeu) return kInvalidNamespace;
      size_t n = 0;
      for (uint32_t id = cmd.nsid + 1; id <= kMaxNamespaces && n < 1024; ++id)
        if (ns_->get(id) != nullptr) put32(d + 4 * n++, id);
      break;
    }
    case kCnsIoCommandSetController:
      // The NVM command set's controller data (VSL, WZSL, WUSL, DMRL, DMRSL, DMSL):
      // zeroes say "no limit beyond MDTS"; other command sets are not supported.
      if ((cmd.cdw11 >> 24) != 0) return kInvalidField;
      break;
    case kCnsNsDescriptors: {
      if (ns_->get(cmd.nsid) == nullptr) return kInvalidNamespace;
      uint8_t id[16];
      namespace_nguid(cfg_.serial, cmd.nsid, id);
      namespace_descriptors(id, d);
      break;
    }
    default:
      return kInvalidField;
  }
  return copy_to_data(r, d, sizeof d);
}

void ControllerCore::discovery_log_changed() {
  if (cfg_.discovery && (features_.async_event_config() >> 31 & 1))
    queue_event(kAerNotice, kAerInfoDiscoveryChange, kLogDiscovery);
}

uint16_t ControllerCore::get_log_page(Request* r) {
  const Sqe& cmd = r->cmd;
  uint8_t lid = cmd.cdw10 & 0xff;
  bool rae = (cmd.cdw10 >> 15) & 1;
  uint64_t numd = ((uint64_t{cmd.cdw11} & 0xffff) << 16 | (cmd.cdw10 >> 16)) + 1;
  uint64_t offset = uint64_t{cmd.cdw12} | uint64_t{cmd.cdw13} << 32;
  uint64_t len = numd * 4;
  if (len > max_transfer() || (offset & 3)) return kInvalidField;
  alignas(8) uint8_t log[kIdentifySize] = {};
  uint32_t size;
  switch (lid) {
    case kLogError:
      size = error_log_.page(log);
      if (!rae) event_masked_[kAerError] = false;
      break;
    case kLogSmart:
      if (cmd.nsid != 0 && cmd.nsid != kNsidAll) return kInvalidField;  // no per-namespace log
      size = smart_log_page(
          SmartFigures{critical_warning_, temperature_, stats_.bytes_read, stats_.bytes_written,
                       stats_.reads, stats_.writes, error_log_.count()},
          log);
      if (!rae) event_masked_[kAerSmart] = false;
      break;
    case kLogFirmwareSlot:
      size = firmware_slot_log_page(cfg_.firmware, log);
      break;
    default: {
      std::vector<uint8_t> page;  // admin path: a small allocation is fine
      if (!transport_log(lid, &page)) return kInvalidLogPage;
      if (lid == kLogDiscovery && !rae) event_masked_[kAerNotice] = false;
      std::vector<uint8_t> out;
      if (!log_window(page.data(), page.size(), offset, len, &out)) return kInvalidField;
      return copy_to_data(r, out.data(), out.size());
    }
  }
  std::vector<uint8_t> out;
  if (!log_window(log, size, offset, len, &out)) return kInvalidField;
  return copy_to_data(r, out.data(), out.size());
}

uint16_t ControllerCore::set_features(Request* r) {
  const Sqe& cmd = r->cmd;
  if (cmd.cdw10 >> 31) return kFeatureNotSaveable;
  const uint32_t v = cmd.cdw11;
  const uint8_t fid = cmd.cdw10 & 0xff;
  switch (fid) {
    case kFeatNumQueues: {
      if (cfg_.discovery) return kInvalidField;  // no I/O queues
      if (queues_created_since_reset_) return kCommandSequenceError;
      uint32_t nsq = v & 0xffff, ncq = v >> 16;
      if (nsq == 0xffff || ncq == 0xffff) return kInvalidField;
      // Each count is granted up to the limit on its own: SQs may share CQs.
      allocated_sqs_ = static_cast<uint16_t>(std::min<uint32_t>(nsq + 1, cfg_.max_io_queues));
      allocated_cqs_ = static_cast<uint16_t>(std::min<uint32_t>(ncq + 1, cfg_.max_io_queues));
      r->dw0 = (allocated_sqs_ - 1u) | (allocated_cqs_ - 1u) << 16;
      return kSuccess;
    }
    case kFeatIntVectorConfig:
      return (v & 0xffff) >= cfg_.num_vectors ? kInvalidField : kSuccess;
    case kFeatHostBehavior: {
      FeatureSet::HostBehavior hb{};
      const uint16_t st = copy_from_data(r, hb.data(), hb.size());
      return st != kSuccess ? st : features_.set(fid, v, &hb);
    }
    default:
      break;
  }
  const uint16_t st = features_.set(fid, v, nullptr);
  if (st == kSuccess && fid == kFeatTempThreshold) {
    const bool hot = features_.temperature_out_of_range(temperature_);
    if (hot && !(critical_warning_ & 0x02)) {
      critical_warning_ |= 0x02;
      if (features_.async_event_config() & 0x02)
        queue_event(kAerSmart, kAerInfoTemperature, kLogSmart);
    } else if (!hot) {
      critical_warning_ &= ~0x02;
    }
  }
  return st;
}

uint16_t ControllerCore::get_features(Request* r) {
  const Sqe& cmd = r->cmd;
  const uint32_t sel = (cmd.cdw10 >> 8) & 7;
  const uint8_t fid = cmd.cdw10 & 0xff;
  if (sel > 3) return kInvalidField;
  if (sel == 3) {  // supported capabilities: changeable, not saveable
    r->dw0 = 0x4;
    return kSuccess;
  }
  const bool dflt = sel == 1 || sel == 2;  // nothing is saveable, so saved = default
  switch (fid) {
    case kFeatNumQueues: {
      const uint32_t max = cfg_.max_io_queues - 1u;
      r->dw0 = dflt ? (max | max << 16) : ((allocated_sqs_ - 1u) | (allocated_cqs_ - 1u) << 16);
      return kSuccess;
    }
    case kFeatIntVectorConfig:
      if ((cmd.cdw11 & 0xffff) >= cfg_.num_vectors) return kInvalidField;
      r->dw0 = cmd.cdw11 & 0xffff;
      return kSuccess;
    case kFeatHostBehavior:
      return copy_to_data(r, features_.host_behavior(dflt).data(),
                          sizeof(FeatureSet::HostBehavior));
    default:
      return features_.get(fid, dflt, cmd.cdw11, &r->dw0);
  }
}

void ControllerCore::async_event_request(Request* r) {
  if (aers_.size() >= kAerLimit) return finish(r, kAerLimitExceeded);
  aers_.push_back(r);  // completes when an event arrives; keeps its CQ slot
  deliver_events();
}

void ControllerCore::queue_event(uint8_t type, uint8_t info, uint8_t log_page) {
  if (type >= event_masked_.size() || event_masked_[type]) return;
  for (const Event& e : events_)
    if (e.type == type && e.info == info) return;
  if (events_.size() < 16) events_.push_back(Event{type, info, log_page});
  deliver_events();
}

void ControllerCore::deliver_events() {
  if (!(csts_ & kCstsRdy)) return;
  while (!aers_.empty() && !events_.empty()) {
    Event e = events_.front();
    events_.erase(events_.begin());
    if (event_masked_[e.type]) continue;
    event_masked_[e.type] = true;  // until the host reads the log page
    Request* r = aers_.front();
    aers_.erase(aers_.begin());
    r->dw0 = uint32_t{e.type} | uint32_t{e.info} << 8 | uint32_t{e.log} << 16;
    finish(r, kSuccess);
    on_event_ready();
  }
}

void ControllerCore::record_error(uint16_t qid, uint16_t cid, uint16_t status, uint64_t lba,
                                  uint32_t nsid) {
  error_log_.record(qid, cid, status, lba, nsid);
}

// ---- requests ---------------------------------------------------------------

ControllerCore::Request* ControllerCore::alloc_request() {
  if (free_requests_.empty()) return nullptr;
  Request* r = free_requests_.back();
  free_requests_.pop_back();
  ++inflight_;
  r->io = BdevIo{};
  r->io.done = &ControllerCore::bdev_done;
  r->io.ctx = r;
  r->iov = nullptr;
  r->iovcnt = 0;
  r->dw0 = r->dw1 = 0;
  r->step = r->steps = 0;
  r->queue = nullptr;
  r->tag = 0;
  return r;
}

void ControllerCore::release(Request* r) {
  free_requests_.push_back(r);
  --inflight_;
}

void ControllerCore::finish(Request* r, uint16_t status) {
  if (status != kSuccess) {
    LOG_DBG("nvme: queue %u command 0x%02x (cid %u) failed with status 0x%03x", r->qid, r->cmd.opc,
            r->cmd.cid, status);
    ++stats_.errors;
    uint64_t lba = uint64_t{r->cmd.cdw10} | uint64_t{r->cmd.cdw11} << 32;
    record_error(r->qid, r->cmd.cid, status, r->qid == 0 ? 0 : lba, r->cmd.nsid);
  }
  complete(r, status);
}

uint16_t ControllerCore::data_length(const Sqe& c, bool admin, uint64_t* len, bool* to_host) const {
  *len = 0;
  *to_host = false;
  if (admin) {
    switch (c.opc) {
      case kAdminIdentify:
        *len = kIdentifySize;
        *to_host = true;
        break;
      case kAdminGetLogPage:
        *len = (((uint64_t{c.cdw11} & 0xffff) << 16 | (c.cdw10 >> 16)) + 1) * 4;
        *to_host = true;
        break;
      case kAdminGetFeatures:
      case kAdminSetFeatures:
        if ((c.cdw10 & 0xff) == kFeatHostBehavior) *len = 512;  // the only feature with data
        *to_host = c.opc == kAdminGetFeatures;
        break;
      default:
        break;
    }
  } else {
    Bdev* b = ns_->get(c.nsid);
    switch (c.opc) {
      case kNvmRead:
      case kNvmWrite:
        if (b != nullptr) *len = ((c.cdw12 & 0xffff) + 1ull) * b->block_size();
        *to_host = c.opc == kNvmRead;
        break;
      case kNvmDsm:
        if ((c.cdw11 >> 2) & 1) *len = ((c.cdw10 & 0xff) + 1ull) * sizeof(DsmRange);
        break;
      default:
        break;
    }
  }
  return *len > max_transfer() ? kInvalidField : kSuccess;
}

uint16_t ControllerCore::copy_to_data(Request* r, const void* src, size_t len) {
  size_t done = 0;
  for (int i = 0; i < r->iovcnt && done < len; ++i) {
    size_t n = std::min(r->iov[i].iov_len, len - done);
    std::memcpy(r->iov[i].iov_base, static_cast<const uint8_t*>(src) + done, n);
    done += n;
  }
  return done == len ? kSuccess : kDataTransferError;
}

uint16_t ControllerCore::copy_from_data(Request* r, void* dst, size_t len) {
  size_t done = 0;
  for (int i = 0; i < r->iovcnt && done < len; ++i) {
    size_t n = std::min(r->iov[i].iov_len, len - done);
    std::memcpy(static_cast<uint8_t*>(dst) + done, r->iov[i].iov_base, n);
    done += n;
  }
  return done == len ? kSuccess : kDataTransferError;
}

void ControllerCore::execute(Request* r) {
  if (r->qid == 0)
    execute_admin(r);
  else
    execute_io(r);
}

// ---- I/O --------------------------------------------------------------------

void ControllerCore::execute_io(Request* r) {
  ++stats_.io_commands;
  const Sqe& cmd = r->cmd;
  uint8_t psdt = (cmd.flags >> 6) & 3;
  if ((cmd.flags & 0x03) != 0 || (cfg_.fabrics ? psdt != 1 : psdt != 0))
    return finish(r, kInvalidField);
  uint64_t slba = uint64_t{cmd.cdw10} | uint64_t{cmd.cdw11} << 32;
  if (cmd.opc == kNvmFlush && cmd.nsid == kNsidAll) {
    if (seen_generation_ != ns_->generation) rebuild_bdev_list();
    r->step = 0;
    r->steps = static_cast<uint32_t>(distinct_bdevs_.size());
    if (r->steps == 0) return finish(r, kSuccess);
    r->io.op = BdevOp::kFlush;
    return start_chain(r);
  }
  Bdev* b = ns_->get(cmd.nsid);
  if (b == nullptr) return finish(r, kInvalidNamespace);
  switch (cmd.opc) {
    case kNvmRead:
    case kNvmWrite:
    case kNvmWriteZeroes: {
      uint64_t nlb = (cmd.cdw12 & 0xffff) + 1u;
      if (slba >= b->num_blocks() || nlb > b->num_blocks() - slba) return finish(r, kLbaOutOfRange);
      r->io.lba = slba;
      r->io.nblocks = nlb;
      if (cmd.opc == kNvmWriteZeroes) {
        r->io.op = (cmd.cdw12 >> 25) & 1 ? BdevOp::kUnmap : BdevOp::kWriteZeroes;  // DEAC
        return submit_bdev(b, r);
      }
      if (nlb * b->block_size() > max_transfer()) return finish(r, kInvalidField);
      r->io.op = cmd.opc == kNvmRead ? BdevOp::kRead : BdevOp::kWrite;
      r->io.iov = r->iov;
      r->io.iovcnt = r->iovcnt;
      return submit_bdev(b, r);
    }
    case kNvmFlush:
      r->io.op = BdevOp::kFlush;
      return submit_bdev(b, r);
    case kNvmDsm: {
      uint32_t nr = (cmd.cdw10 & 0xff) + 1;
      if (!((cmd.cdw11 >> 2) & 1)) return finish(r, kSuccess);  // no deallocate: hints only
      DsmRange ranges[256];
      uint16_t st = copy_from_data(r, ranges, nr * sizeof(DsmRange));
      if (st != kSuccess) return finish(r, st);
      for (uint32_t i = 0; i < nr; ++i) {
        const DsmRange& g = ranges[i];
        if (g.slba >= b->num_blocks() || g.nlb > b->num_blocks() - g.slba)
          return finish(r, kLbaOutOfRange);
      }
      std::memcpy(r->ranges, ranges, nr * sizeof(DsmRange));  // the data buffer may be reused now
      r->step = 0;
      r->steps = nr;
      r->io.op = BdevOp::kUnmap;
      return start_chain(r);
    }
    default:
      return finish(r, kInvalidOpcode);
  }
}

// Multi-step commands (DSM ranges, flush of every namespace) run one bdev request
// at a time through the same BdevIo.
void ControllerCore::start_chain(Request* r) {
  while (r->step < r->steps) {
    if (r->cmd.opc == kNvmDsm) {
      const DsmRange& g = r->ranges[r->step];
      if (g.nlb == 0) {
        ++r->step;
        continue;
      }
      r->io.lba = g.slba;
      r->io.nblocks = g.nlb;
      submit_bdev(ns_->get(r->cmd.nsid), r);
    } else {
      submit_bdev(distinct_bdevs_[r->step], r);
    }
    return;
  }
  finish(r, kSuccess);
}

void ControllerCore::bdev_done(BdevIo* io, Status st) {
  auto* r = static_cast<Request*>(io->ctx);
  ControllerCore* c = r->ctrl;
  --c->at_bdev_;
  if (!st.ok()) {
    uint16_t s = io->op == BdevOp::kRead    ? kUnrecoveredReadError
                 : io->op == BdevOp::kWrite ? kWriteFault
                                            : kInternalError;
    return c->finish(r, s);
  }
  if (r->steps > 0 && ++r->step < r->steps) return c->start_chain(r);
  uint64_t bytes =
      io->nblocks * (c->ns_->get(r->cmd.nsid) ? c->ns_->get(r->cmd.nsid)->block_size() : 0);
  if (io->op == BdevOp::kRead) {
    ++c->stats_.reads;
    c->stats_.bytes_read += bytes;
  } else if (io->op == BdevOp::kWrite) {
    ++c->stats_.writes;
    c->stats_.bytes_written += bytes;
  }
  c->finish(r, kSuccess);
}

}  // namespace dpukv::nvme
