// The disk tier's index: an append-only log of 88-byte records (put: key, offset,
// length, raw length, xxh3-64, flags; delete: key), each with a sequence number
// and a CRC-32C. A put is appended only after its data write has completed.
// open() replays the log up to the first torn or corrupt record, hands back the
// live chunks in log order, and writes a compacted log (live records only) renamed
// into place; where the disk has no room for it, the old log's valid prefix is
// kept and appended to.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "protocol/chunk_key.h"
#include "runtime/status.h"

namespace dpukv {

class IndexLog {
 public:
  struct Record {
    ChunkKey key;
    uint64_t offset, len, checksum;
    uint64_t raw_len;
    bool encoded;
  };
  // keep(r) says whether a live record still fits the tier (else it is dropped
  // and counted); it is asked newest first, so a tier that holds fewer keeps the
  // most recent. The kept ones come back in *live oldest first (log order, the
  // tier's recency) and are all the new log holds.
  template <typename Keep>
  static Status open(const std::string& path, Keep keep, std::vector<Record>* live,
                     std::unique_ptr<IndexLog>* out) {
    std::vector<Record> all;
    uint64_t records = 0, dropped = 0, seq = 0;
    replay(path, &all, &records, &dropped, &seq);
    const size_t first = live->size();
    for (auto r = all.rbegin(); r != all.rend(); ++r) {
      if (keep(*r))
        live->push_back(*r);
      else
        ++dropped;
    }
    std::reverse(live->begin() + static_cast<std::ptrdiff_t>(first), live->end());
    return compact(path, *live, records, dropped, seq, out);
  }
  ~IndexLog();
  IndexLog(const IndexLog&) = delete;
  IndexLog& operator=(const IndexLog&) = delete;

  // false (counted, errno kept) if the record could not be written whole; a
  // half-written record is cut off so later ones are not behind a torn one.
  bool put(const ChunkKey& key, uint64_t offset, uint64_t len, uint64_t checksum, uint64_t raw_len,
           bool encoded);
  bool del(const ChunkKey& key);
  Status sync();  // to stable storage (clean shutdown)
  uint64_t errors() const { return errors_; }
  int last_errno() const { return last_errno_; }

 private:
  IndexLog() = default;
  static void replay(const std::string& path, std::vector<Record>* live, uint64_t* records,
                     uint64_t* dropped, uint64_t* seq);
  static Status compact(const std::string& path, const std::vector<Record>& live, uint64_t records,
                        uint64_t dropped, uint64_t seq, std::unique_ptr<IndexLog>* out);
  bool append(const void* record);

  int fd_ = -1;
  uint64_t seq_ = 0;
  uint64_t size_ = 0;
  uint64_t errors_ = 0;
  int last_errno_ = 0;
};

}  // namespace dpukv
