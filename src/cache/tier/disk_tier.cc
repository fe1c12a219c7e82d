#include "cache/tier/disk_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "cache/tier/file_store.h"
#include "cache/tier/nvme_store.h"
#include "runtime/log.h"

namespace dpukv {

// Only one agent may own a disk tier: two would allocate the same extents and
// overwrite each other's chunks. The lock file holds the owner's pid so that the
// refusal can name it; the lock itself dies with the process (kill -9 included).
Status DiskTier::lock_dir(const std::string& dir) {
  const std::string path = dir + "/dpukv.lock";
  lock_fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0640);
  if (lock_fd_ < 0) {
    LOG_ERR("disk tier: cannot open %s: %s", path.c_str(), std::strerror(errno));
    return Code::kIoFailed;
  }
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    const ssize_t n = ::pread(lock_fd_, pid, sizeof(pid) - 1, 0);
    if (n > 0) pid[n] = '\0';
    if (err == EWOULDBLOCK)
      LOG_ERR(
          "disk tier: %s is in use by another agent (pid %s); each agent needs its own "
          "--local-disk",
          dir.c_str(), n > 0 ? std::to_string(std::atol(pid)).c_str() : "unknown");
    else
      LOG_ERR("disk tier: cannot lock %s: %s", path.c_str(), std::strerror(err));
    return err == EWOULDBLOCK ? Code::kBadState : Code::kIoFailed;
  }
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock_fd_, 0) != 0 || ::pwrite(lock_fd_, me.data(), me.size(), 0) < 0)
    LOG_WARN("disk tier: cannot record the pid in %s: %s", path.c_str(), std::strerror(errno));
  return Code::kSuccess;
}

namespace {

// Where a tier's bytes can live, in the order they are considered: the first
// whose options are given is chosen (a store is one row here and one ChunkStore).
struct ChunkStoreKind {
  const char* name;
  bool (*chosen)(const DiskTierOptions& o);
  Status (*open)(const DiskTierOptions& o, uint64_t capacity,
                 const std::vector<std::pair<void*, size_t>>& buffers,
                 std::unique_ptr<ChunkStore>* out);
};

Status open_nvme_store(const DiskTierOptions& o, uint64_t capacity,
                       const std::vector<std::pair<void*, size_t>>&,
                       std::unique_ptr<ChunkStore>* out) {
  return NvmeStore::open({o.nvme_address, o.nvme_nqn, o.nvme_nsid, capacity, o.queue_depth}, out);
}

Status open_file_store(const DiskTierOptions& o, uint64_t capacity,
                       const std::vector<std::pair<void*, size_t>>& buffers,
                       std::unique_ptr<ChunkStore>* out) {
  return FileStore::open(o.dir + "/dpukv-data", capacity, o.queue_depth, buffers, out);
}

constexpr ChunkStoreKind kChunkStores[] = {
    {"nvme-tcp", [](const DiskTierOptions& o) { return !o.nvme_address.empty(); },
     &open_nvme_store},
    {"file", [](const DiskTierOptions&) { return true; }, &open_file_store},
};

}  // namespace

Status DiskTier::open(const DiskTierOptions& o,
                      const std::vector<std::pair<void*, size_t>>& buffers,
                      std::vector<Recovered>* recovered, std::unique_ptr<DiskTier>* out) {
  std::unique_ptr<DiskTier> t(new DiskTier());
  if (::mkdir(o.dir.c_str(), 0750) != 0 && errno != EEXIST) {
    LOG_ERR("disk tier: mkdir %s: %s", o.dir.c_str(), std::strerror(errno));
    return Code::kIoFailed;
  }
  DPUKV_RETURN_IF_ERROR(t->lock_dir(o.dir));
  DPUKV_RETURN_IF_ERROR(t->alloc_.init(o.capacity, o.page_size));
  const ChunkStoreKind* kind = nullptr;
  for (const ChunkStoreKind& k : kChunkStores)
    if (kind == nullptr && k.chosen(o)) kind = &k;
  // A log whose data file is gone names chunks nobody can read: start empty, and say so.
  const std::string data_path = o.dir + "/dpukv-data";
  const bool data_missing = o.nvme_address.empty() && ::access(data_path.c_str(), F_OK) != 0;
  DPUKV_RETURN_IF_ERROR(kind->open(o, t->alloc_.capacity(), buffers, &t->store_));
  LOG_INFO("disk tier %s: data on %s %s", o.dir.c_str(), kind->name,
           o.nvme_address.empty() ? "dpukv-data" : o.nvme_address.c_str());
  SlabAllocator* alloc = &t->alloc_;
  uint64_t kept = 0, no_data = 0, over_table = 0, no_room = 0;
  const uint64_t max_chunks = o.max_chunks;
  DPUKV_RETURN_IF_ERROR(IndexLog::open(
      o.dir + "/dpukv-index.log",
      [&](const IndexLog::Record& r) {
        if (data_missing) return ++no_data, false;
        if (max_chunks != 0 && kept >= max_chunks) return ++over_table, false;
        if (!alloc->alloc_at(r.offset, r.len)) return ++no_room, false;
        ++kept;
        return true;
      },
      recovered, &t->log_));
  if (no_data != 0)
    LOG_WARN(
        "disk tier %s: the data file %s was missing (made anew): the %llu chunks its index "
        "log named are lost",
        o.dir.c_str(), data_path.c_str(), static_cast<unsigned long long>(no_data));
  if (over_table != 0)
    LOG_WARN(
        "disk tier %s: the chunk table holds %llu chunks: the %llu oldest of the log's are "
        "dropped (raise max_chunks to keep them)",
        o.dir.c_str(), static_cast<unsigned long long>(max_chunks),
        static_cast<unsigned long long>(over_table));
  if (no_room != 0)
    LOG_WARN(
        "disk tier %s: %llu chunks of the log lie outside this tier's size or overlap newer "
        "ones: dropped (a smaller max_local_disk_size than before?)",
        o.dir.c_str(), static_cast<unsigned long long>(no_room));
  *out = std::move(t);
  return Code::kSuccess;
}

DiskTier::~DiskTier() {
  log_.reset();                          // flushed first
  store_.reset();                        // then no I/O is left
  if (lock_fd_ >= 0) ::close(lock_fd_);  // and the directory is free again
}

}  // namespace dpukv
