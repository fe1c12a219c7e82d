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
