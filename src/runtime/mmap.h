// Memory maps: a registered range of memory with access permissions, the unit that
// buffers point into and that engines are allowed to touch (doca_mmap).
//
// A local map covers memory the caller owns. A map backed by a memfd can be
// exported: export_to() produces a fixed-size descriptor plus the fd, which travel
// over a UNIX socket (SCM_RIGHTS) to a peer that calls Mmap::import(). The
// importer maps the same pages, so the peer's engines copy straight into and out
// of the exporter's memory: the software twin of a PCIe mmap export.
//
// Lifetimes: the memory of a local map must outlive the map; a map must outlive
// every buffer taken from it (stop() refuses with BAD_STATE while buffers exist).
// Thread safety: none; a map is configured by one thread. Engines read it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/status.h"

namespace dpukv {

// Access flags, as doca_access_flag. Local access is what this process's engines may
// do; export access is what an importing peer may do (PCI read-only / read-write).
enum Access : uint32_t {
  kAccessLocalRead = 1u << 0,
  kAccessLocalReadWrite = 1u << 1,
  kAccessExportRead = 1u << 2,
  kAccessExportReadWrite = 1u << 3,
};

// Wire form of an export, little-endian, fixed size; documented in docs/protocols.md.
struct ExportDescriptor {
  static constexpr uint32_t kMagic = 0x584d4b44;  // "DKMX"
  static constexpr uint16_t kVersion = 1;
  uint32_t magic;
  uint16_t version;
  uint16_t access;      // kAccessExportRead or kAccessExportReadWrite
  uint64_t map_id;      // exporter's id for this map, unique within its process
  uint64_t fd_offset;   // page-aligned offset of the mapping in the fd
  uint64_t length;      // bytes the map covers
  uint32_t page_delta;  // start of the map within its first page
  uint32_t reserved;    // must be 0
};
static_assert(sizeof(ExportDescriptor) == 40, "export descriptor is a wire format");

class Mmap {
 public:
  // Registers [addr, addr+len) owned by the caller. If fd >= 0 it is a memfd that
  // holds the range at fd_offset (the map dups it), and the map can be exported.
  static Status create(void* addr, size_t len, uint32_t access, int fd, uint64_t fd_offset,
                       std::unique_ptr<Mmap>* out);
  // Maps a peer's export. Validates every field against the fd: size, seals, access.
  // Takes no ownership of fd (it is dup'ed). desc_len must equal sizeof(ExportDescriptor).
  static Status import(const void* desc, size_t desc_len, int fd, std::unique_ptr<Mmap>* out);

  ~Mmap();
  Mmap(const Mmap&) = delete;
  Mmap& operator=(const Mmap&) = delete;

  Status start();
  // BAD_STATE while buffers taken from the map are alive.
  Status stop();
  bool started() const { return started_; }

  // Fills the descriptor; *fd_out is the map's fd, still owned by the map (send it,
  // do not close it). NOT_PERMITTED without export access; NOT_SUPPORTED without fd.
  Status export_to(ExportDescriptor* desc, int* fd_out) const;

  uint8_t* addr() const { return addr_; }
  size_t length() const { return len_; }
  uint32_t access() const { return access_; }
  bool imported() const { return imported_; }
  // Imported maps: the exporter's file had no holes at import (every page exists,
  // so faulting them in here allocates nothing).
  bool dense() const { return dense_; }
  // Faults in the next step bytes of a dense import's page tables (an importer that
  // will write all of it, off its data path: the first touch of a page costs
  // ~1.3 us here, four times a 4 KiB copy). True once nothing is left, or for a map
  // that is not a dense import.
  bool populate_some(size_t step);
  bool populated() const { return !imported_ || !dense_ || populated_ >= mapping_len_; }
  size_t populated_bytes() const { return populated_; }
  uint64_t id() const { return id_; }
  // For imported maps: the exporter's id of the map.
  uint64_t peer_map_id() const { return peer_map_id_; }

  bool readable() const { return (access_ & (kAccessLocalRead | kAccessLocalReadWrite)) != 0; }
  bool writable() const { return (access_ & kAccessLocalReadWrite) != 0; }
  bool contains(const void* p, size_t n) const {
    auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(addr_);
    return a >= b && n <= len_ && a - b <= len_ - n;
  }

  // Identity of the backing pages, so that overlap checks see through aliases (an
  // import and its export in one process are two addresses for the same bytes).
  struct Backing {
    uint64_t dev = 0, ino = 0;  // 0/0: not file-backed; compare virtual addresses
    uint64_t offset = 0;        // file offset of addr()
  };
  const Backing& backing() const { return backing_; }

  size_t live_buffers() const { return live_bufs_; }

 private:
  friend class BufInventory;
  Mmap() = default;
  uint8_t* addr_ = nullptr;
  size_t len_ = 0;
  uint32_t access_ = 0;
  int fd_ = -1;
  uint64_t fd_offset_ = 0;
  bool imported_ = false;
  bool started_ = false;
  uint64_t id_ = 0;
  uint64_t peer_map_id_ = 0;
  void* mapping_ = nullptr;  // imported maps own their mapping
  size_t mapping_len_ = 0;
  bool dense_ = false;
  size_t populated_ = 0;  // bytes of the mapping populate_some has faulted in
  Backing backing_;
  size_t live_bufs_ = 0;
};

}  // namespace dpukv
