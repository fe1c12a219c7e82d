// The Get/Set Features state of one controller (NVMe Base 2.0, 5.27.1): the
// current value of each feature the controller keeps, its default, and the checks
// Set Features makes on it. Nothing is saveable: Set with SV is refused, and the
// saved value reads as the default.
//
// Not here: Number of Queues and Interrupt Vector Configuration, which are the
// controller's queues' business, and what a feature makes the controller do (a
// temperature threshold crossed raises a warning and an event there: this part
// only says whether the composite temperature is out of its thresholds).
#pragma once

#include <array>
#include <cstdint>

namespace dpukv::nvme {

class FeatureSet {
 public:
  static constexpr uint16_t kOverTempDefault = 343;  // Kelvin (70 °C)
  using HostBehavior = std::array<uint8_t, 512>;

  // Every feature to its default (Keep Alive Timeout to what Connect set, 0 on PCIe).
  void reset();
  // Set Features: an NVMe status. host_behavior: the command's 512 data bytes, for
  // Host Behavior Support only.
  uint16_t set(uint8_t fid, uint32_t cdw11, const HostBehavior* host_behavior);
  // Get Features of the current or (dflt) the default value into *dw0: an NVMe
  // status. Host Behavior Support's data is host_behavior(dflt).
  uint16_t get(uint8_t fid, bool dflt, uint32_t cdw11, uint32_t* dw0) const;
  const HostBehavior& host_behavior(bool dflt) const;

  // The composite sensor at temperature_k is over or under a threshold the host set.
  bool temperature_out_of_range(uint16_t temperature_k) const {
    return temperature_k >= temp_over_ || (temp_under_ != 0 && temperature_k <= temp_under_);
  }
  uint32_t async_event_config() const { return aec_; }
  uint32_t keep_alive_ms() const { return kato_; }
  void set_keep_alive_ms(uint32_t ms) { kato_ = kato_default_ = ms; }  // Connect's KATO

 private:
  uint32_t arbitration_ = 0, power_ = 0, error_recovery_ = 0, vwc_ = 1;
  uint32_t coalescing_ = 0, aec_ = 0, kato_ = 0, kato_default_ = 0, write_atomicity_ = 0;
  // Host Behavior Support (FID 16h): the host's data structure, kept and read
  // back; nothing here acts on it.
  HostBehavior host_behavior_{};
  uint16_t temp_over_ = kOverTempDefault, temp_under_ = 0;  // Kelvin, composite sensor
};

}  // namespace dpukv::nvme
