#include "nvmf/vfio_user/pcie_controller.h"

#include <algorithm>
#include <cstring>

#include "runtime/log.h"

namespace dpukv::nvme {
namespace {

uint32_t load_acquire(const uint32_t* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

}  // namespace

PcieController::PcieController(const ControllerConfig& cfg, std::shared_ptr<NamespaceSet> ns,
                               DmaMapTable* dma, InterruptSink* irq, uint32_t* doorbells)
    : ControllerCore(cfg, std::move(ns)), dma_(dma), irq_(irq), db_(doorbells) {
  sqs_.resize(cfg_.max_io_queues + 1u);
  cqs_.resize(cfg_.max_io_queues + 1u);
}

PcieController::~PcieController() {
  drain_inflight();
}

bool PcieController::on_enable() {
  uint32_t sq_entries = (aqa_ & 0xfff) + 1, cq_entries = ((aqa_ >> 16) & 0xfff) + 1;
  if (sq_entries < 2 || cq_entries < 2) {
    fatal("AQA: admin queues need at least 2 entries");
    return false;
  }
  auto* sq = reinterpret_cast<const Sqe*>(
      dma_->translate(asq_, uint64_t{sq_entries} * 64, DmaMapTable::kRead));
  auto* cq =
      reinterpret_cast<Cqe*>(dma_->translate(acq_, uint64_t{cq_entries} * 16, DmaMapTable::kWrite));
  if (sq == nullptr || cq == nullptr) {
    fatal("ASQ/ACQ outside the host's DMA windows");
    return false;
  }
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
  LOG_INFO("nvme: controller ready (admin SQ %u, CQ %u entries, %u-byte pages)", sq_entries,
           cq_entries, page_size());
  return true;
}

void PcieController::on_disable() {
  for (auto [r, st] : held_) release(r);  // their queues end with the reset
  held_.clear();
  parked_ = 0;
  delete_io_queues();
  sqs_[0] = Sq{};
  cqs_[0] = Cq{};
  active_sqs_.clear();
  std::memset(db_, 0, kDoorbellPageSize);
}

void PcieController::function_reset() {
  controller_reset();
  registers_to_power_on();
}

void PcieController::release_dma(uint64_t iova, uint64_t len) {
  drain_inflight();
  auto inside = [&](uint64_t q, uint64_t bytes) { return q < iova + len && iova < q + bytes; };
  uint32_t before = parked_;
  for (size_t i = 0; i < sqs_.size(); ++i) {
    Sq& s = sqs_[i];
    if (s.active && s.base != nullptr && inside(s.iova, s.size * 64ull)) {
      s.base = nullptr;
      ++parked_;
    }
    Cq& c = cqs_[i];
    if (c.active && c.base != nullptr && inside(c.iova, c.size * 16ull)) {
      c.base = nullptr;
      ++parked_;
    }
  }
  if (parked_ > before)
    LOG_INFO("nvme: host unmapped queue memory: %u queues parked until it is mapped again",
             parked_);
}

void PcieController::dma_mapped() {
  if (parked_ == 0) return;
  for (size_t i = 0; i < sqs_.size(); ++i) {
    Sq& s = sqs_[i];
    if (s.active && s.base == nullptr) {
      s.base = reinterpret_cast<const Sqe*>(
          dma_->translate(s.iova, uint64_t{s.size} * 64, DmaMapTable::kRead));
      parked_ -= s.base != nullptr;
    }
    Cq& c = cqs_[i];
    if (c.active && c.base == nullptr) {
      c.base = reinterpret_cast<Cqe*>(
          dma_->translate(c.iova, uint64_t{c.size} * 16, DmaMapTable::kWrite));
      parked_ -= c.base != nullptr;
    }
  }
  std::vector<std::pair<Request*, uint16_t>> held;
  held.swap(held_);
  for (auto [r, st] : held) post(r, st);  // holds again what is still parked
}

void PcieController::write_doorbell(uint32_t offset, uint32_t value) {
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

uint32_t PcieController::active_io_queues() const {
  uint32_t n = 0;
  for (size_t i = 1; i < sqs_.size(); ++i) n += sqs_[i].active;
  return n;
}

// ---- queues -----------------------------------------------------------------

int PcieController::poll() {
  int work = poll_bdevs();
  if (!ready()) return work;
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

uint32_t PcieController::cq_free(Cq& cq) {
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

int PcieController::process_sq(Sq& sq) {
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
  if (sq.base == nullptr || cq.base == nullptr) return 0;  // parked: memory unmapped
  uint32_t room = cq_free(cq);
  int n = 0;
  // A bounded batch keeps one busy queue from starving the others (round robin).
  while (sq.head != tail && room > 0 && has_free_request() && n < 64) {
    Request* r = alloc_request();
    // The host may rewrite the entry at any time: act only on this copy.
    std::memcpy(&r->cmd, &sq.base[sq.head], sizeof r->cmd);
    r->qid = sq.id;
    sq.head = sq.head + 1 == sq.size ? 0 : sq.head + 1;
    ++cq.reserved;
    ++sq.inflight;
    --room;
    ++n;
    uint64_t len = 0;
    bool to_host = false;
    uint16_t st = data_length(r->cmd, sq.id == 0, &len, &to_host);
    if (st == kSuccess && len > 0 && ((r->cmd.flags >> 6) & 3) == 0)
      st = map_prps(r->cmd.prp1, r->cmd.prp2, len,
                    to_host ? DmaMapTable::kWrite : DmaMapTable::kRead, r->iov_storage, &r->iovcnt);
    r->iov = r->iov_storage;
    if (st != kSuccess) {
      record_error(sq.id, r->cmd.cid, st, 0, r->cmd.nsid);
      ++stats_.errors;
      complete(r, st);
    } else {
      execute(r);
    }
    if (!sq.active) break;  // the command deleted its own queue
  }
  return n;
}

void PcieController::complete(Request* r, uint16_t status) {
  post(r, status);
}

void PcieController::post(Request* r, uint16_t status) {
  Sq& sq = sqs_[r->qid];
  if (cqs_[sq.cqid].base == nullptr) {  // parked: posted once the host maps it again
    held_.emplace_back(r, status);
    return;
  }
  Cq& cq = cqs_[sq.cqid];
  uint16_t cid = r->cmd.cid, sqid = r->qid;
  uint32_t dw0 = r->dw0;
  release(r);
  --sq.inflight;
  --cq.reserved;
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

void PcieController::delete_io_queues() {
  for (size_t i = 1; i < sqs_.size(); ++i) {
    sqs_[i] = Sq{};
    cqs_[i] = Cq{};
  }
  std::erase_if(active_sqs_, [](uint16_t q) { return q != 0; });
}

uint16_t PcieController::map_prps(uint64_t prp1, uint64_t prp2, uint64_t len, uint32_t prot,
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
  if (left > 0 && left <= page) {
    if (prp2 & (page - 1)) return kPrpOffsetInvalid;
    if (uint16_t s = add(prp2, left); s != kSuccess) return s;
    left = 0;
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

// ---- queue management (PCIe only) --------------------------------------------

uint16_t PcieController::admin_transport(Request* r) {
  switch (r->cmd.opc) {
    case kAdminCreateCq:
      return create_cq(r->cmd);
    case kAdminCreateSq:
      return create_sq(r->cmd);
    case kAdminDeleteSq:
      return delete_sq(r->cmd);
    case kAdminDeleteCq:
      return delete_cq(r->cmd);
    default:
      return kInvalidOpcode;
  }
}

uint16_t PcieController::create_cq(const Sqe& cmd) {
  uint16_t qid = cmd.cdw10 & 0xffff;
  uint32_t qsize = (cmd.cdw10 >> 16) + 1;
  bool pc = cmd.cdw11 & 1, ien = (cmd.cdw11 >> 1) & 1;
  uint16_t iv = static_cast<uint16_t>(cmd.cdw11 >> 16);
  if (qid == 0 || qid > allocated_cqs_ || cqs_[qid].active) return kInvalidQueueId;
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

uint16_t PcieController::create_sq(const Sqe& cmd) {
  uint16_t qid = cmd.cdw10 & 0xffff;
  uint32_t qsize = (cmd.cdw10 >> 16) + 1;
  bool pc = cmd.cdw11 & 1;
  uint16_t cqid = static_cast<uint16_t>(cmd.cdw11 >> 16);
  if (qid == 0 || qid > allocated_sqs_ || sqs_[qid].active) return kInvalidQueueId;
  if (qsize < 2 || qsize > cfg_.mqes + 1u) return kInvalidQueueSize;
  if (!pc) return kInvalidField;
  if (cc_iosqes(cc_) != 6) return kInvalidField;
  // A CQID outside what Number of Queues granted names no queue at all; one
  // inside it that the host has not created is an invalid CQ.
  if (cqid == 0 || cqid > allocated_cqs_) return kInvalidQueueId;
  if (!cqs_[cqid].active) return kCqInvalid;
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

uint16_t PcieController::delete_sq(const Sqe& cmd) {
  uint16_t qid = cmd.cdw10 & 0xffff;
  if (qid == 0 || qid >= sqs_.size() || !sqs_[qid].active) return kInvalidQueueId;
  Sq& s = sqs_[qid];
  // Commands still on the medium finish first: their completions reach the CQ
  // before the deletion's own completion, as the host expects. Commands the host
  // submitted but the controller never fetched are dropped.
  // Completions held for a parked CQ are dropped with their queue.
  std::erase_if(held_, [&](const std::pair<Request*, uint16_t>& h) {
    if (h.first->qid != qid) return false;
    release(h.first);
    --s.inflight;
    --cqs_[s.cqid].reserved;
    return true;
  });
  while (s.inflight > 0) poll_bdevs();
  --cqs_[s.cqid].sq_refs;
  parked_ -= s.base == nullptr;
  s = Sq{};
  std::erase(active_sqs_, qid);
  return kSuccess;
}

uint16_t PcieController::delete_cq(const Sqe& cmd) {
  uint16_t qid = cmd.cdw10 & 0xffff;
  if (qid == 0 || qid >= cqs_.size() || !cqs_[qid].active) return kInvalidQueueId;
  if (cqs_[qid].sq_refs > 0) return kInvalidQueueDeletion;
  parked_ -= cqs_[qid].base == nullptr;
  cqs_[qid] = Cq{};
  return kSuccess;
}

}  // namespace dpukv::nvme
