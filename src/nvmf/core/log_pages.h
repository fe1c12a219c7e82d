// The log pages the controller core serves itself (NVMe Base 2.0, 5.16): the
// Error Information log, SMART / Health Information and Firmware Slot Information,
// each built into a zeroed page from the figures that describe it; pure functions
// and one small ring, no controller state. Get Log Page's offset/length window
// over a page is here too, so every log page is cut the same way.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace dpukv::nvme {

inline constexpr uint32_t kErrorLogEntrySize = 64;
inline constexpr uint32_t kSmartLogSize = 512;
inline constexpr uint32_t kFirmwareLogSize = 512;

// The last kEntries command errors, and how many there were in all (the Error
// Count each entry carries, and the SMART log's Number of Error Information Log
// Entries).
class ErrorLog {
 public:
  static constexpr uint32_t kEntries = 8;  // Identify ELPE = kEntries - 1
  void record(uint16_t sqid, uint16_t cid, uint16_t status, uint64_t lba, uint32_t nsid) {
    ring_[count_ % kEntries] = Entry{count_ + 1, sqid, cid, status, lba, nsid};
    ++count_;
  }
  uint64_t count() const { return count_; }
  // The log page: kEntries entries, newest first, unused ones zero. page holds
  // page_size() bytes. Returns page_size().
  uint32_t page(uint8_t* page) const;
  static constexpr uint32_t page_size() { return kEntries * kErrorLogEntrySize; }

 private:
  struct Entry {
    uint64_t count;
    uint16_t sqid, cid, status;
    uint64_t lba;
    uint32_t nsid;
  };
  std::array<Entry, kEntries> ring_{};
  uint64_t count_ = 0;
};

struct SmartFigures {
  uint8_t critical_warning = 0;
  uint16_t temperature_k = 0;  // composite, Kelvin
  uint64_t bytes_read = 0, bytes_written = 0;
  uint64_t reads = 0, writes = 0;  // host read / write commands
  uint64_t errors = 0;             // error information log entries in all
};
// page holds kSmartLogSize bytes, zeroed. Returns kSmartLogSize.
uint32_t smart_log_page(const SmartFigures& f, uint8_t* page);
// One read-only slot, active, holding firmware. page holds kFirmwareLogSize bytes,
// zeroed. Returns kFirmwareLogSize.
uint32_t firmware_slot_log_page(std::string_view firmware, uint8_t* page);

// Get Log Page's window: len bytes of a page of size bytes from offset, zeros past
// its end. False (Invalid Field) when offset is at or past the end.
bool log_window(const uint8_t* page, uint64_t size, uint64_t offset, uint64_t len,
                std::vector<uint8_t>* out);

}  // namespace dpukv::nvme
