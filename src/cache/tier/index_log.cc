#include "cache/tier/index_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "runtime/crc32c.h"
#include "runtime/log.h"

namespace dpukv {
namespace {

struct LogRecord {
  static constexpr uint32_t kMagic = 0x474c4b44;  // "DKLG"
  uint32_t magic;
  uint16_t type;   // 1 put, 2 delete
  uint16_t flags;  // bit 0: the stored bytes are a KV-codec chunk
  ChunkKey key;
  uint64_t offset;
  uint64_t len;      // bytes stored
  uint64_t raw_len;  // bytes of the chunk as the client gave it
  uint64_t checksum;
  uint64_t seq;
  uint32_t pad;
  uint32_t crc;  // crc32c of everything before it
};
static_assert(sizeof(LogRecord) == 88);

struct KeyHash {
  size_t operator()(const ChunkKey& k) const { return k.hash(); }
};

bool write_all(int fd, const void* p, size_t n) {
  auto* c = static_cast<const uint8_t*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w, n -= static_cast<size_t>(w);
  }
  return true;
}

LogRecord put_record(const IndexLog::Record& r, uint64_t seq) {
  LogRecord rec{};
  rec.magic = LogRecord::kMagic;
  rec.type = 1;
  rec.flags = r.encoded ? 1 : 0;
  rec.key = r.key;
  rec.offset = r.offset;
  rec.len = r.len;
  rec.raw_len = r.raw_len;
  rec.checksum = r.checksum;
  rec.seq = seq;
  rec.crc = crc32c(&rec, offsetof(LogRecord, crc));
  return rec;
}

}  // namespace

void IndexLog::replay(const std::string& path, std::vector<Record>* out, uint64_t* records,
                      uint64_t* dropped, uint64_t* seq) {
  // Each live record with its sequence number: recovery hands them back in log
  // order (oldest first), which is the disk tier's recency order.
  std::unordered_map<ChunkKey, std::pair<uint64_t, Record>, KeyHash> live;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat sb {};
  const uint64_t file_bytes = ::fstat(fd, &sb) == 0 ? static_cast<uint64_t>(sb.st_size) : 0;
  const uint64_t in_file = (file_bytes + sizeof(LogRecord) - 1) / sizeof(LogRecord);
  LogRecord r;
  for (uint64_t at = 0;; ++at) {
    ssize_t n = ::read(fd, &r, sizeof(r));
    if (n > 0 && n < static_cast<ssize_t>(sizeof(r)))  // a record the crash cut short
      LOG_INFO("disk tier: index log %s: its last record is torn (%zd of %zu bytes); cut",
               path.c_str(), n, sizeof(r));
    if (n != static_cast<ssize_t>(sizeof(r))) break;  // end, or a torn tail
    const char* bad = r.magic != LogRecord::kMagic                    ? "not a record's magic"
                      : r.crc != crc32c(&r, offsetof(LogRecord, crc)) ? "its CRC does not match"
                      : (r.type != 1 && r.type != 2)                  ? "an unknown record type"
                                                                      : nullptr;
    if (bad != nullptr) {
      // Nothing after a damaged record is trusted: what only those records named is lost.
      const uint64_t lost = in_file - at;
      *dropped += lost;
      LOG_WARN(
          "disk tier: index log %s: record %llu of %llu is damaged (%s); it and the %llu after "
          "it are discarded, and the chunks only they named are lost",
          path.c_str(), static_cast<unsigned long long>(at + 1),
          static_cast<unsigned long long>(in_file), bad, static_cast<unsigned long long>(lost - 1));
      break;
    }
    ++*records;
    *seq = std::max(*seq, r.seq + 1);
    if (r.type == 1)
      live[r.key] = {r.seq,
                     Record{r.key, r.offset, r.len, r.checksum, r.raw_len, (r.flags & 1) != 0}};
    else
      live.erase(r.key);
  }
  ::close(fd);
  std::vector<std::pair<uint64_t, Record>> by_seq;
  by_seq.reserve(live.size());
  for (auto& [k, sr] : live) by_seq.push_back(sr);
  std::sort(by_seq.begin(), by_seq.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  out->reserve(out->size() + by_seq.size());
  for (auto& [s, rec] : by_seq) out->push_back(rec);
}

namespace {

// Writes the live set to path.tmp and renames it into place; false (errno in
// *err) if any step fails, with path left as it was.
bool write_compacted(const std::string& path, const std::vector<IndexLog::Record>& live,
                     uint64_t seq, int* err) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) {
    *err = errno;
    return false;
  }
  bool ok = true;
  for (const IndexLog::Record& r : live) {
    const LogRecord rec = put_record(r, seq++);
    if (!(ok = write_all(fd, &rec, sizeof(rec)))) break;
  }
  ok = ok && ::fdatasync(fd) == 0;
  if (!ok) *err = errno != 0 ? errno : EIO;
  if (::close(fd) != 0 && ok) {
    *err = errno;
    ok = false;
  }
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    *err = errno;
    ok = false;
  }
  if (!ok) ::unlink(tmp.c_str());
  return ok;
}

}  // namespace

