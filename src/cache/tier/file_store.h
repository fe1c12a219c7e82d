// A ChunkStore on one preallocated local file, driven by io_uring: O_DIRECT where
// the filesystem has it (buffered on tmpfs), the memory tier's arena registered as
// fixed buffers so a spill or reload copies nothing on the way.
#pragma once

#include <liburing.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/tier/chunk_store.h"

namespace dpukv {

class FileStore final : public ChunkStore {
 public:
  // Opens or creates path and reserves capacity bytes in it. The space still
  // needed must be free (statvfs), else nothing is taken, a file this call created
  // is removed, and FULL says so (the message names the directory, the size asked
  // and the space free). buffers (page aligned) are registered for fixed I/O.
  static Status open(const std::string& path, uint64_t capacity, uint32_t queue_depth,
                     const std::vector<std::pair<void*, size_t>>& buffers,
                     std::unique_ptr<ChunkStore>* out);
  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  Status write(uint64_t offset, const void* buf, uint64_t len, uint64_t tag) override;
  Status read(uint64_t offset, void* buf, uint64_t len, uint64_t tag) override;
  size_t poll(Completion* out, size_t max) override;
  int event_fd() const override { return efd_; }
  uint32_t inflight() const override { return inflight_; }
  const char* kind() const override { return "file"; }

 private:
  FileStore() = default;
  Status reserve(const std::string& path, uint64_t capacity, bool created);
  Status submit(bool write, uint64_t offset, void* buf, uint64_t len, uint64_t tag);
  int buf_index(const void* p, uint64_t len) const;

  int fd_ = -1, efd_ = -1;
  bool direct_ = true;
  io_uring ring_{};
  bool ring_ok_ = false;
  std::vector<std::pair<void*, size_t>> bufs_;  // registered fixed buffers
  uint32_t inflight_ = 0;
};

}  // namespace dpukv
