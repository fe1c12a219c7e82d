// The core's own log pages (NVMe Base 2.0, 5.16), field by field, without a
// controller.
#include "nvmf/core/log_pages.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "nvme/nvme_spec.h"
#include "testing/spec_bytes_for_tests.h"

namespace dpukv::nvme {
namespace {

using test_bytes::ascii;
using test_bytes::u16;
using test_bytes::u32;
using test_bytes::u64;

TEST(LogPages, TheErrorLogIsNewestFirstAndKeepsTheLastEntries) {
  ErrorLog log;
  std::vector<uint8_t> p(ErrorLog::page_size(), 0xee);
  EXPECT_EQ(log.page(p.data()), 512u);
  EXPECT_EQ(u64(&p[0]), 0u) << "an empty log is zeroes";
  for (uint16_t i = 1; i <= 10; ++i) log.record(i, 100 + i, 0x0002, 1000 + i, 1);
  EXPECT_EQ(log.count(), 10u);
  log.page(p.data());
  for (uint32_t i = 0; i < ErrorLog::kEntries; ++i) {
    const uint8_t* e = &p[i * kErrorLogEntrySize];
    SCOPED_TRACE(i);
    EXPECT_EQ(u64(e), 10u - i);           // Error Count
    EXPECT_EQ(u16(e + 8), 10 - i);        // SQID
    EXPECT_EQ(u16(e + 10), 110 - i);      // CID
    EXPECT_EQ(u16(e + 12), 0x0002 << 1);  // status, phase tag 0
    EXPECT_EQ(u16(e + 14), 0xffff);       // parameter location unknown
    EXPECT_EQ(u64(e + 16), 1010u - i);    // LBA
    EXPECT_EQ(u32(e + 24), 1u);           // NSID
  }
}

TEST(LogPages, SmartAndFirmwareSlot) {
  std::vector<uint8_t> p(kSmartLogSize, 0);
  SmartFigures f;
  f.critical_warning = 2;
  f.temperature_k = 313;
  f.bytes_read = 512 * 1001;  // 1001 units of 512 bytes: 2 thousands, rounded up
  f.bytes_written = 512 * 999;
  f.reads = 5;
  f.writes = 6;
  f.errors = 3;
  EXPECT_EQ(smart_log_page(f, p.data()), 512u);
  EXPECT_EQ(p[0], 2);
  EXPECT_EQ(u16(&p[1]), 313);
  EXPECT_EQ(u64(&p[32]), 2u);  // Data Units Read
  EXPECT_EQ(u64(&p[48]), 1u);  // Data Units Written
  EXPECT_EQ(u64(&p[64]), 5u);
  EXPECT_EQ(u64(&p[80]), 6u);
  EXPECT_EQ(u64(&p[176]), 3u);  // Number of Error Information Log Entries
  EXPECT_EQ(u16(&p[200]), 313);

  std::vector<uint8_t> fw(kFirmwareLogSize, 0);
  EXPECT_EQ(firmware_slot_log_page("1.2", fw.data()), 512u);
  EXPECT_EQ(fw[0], 1);  // AFI: slot 1 active
  EXPECT_EQ(ascii(&fw[8], 8), "1.2     ");
  EXPECT_EQ(fw[16], 0) << "slot 2 is empty";
}

TEST(LogPages, TheWindowCutsAndPadsAndRefusesPastTheEnd) {
  const uint8_t page[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<uint8_t> out;
  ASSERT_TRUE(log_window(page, 8, 4, 8, &out));
  EXPECT_EQ(out, (std::vector<uint8_t>{5, 6, 7, 8, 0, 0, 0, 0}));
  ASSERT_TRUE(log_window(page, 8, 0, 4, &out));
  EXPECT_EQ(out, (std::vector<uint8_t>{1, 2, 3, 4}));
  EXPECT_FALSE(log_window(page, 8, 8, 4, &out));
  EXPECT_FALSE(log_window(page, 8, UINT64_MAX - 2, 4, &out));
}

}  // namespace
}  // namespace dpukv::nvme
