#include "nvmf/core/log_pages.h"

#include <algorithm>
#include <cstring>

#include "nvme/nvme_spec.h"

namespace dpukv::nvme {

uint32_t ErrorLog::page(uint8_t* page) const {
  std::memset(page, 0, page_size());
  const uint64_t have = std::min<uint64_t>(count_, kEntries);
  for (uint64_t i = 0; i < have; ++i) {
    const Entry& e = ring_[(count_ - 1 - i) % kEntries];
    uint8_t* p = page + i * kErrorLogEntrySize;
    put64(p, e.count);
    put16(p + 8, e.sqid);
    put16(p + 10, e.cid);
    put16(p + 12, static_cast<uint16_t>(e.status << 1));  // bit 0 is the phase tag
    put16(p + 14, 0xffff);                                // parameter location unknown
    put64(p + 16, e.lba);
    put32(p + 24, e.nsid);
  }
  return page_size();
}

uint32_t smart_log_page(const SmartFigures& f, uint8_t* page) {
  page[0] = f.critical_warning;
  put16(page + 1, f.temperature_k);
  page[3] = 100;  // available spare
  page[4] = 10;   // spare threshold
  // Data units are thousands of 512-byte units, rounded up.
  put64(page + 32, (f.bytes_read / 512 + 999) / 1000);
  put64(page + 48, (f.bytes_written / 512 + 999) / 1000);
  put64(page + 64, f.reads);
  put64(page + 80, f.writes);
  put64(page + 176, f.errors);
  put16(page + 200, f.temperature_k);  // temperature sensor 1
  return kSmartLogSize;
}

uint32_t firmware_slot_log_page(std::string_view firmware, uint8_t* page) {
  page[0] = 1;  // active slot 1
  put_ascii(page + 8, 8, firmware);
  return kFirmwareLogSize;
}

bool log_window(const uint8_t* page, uint64_t size, uint64_t offset, uint64_t len,
                std::vector<uint8_t>* out) {
  if (offset >= size) return false;
  out->assign(len, 0);  // admin path: a small allocation is fine
  std::memcpy(out->data(), page + offset, std::min<uint64_t>(len, size - offset));
  return true;
}

}  // namespace dpukv::nvme
