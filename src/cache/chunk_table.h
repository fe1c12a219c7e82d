// The cache's table of chunks: for every key it holds, an entry that says where the
// chunk's copies are and what each copy is doing, plus the two orders the tiers
// need beyond the eviction policy's: the disk queue (which disk copy goes first)
// and the residency feed (who is told when a chunk becomes present or leaves).
//
// Contract:
//  - Entry ids are 0..capacity-1 and stable while the entry lives; insert() hands
//    one out (or -1 when all are in use), erase() takes it back. Nothing is
//    allocated after init().
//  - A chunk is *present* (lookup, contains and the residency feed see it) when its
//    memory copy is Ready or its disk copy is Ready. Every other state is a copy
//    under way that nobody may read yet.
//  - The table does not move bytes, own memory or disk space, or choose victims: it
//    records what the cache engine decided. It never calls back into the engine
//    except through the residency listeners.
//
// Not thread safe: used from the cache engine's thread.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "cache/chunk_index.h"
#include "protocol/chunk_key.h"

namespace dpukv {

struct ChunkEntry {
  // The memory copy. Only Ready may be read; the others hold the entry against
  // eviction and removal.
  enum class Memory : uint8_t {
    kNone,          // no memory copy
    kAwaitingRoom,  // a store holds the entry and waits for room; no slot yet
    kFilling,       // a slot is allocated and a store or a reload is writing it
    kIngesting,     // a slot lent to another writer (begin_ingest .. end_ingest)
    kReady,         // complete, its checksum known
  };
  // The disk copy.
  enum class Disk : uint8_t {
    kNone,     // none
    kWriting,  // a write-back from the memory copy is under way
    kReady,    // complete and in the index log
  };

  ChunkKey key;
  uint64_t key_hash = 0;  // key.hash(), taken once at insert
  uint64_t size = 0;      // bytes of the chunk as the client gave it
  uint64_t stored = 0;    // bytes it takes in the tiers (encoded size, or size)
  uint64_t checksum = 0;  // xxh3-64 of the stored bytes
  uint64_t mem_off = 0, disk_off = 0;
  uint64_t pin_deadline = 0;
  int32_t dprev = -1, dnext = -1;  // disk queue links (while linked)
  int32_t wprev = -1, wnext = -1;  // write queue links (while write_queued)
  uint32_t hits = 0;
  uint16_t pins = 0;     // lookup pins; they hold until unpinned or pin_deadline
  uint16_t readers = 0;  // copies out of the memory copy under way (DMA, write-back)
  Memory memory = Memory::kNone;
  Disk disk = Disk::kNone;
  bool used = false;     // the entry holds a chunk
  bool encoded = false;  // stored with the lossless KV codec
  // The write-back under way was started to make room: drop the memory copy
  // once the disk copy is Ready.
  bool evict_after_write = false;
  bool announced = false;     // the residency listeners were told it is present
  bool write_queued = false;  // waits in the write queue for a write-back slot
  // An ingested copy not yet read here: the read it was fetched for does not make
  // it recent (another agent holds the chunk; this copy goes first).
  bool replica_unread = false;

  bool pinned(uint64_t now) const { return pins != 0 && now < pin_deadline; }
  bool has_memory() const {  // holds a slot of the memory tier
    return memory == Memory::kFilling || memory == Memory::kIngesting || memory == Memory::kReady;
  }
  bool mem_ready() const { return memory == Memory::kReady; }
  bool filling() const {  // a memory copy is on its way
    return memory == Memory::kAwaitingRoom || memory == Memory::kFilling ||
           memory == Memory::kIngesting;
  }
  bool on_disk() const { return disk == Disk::kReady; }
  bool writing() const { return disk == Disk::kWriting; }
  bool present() const { return mem_ready() || on_disk(); }
  // Something is reading, writing or holding the chunk: it may not be removed.
  bool busy(uint64_t now) const { return readers != 0 || writing() || filling() || pinned(now); }
};

class ChunkTable {
 public:
  using ResidencyCb = void (*)(void* arg, const ChunkKey& key, bool present);

  ChunkTable() = default;
  ChunkTable(const ChunkTable&) = delete;  // the index points back at the table
  ChunkTable& operator=(const ChunkTable&) = delete;

  void init(uint32_t capacity);
  uint32_t capacity() const { return static_cast<uint32_t>(entries_.size()); }

  // The entry that holds k, or -1.
  int32_t find(const ChunkKey& k) const { return index_.find(k); }
  int32_t find(const ChunkKey& k, uint64_t hash) const { return index_.find(k, hash); }
  // A fresh entry for k (hash: k.hash()), which must not be in the table; -1 when
  // all are in use.
  int32_t insert(const ChunkKey& k, uint64_t hash);
  int32_t insert(const ChunkKey& k) { return insert(k, k.hash()); }
  // Takes entry e out of the table and the disk queue; if it was announced, the
  // listeners are told it left. Erasing a free entry is a bug, logged and ignored.
  void erase(int32_t e);
  ChunkEntry& at(int32_t e) { return entries_[static_cast<size_t>(e)]; }
  const ChunkEntry& at(int32_t e) const { return entries_[static_cast<size_t>(e)]; }

  // The disk queue: every chunk with a disk copy, most valuable first. The tier
  // makes room from the back (coldest, then warmer).
  void disk_push_front(int32_t e);
  void disk_push_back(int32_t e);
  void disk_unlink(int32_t e);  // no-op if not linked
  int32_t disk_coldest() const { return disk_q_.tail; }
  int32_t disk_warmer(int32_t e) const { return at(e).dprev; }
  uint64_t disk_queue_bytes() const { return disk_q_.bytes; }

  // The write queue: chunks that must reach the disk tier (write-through) and wait
  // for a write-back slot, oldest first. erase() takes an entry out of it.
  void write_queue_push(int32_t e);    // no-op if queued
  void write_queue_unlink(int32_t e);  // no-op if not queued
  int32_t write_queue_front() const { return write_q_.head; }
  uint64_t write_queue_length() const { return write_q_.length; }

  // The residency feed. announce(e): the chunk became present. A listener added
  // with replay is first told of every chunk present now (announcing those not yet
  // announced to everyone). Listeners must not add or remove listeners from the
  // callback.
  void announce(int32_t e);
  void add_listener(ResidencyCb cb, void* arg, bool replay);
  void remove_listener(ResidencyCb cb, void* arg);

  struct Counts {
    uint64_t chunks = 0;                      // entries in use
    uint64_t memory = 0, disk = 0, both = 0;  // Ready copies
  };
  Counts counts() const;
  // Bytes the table spends per chunk: its entry and its index slots.
  uint64_t bytes_per_chunk() const { return sizeof(ChunkEntry) + index_.bytes_per_id(); }

 private:
  struct KeyOf {
    const ChunkTable* table;
    const ChunkKey* operator()(int32_t e) const {
      const ChunkEntry& en = table->at(e);
      return en.used ? &en.key : nullptr;
    }
  };
  void tell(const ChunkKey& key, bool present);

  std::vector<ChunkEntry> entries_;
  ChunkIndex<KeyOf> index_{KeyOf{this}};
  struct {
    int32_t head = -1, tail = -1;
    uint64_t bytes = 0;
  } disk_q_;
  struct {
    int32_t head = -1, tail = -1;
    uint64_t length = 0;
  } write_q_;
  uint64_t used_ = 0;
  std::vector<std::pair<ResidencyCb, void*>> listeners_;
};

}  // namespace dpukv
