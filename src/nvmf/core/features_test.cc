// The Get/Set Features state alone: what is set reads back as current, the
// default stays the default, reset() restores every default but Connect's keep
// alive, and values the specification does not define are refused unchanged.
#include "nvmf/core/features.h"

#include <gtest/gtest.h>

#include "nvme/nvme_spec.h"

namespace dpukv::nvme {
namespace {

uint32_t get(const FeatureSet& f, uint8_t fid, bool dflt, uint32_t cdw11 = 0) {
  uint32_t dw0 = 0xdeadbeef;
  EXPECT_EQ(f.get(fid, dflt, cdw11, &dw0), kSuccess) << "fid " << int{fid};
  return dw0;
}

TEST(FeatureSet, WhatIsSetReadsBackAndTheDefaultStays) {
  FeatureSet f;
  const struct {
    uint8_t fid;
    uint32_t set, current, dflt;
  } cases[] = {
      {kFeatArbitration, 0x03020107, 0x03020107, 0},
      {kFeatPowerMgmt, 0x20, 0x20, 0},              // workload hint, power state 0
      {kFeatErrorRecovery, 0xfffffff, 0x1ffff, 0},  // DULBE and TLER only
      {kFeatVolatileWc, 0, 0, 1},                   // on by default
      {kFeatIntCoalescing, 0xabcd1234, 0x1234, 0},  // time and threshold
      {kFeatWriteAtomicity, 3, 1, 0},               // one bit
      {kFeatAsyncEventConfig, 0x80000002, 0x80000002, 0},
      {kFeatKeepAlive, 5000, 5000, 0},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(int{c.fid});
    EXPECT_EQ(f.set(c.fid, c.set, nullptr), kSuccess);
    EXPECT_EQ(get(f, c.fid, false), c.current);
    EXPECT_EQ(get(f, c.fid, true), c.dflt);
  }
  f.reset();
  for (const auto& c : cases) EXPECT_EQ(get(f, c.fid, false), c.dflt) << int{c.fid};
}

TEST(FeatureSet, UndefinedValuesAreRefusedAndChangeNothing) {
  FeatureSet f;
  EXPECT_EQ(f.set(kFeatPowerMgmt, 1, nullptr), kInvalidField) << "power state 1 of 1";
  EXPECT_EQ(get(f, kFeatPowerMgmt, false), 0u);
  EXPECT_EQ(f.set(kFeatTempThreshold, 1u << 16 | 300, nullptr), kInvalidField) << "sensor 1";
  EXPECT_EQ(f.set(kFeatTempThreshold, 2u << 20 | 300, nullptr), kInvalidField) << "type 2";
  uint32_t dw0;
  EXPECT_EQ(f.get(kFeatTempThreshold, false, 1u << 16, &dw0), kInvalidField);
  EXPECT_EQ(f.set(0x7f, 0, nullptr), kInvalidField) << "a feature this controller lacks";
  EXPECT_EQ(f.get(0x7f, false, 0, &dw0), kInvalidField);
  FeatureSet::HostBehavior hb{};
  hb[1] = 2;  // ETDAS is an enable: 0 or 1
  EXPECT_EQ(f.set(kFeatHostBehavior, 0, &hb), kInvalidField);
  EXPECT_EQ(f.set(kFeatHostBehavior, 0, nullptr), kInvalidField) << "no data";
  EXPECT_EQ(f.host_behavior(false)[1], 0);
}

TEST(FeatureSet, HostBehaviorIsKeptAndReadBack) {
  FeatureSet f;
  FeatureSet::HostBehavior hb{};
  hb[0] = 1;
  hb[100] = 0x5a;  // reserved bytes are kept as given
  ASSERT_EQ(f.set(kFeatHostBehavior, 0, &hb), kSuccess);
  EXPECT_EQ(f.host_behavior(false), hb);
  EXPECT_EQ(f.host_behavior(true), FeatureSet::HostBehavior{});
  f.reset();
  EXPECT_EQ(f.host_behavior(false), FeatureSet::HostBehavior{});
}

TEST(FeatureSet, TemperatureThresholds) {
  FeatureSet f;
  EXPECT_EQ(get(f, kFeatTempThreshold, false), FeatureSet::kOverTempDefault);
  EXPECT_EQ(get(f, kFeatTempThreshold, false, 1u << 20), 0u) << "no under threshold";
  EXPECT_FALSE(f.temperature_out_of_range(313));
  ASSERT_EQ(f.set(kFeatTempThreshold, 300, nullptr), kSuccess);  // over 300 K
  EXPECT_TRUE(f.temperature_out_of_range(313));
  EXPECT_EQ(get(f, kFeatTempThreshold, true), FeatureSet::kOverTempDefault);
  ASSERT_EQ(f.set(kFeatTempThreshold, 400, nullptr), kSuccess);
  ASSERT_EQ(f.set(kFeatTempThreshold, 1u << 20 | 320, nullptr), kSuccess);  // under 320 K
  EXPECT_EQ(get(f, kFeatTempThreshold, false, 1u << 20), 320u);
  EXPECT_TRUE(f.temperature_out_of_range(313));
  EXPECT_FALSE(f.temperature_out_of_range(330));
}

TEST(FeatureSet, ConnectsKeepAliveIsTheDefaultAResetKeeps) {
  FeatureSet f;
  f.set_keep_alive_ms(15000);
  EXPECT_EQ(f.keep_alive_ms(), 15000u);
  ASSERT_EQ(f.set(kFeatKeepAlive, 2000, nullptr), kSuccess);
  EXPECT_EQ(f.keep_alive_ms(), 2000u);
  EXPECT_EQ(get(f, kFeatKeepAlive, true), 15000u);
  f.reset();
  EXPECT_EQ(f.keep_alive_ms(), 15000u);
}

}  // namespace
}  // namespace dpukv::nvme