Status IndexLog::compact(const std::string& path, const std::vector<Record>& live, uint64_t records,
                         uint64_t dropped, uint64_t seq, std::unique_ptr<IndexLog>* out) {
  std::unique_ptr<IndexLog> l(new IndexLog());
  int err = 0;
  errno = 0;
  if (write_compacted(path, live, seq, &err)) {
    l->fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    l->size_ = live.size() * sizeof(LogRecord);
    l->seq_ = seq + live.size();
  } else {
    // A full disk is no reason to lose the tier: keep the old log's valid prefix
    // (cutting a torn tail frees space, it never needs any) and append to it. The
    // records dropped above stay in it; at the next start they are asked again,
    // newest first, so a stale one loses its extent to any newer record, and the
    // checksum catches what is left.
    LOG_WARN("disk tier: cannot compact the index log %s (%s); appending to it as it is",
             path.c_str(), std::strerror(err));
    l->size_ = records * sizeof(LogRecord);
    l->seq_ = seq;
    l->fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (l->fd_ >= 0 && ::ftruncate(l->fd_, static_cast<off_t>(l->size_)) != 0) {
      ::close(l->fd_);
      l->fd_ = -1;
    }
  }
  if (l->fd_ < 0) {
    LOG_ERR("disk tier: cannot open the index log %s: %s", path.c_str(), std::strerror(errno));
    return Code::kIoFailed;
  }
  if (records || dropped)
    LOG_INFO("disk tier: recovered %zu chunks from %llu log records (%llu dropped)", live.size(),
             static_cast<unsigned long long>(records), static_cast<unsigned long long>(dropped));
  *out = std::move(l);
  return Code::kSuccess;
}

IndexLog::~IndexLog() {
  if (fd_ >= 0) {
    (void)::fdatasync(fd_);
    ::close(fd_);
  }
}

bool IndexLog::put(const ChunkKey& key, uint64_t offset, uint64_t len, uint64_t checksum,
                   uint64_t raw_len, bool encoded) {
  const LogRecord rec = put_record(Record{key, offset, len, checksum, raw_len, encoded}, seq_++);
  return append(&rec);
}

bool IndexLog::del(const ChunkKey& key) {
  LogRecord rec{};
  rec.magic = LogRecord::kMagic;
  rec.type = 2;
  rec.key = key;
  rec.seq = seq_++;
  rec.crc = crc32c(&rec, offsetof(LogRecord, crc));
  return append(&rec);
}

bool IndexLog::append(const void* rec) {
  errno = 0;
  if (write_all(fd_, rec, sizeof(LogRecord))) {
    size_ += sizeof(LogRecord);
    return true;
  }
  last_errno_ = errno != 0 ? errno : EIO;
  // Cut a half-written record off, so later records are not behind a torn one.
  if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) LOG_ERR("disk tier: cannot trim the log");
  ++errors_;
  return false;
}

Status IndexLog::sync() {
  return ::fdatasync(fd_) == 0 ? Status() : Status(Code::kIoFailed);
}

}  // namespace dpukv
