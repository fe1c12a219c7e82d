#include "nvmf/core/features.h"

#include "nvme/nvme_spec.h"

namespace dpukv::nvme {

void FeatureSet::reset() {
  const uint32_t kato = kato_default_;
  *this = FeatureSet{};
  kato_ = kato_default_ = kato;
}

uint16_t FeatureSet::set(uint8_t fid, uint32_t v, const HostBehavior* hb) {
  switch (fid) {
    case kFeatArbitration:
      arbitration_ = v;
      return kSuccess;
    case kFeatPowerMgmt:
      if ((v & 0x1f) != 0) return kInvalidField;  // one power state (NPSS = 0)
      power_ = v;
      return kSuccess;
    case kFeatTempThreshold: {
      const uint32_t sel = (v >> 16) & 0xf, type = (v >> 20) & 3;
      if (sel != 0 || type > 1) return kInvalidField;  // composite sensor, over/under
      (type == 0 ? temp_over_ : temp_under_) = static_cast<uint16_t>(v & 0xffff);
      return kSuccess;
    }
    case kFeatErrorRecovery:
      error_recovery_ = v & 0x1ffff;
      return kSuccess;
    case kFeatVolatileWc:
      vwc_ = v & 1;
      return kSuccess;
    case kFeatIntCoalescing:
      coalescing_ = v & 0xffff;
      return kSuccess;
    case kFeatWriteAtomicity:
      write_atomicity_ = v & 1;
      return kSuccess;
    case kFeatAsyncEventConfig:
      aec_ = v;
      return kSuccess;
    case kFeatKeepAlive:
      kato_ = v;
      return kSuccess;
    case kFeatHostBehavior:
      if (hb == nullptr) return kInvalidField;
      // Bytes 0-2 (ACRE, ETDAS, LBAFEE) are enables: other values than 0 and 1
      // are not defined.
      for (int i = 0; i < 3; ++i)
        if ((*hb)[i] > 1) return kInvalidField;
      host_behavior_ = *hb;
      return kSuccess;
    default:
      return kInvalidField;
  }
}

uint16_t FeatureSet::get(uint8_t fid, bool dflt, uint32_t cdw11, uint32_t* dw0) const {
  switch (fid) {
    case kFeatArbitration:
      *dw0 = dflt ? 0 : arbitration_;
      return kSuccess;
    case kFeatPowerMgmt:
      *dw0 = dflt ? 0 : power_;
      return kSuccess;
    case kFeatTempThreshold: {
      const uint32_t sel = (cdw11 >> 16) & 0xf, type = (cdw11 >> 20) & 3;
      if (sel != 0 || type > 1) return kInvalidField;
      *dw0 = type == 0 ? (dflt ? kOverTempDefault : temp_over_) : (dflt ? 0u : temp_under_);
      return kSuccess;
    }
    case kFeatErrorRecovery:
      *dw0 = dflt ? 0 : error_recovery_;
      return kSuccess;
    case kFeatVolatileWc:
      *dw0 = dflt ? 1 : vwc_;
      return kSuccess;
    case kFeatIntCoalescing:
      *dw0 = dflt ? 0 : coalescing_;
      return kSuccess;
    case kFeatWriteAtomicity:
      *dw0 = dflt ? 0 : write_atomicity_;
      return kSuccess;
    case kFeatAsyncEventConfig:
      *dw0 = dflt ? 0 : aec_;
      return kSuccess;
    case kFeatKeepAlive:
      *dw0 = dflt ? kato_default_ : kato_;
      return kSuccess;
    default:
      return kInvalidField;
  }
}

const FeatureSet::HostBehavior& FeatureSet::host_behavior(bool dflt) const {
  static const HostBehavior kZero{};
  return dflt ? kZero : host_behavior_;
}

}  // namespace dpukv::nvme
