// The controller's admin commands (controller_core.h): identify, log pages,
// features and asynchronous events, executed on the controller's state; the data
// moves through the transport's copy hooks as for I/O.
#include "nvmf/core/controller_core.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include "nvmf/core/identify.h"
#include "runtime/log.h"

namespace dpukv::nvme {

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

}  // namespace dpukv::nvme
