// Which memory-resident chunk leaves memory first. The cache engine tells its
// policy when a chunk enters memory, is used and leaves; the policy answers with
// the next victim among the chunks the engine says may go now (not pinned, not
// being copied). Chunks are the engine's entry ids, 0..max_chunks-1; a policy
// keeps its own links for them, sized once (no allocation on the data path).
//
// Policies: LRU; S3-FIFO (Yang et al., SOSP '23: a small FIFO for new chunks, a
// main FIFO with reinsertion, a ghost list of recent small-queue evictions), which
// keeps a scan of one-time chunks from flushing the working set; and ARC (Megiddo
// and Modha, FAST '03), which balances recency against reuse by what it lately
// dropped. How each compares with the offline optimum: docs/cache_policy.md.
#pragma once

#include <cstdint>

namespace dpukv {

class EvictionPolicy {
 public:
  using MayEvict = bool (*)(const void* ctx, int32_t e);

  virtual ~EvictionPolicy() = default;
  virtual const char* name() const = 0;
  // The chunk (bytes in memory) entered memory; key_hash identifies it across
  // entry reuse (S3-FIFO's ghost list).
  virtual void insert(int32_t e, uint64_t key_hash, uint64_t bytes) = 0;
  // As insert, for a chunk that is first in line to leave (a copy of a chunk
  // another agent holds): LRU puts it at the cold end; S3-FIFO's new chunks
  // already start in its small queue.
  virtual void insert_cold(int32_t e, uint64_t key_hash, uint64_t bytes) {
    insert(e, key_hash, bytes);
  }
  virtual void access(int32_t e) = 0;
  // The chunk left memory; nothing if it was not inserted.
  virtual void remove(int32_t e) = 0;
  // The next chunk to leave, or -1 when none may. The caller either drops it
  // (and calls remove) or keeps it in memory a while (write-back first).
  virtual int32_t victim(MayEvict may_evict, const void* ctx) = 0;
  // The queue that write-back walks ahead of need, coldest first: coldest(),
  // then warmer(e) until -1. (S3-FIFO: its main queue; chunks of the small queue
  // mostly leave without ever being worth a disk write.)
  virtual int32_t coldest() const = 0;
  virtual int32_t warmer(int32_t e) const = 0;
  virtual uint64_t bytes_per_chunk() const = 0;  // the policy's own index memory
};

}  // namespace dpukv
