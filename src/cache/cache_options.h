// What the cache is built with (CacheOptions), what it counts (CacheStats), and
// where a chunk lies for another agent to read it (ChunkPlacement): the words the
// cache's parts (placement.h, request_pipeline.h) and its façade (cache_engine.h)
// share with the agent and the cluster.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engines/dma/dma_engine.h"

namespace dpukv {

struct CacheOptions {
  uint64_t memory_bytes = 1ull << 30;      // memory tier capacity
  uint64_t max_chunk_bytes = 64ull << 20;  // largest chunk (allocator page size)
  uint32_t max_chunks = 1u << 20;          // index capacity
  uint32_t max_requests = 1024;            // store/retrieve/prefetch in flight
  std::string disk_dir;                    // empty: no disk tier
  uint64_t disk_bytes = 0;
  // The NVMe tier: the disk tier's data on an NVMe/TCP namespace ("ADDR:PORT" and
  // subsystem NQN) instead of a local file; the index log stays in disk_dir.
  std::string nvme_address, nvme_nqn;
  bool write_through = false;    // disk tier: write every stored chunk at once (else on eviction)
  uint32_t disk_admit_hits = 0;  // only chunks hit at least this often go to disk
  uint32_t pin_timeout_ms = 30000;  // lookup pins expire after this
  DmaOptions dma;                   // the engine's DMA context
  // Encode chunks with the lossless KV codec on the compress engine before they
  // enter the memory tier (decoded on retrieve). Chunks are taken as bf16 values.
  bool compress = false;
  uint32_t compress_threads = 1;
  // Eviction: ARC with long ghost windows (cache/arc_policy.h), LRU, or S3-FIFO
  // (Yang et al., SOSP 2023); docs/cache_policy.md measures each against the
  // offline optimum.
  std::string policy = "arc";  // a name of eviction_policies() (the first is the default)
};

// The cache's work in flight by what it waits for, as named in stat and in
// Prometheus: the request pipeline's working states (RequestState, request_pipeline.h)
// and, as disk_write, placement's write-backs.
inline constexpr size_t kRequestStates = 7;
inline constexpr const char* kRequestStateNames[kRequestStates] = {
    "cache_requests_wait_room",  "cache_requests_dma",    "cache_requests_disk_read",
    "cache_requests_disk_write", "cache_requests_encode", "cache_requests_shrink",
    "cache_requests_decode"};
inline constexpr const char* kRequestStateMetrics[kRequestStates] = {
    "dpukv_cache_requests_wait_room", "dpukv_cache_requests_dma",
    "dpukv_cache_requests_disk_read", "dpukv_cache_requests_disk_write",
    "dpukv_cache_requests_encode",    "dpukv_cache_requests_shrink",
    "dpukv_cache_requests_decode"};

// One tenant's share of the tiers (keys folded with its tag, protocol/tenant_key.h):
// what its present chunks take, its quotas (0: none) and what the quotas evicted.
// memory_filling: slots its stores in flight hold, counted against its memory
// quota too, or one large batch would overshoot it and push the tier's global
// eviction onto other tenants.
struct TenantUsage {
  uint64_t memory_bytes = 0, disk_bytes = 0, chunks = 0;
  uint64_t memory_filling = 0;
  uint64_t memory_quota = 0, disk_quota = 0;
  uint64_t quota_evictions = 0;  // its own chunks that left a tier for its quota
};

struct CacheStats {
  uint64_t chunks = 0, memory_chunks = 0, disk_chunks = 0;
  uint64_t memory_used = 0, memory_capacity = 0, disk_used = 0, disk_capacity = 0;
  uint64_t stores = 0, store_bytes = 0, retrieves = 0, retrieve_bytes = 0;
  uint64_t hits = 0, misses = 0, evictions = 0, spills = 0, reloads = 0;
  uint64_t checksum_failures = 0, io_errors = 0, recovered = 0, store_rejects = 0;
  uint64_t disk_evictions = 0;      // chunks dropped from the disk tier to make room
  uint64_t disk_log_errors = 0;     // index log records that could not be written
  uint64_t both_chunks = 0;         // chunks with a copy in each tier (counted once in chunks)
  uint64_t disk_ios_in_flight = 0;  // disk tier reads and writes under way now
  uint64_t writes_waiting = 0;      // write-through chunks waiting for a write-back slot
  uint64_t requests_in_state[kRequestStates] = {};       // requests in each working state now
  uint64_t encoded_bytes_in = 0, encoded_bytes_out = 0;  // compression on store
  uint64_t ingests = 0, ingest_bytes = 0;                // chunks filled by another agent (ingest)
  uint64_t ingest_rejects = 0;                           // ingests refused (no room) or failed
  uint64_t located = 0;                                  // chunks shown in place to another agent
  uint64_t landed_mismatches = 0;  // device reads whose landed bytes differed; chunk intact
  uint64_t engine_waits = 0;       // copies that waited for a slot in a full DMA or codec ring
};

// Where a memory-resident chunk lies in the arena, and what a copy of it must be
// to be the same chunk: what another agent needs to read it one-sided and check it.
struct ChunkPlacement {
  uint64_t offset = 0;    // in the arena
  uint64_t stored = 0;    // bytes in the arena (encoded size, or size)
  uint64_t size = 0;      // bytes as the client gave them
  uint64_t checksum = 0;  // xxh3-64 of the stored bytes
  bool encoded = false;   // stored with the lossless KV codec
};

}  // namespace dpukv
