// ControllerCore's admin command set: identify, log pages, features, queue
// management, asynchronous events, errors. (Registers, requests and the NVM
// command set are in controller_core.cc.)
#include <algorithm>
#include <cstring>

#include "nvmf/controller_core.h"
#include "nvmf/identify.h"
#include "runtime/log.h"

namespace dpukv::nvme {

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
  if (cfg_.discovery && (feat_aec_ >> 31 & 1))
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
      if (cfg_.discovery) return kInvalidField;  // no I/O queues
      if (queues_created_since_reset_) return kCommandSequenceError;
      uint32_t nsq = v & 0xffff, ncq = v >> 16;
      if (nsq == 0xffff || ncq == 0xffff) return kInvalidField;
      // Each count is granted up to the limit on its own: SQs may share CQs.
      allocated_sqs_ = static_cast<uint16_t>(std::min<uint32_t>(nsq + 1, cfg_.max_io_queues));
      allocated_cqs_ = static_cast<uint16_t>(std::min<uint32_t>(ncq + 1, cfg_.max_io_queues));
      r->dw0 = (allocated_sqs_ - 1u) | (allocated_cqs_ - 1u) << 16;
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
    case kFeatHostBehavior: {
      std::array<uint8_t, 512> hb{};
      uint16_t st = copy_from_data(r, hb.data(), hb.size());
      if (st != kSuccess) return st;
      // Bytes 0-2 (ACRE, ETDAS, LBAFEE) are enables: other values than 0 and 1
      // are not defined.
      for (int i = 0; i < 3; ++i)
        if (hb[i] > 1) return kInvalidField;
      feat_host_behavior_ = hb;
      break;
    }
    default:
      return kInvalidField;
  }
  return kSuccess;
}

uint16_t ControllerCore::get_features(Request* r) {
  const Sqe& cmd = r->cmd;
  uint32_t sel = (cmd.cdw10 >> 8) & 7;
  uint8_t fid = cmd.cdw10 & 0xff;
  uint32_t& dw0 = r->dw0;
  if (sel > 3) return kInvalidField;
  if (sel == 3) {  // supported capabilities: changeable, not saveable
    dw0 = 0x4;
    return kSuccess;
  }
  bool dflt = sel == 1 || sel == 2;  // nothing is saveable, so saved = default
  switch (fid) {
    case kFeatArbitration:
      dw0 = dflt ? 0 : feat_arbitration_;
      break;
    case kFeatPowerMgmt:
      dw0 = dflt ? 0 : feat_power_;
      break;
    case kFeatTempThreshold: {
      uint32_t sel_sensor = (cmd.cdw11 >> 16) & 0xf, type = (cmd.cdw11 >> 20) & 3;
      if (sel_sensor != 0 || type > 1) return kInvalidField;
      dw0 = type == 0 ? (dflt ? 343u : temp_over_) : (dflt ? 0u : temp_under_);
      break;
    }
    case kFeatErrorRecovery:
      dw0 = dflt ? 0 : feat_error_recovery_;
      break;
    case kFeatVolatileWc:
      dw0 = dflt ? 1 : feat_vwc_;
      break;
    case kFeatNumQueues: {
      uint32_t max = cfg_.max_io_queues - 1u;
      dw0 = dflt ? (max | max << 16) : ((allocated_sqs_ - 1u) | (allocated_cqs_ - 1u) << 16);
      break;
    }
    case kFeatIntCoalescing:
      dw0 = dflt ? 0 : feat_coalescing_;
      break;
    case kFeatIntVectorConfig:
      if ((cmd.cdw11 & 0xffff) >= cfg_.num_vectors) return kInvalidField;
      dw0 = cmd.cdw11 & 0xffff;
      break;
    case kFeatWriteAtomicity:
      dw0 = dflt ? 0 : feat_write_atomicity_;
      break;
    case kFeatAsyncEventConfig:
      dw0 = dflt ? 0 : feat_aec_;
      break;
    case kFeatKeepAlive:
      dw0 = dflt ? kato_connect_ : feat_kato_;
      break;
    case kFeatHostBehavior: {
      std::array<uint8_t, 512> zero{};
      return copy_to_data(r, dflt ? zero.data() : feat_host_behavior_.data(), 512);
    }
    default:
      return kInvalidField;
  }
  return kSuccess;
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

}  // namespace dpukv::nvme
