// A block device backed by the KV cache engine: the "local reuse" scenario, where
// a host reaches the offload side's cache through a standard NVMe namespace.
//
// The namespace is cut into fixed-size chunks; chunk i is a cache entry keyed
// by (namespace, i). Reads retrieve chunks (verified by the engine's checksums);
// writes store new versions (read-modify-write for partial chunks); Write Zeroes
// and Deallocate remove chunks. It is a cache, not a disk: a chunk the engine
// evicted (memory full, no disk tier, or disk full) reads back as zeroes, the
// value of deallocated blocks. Requests are served one at a time, in order.
#pragma once

#include <memory>
#include <string>

#include "nvmf/bdev/bdev.h"

namespace dpukv::nvme {

struct KvBdevOptions {
  uint64_t num_blocks = 0;
  uint32_t block_size = 4096;
  uint32_t chunk_bytes = 64 * 1024;  // a multiple of block_size, power of two
  uint64_t memory_bytes = 64ull << 20;
  std::string disk_dir;  // optional disk tier
  uint64_t disk_bytes = 0;
};

Status create_kv_bdev(const std::string& name, const KvBdevOptions& o, std::unique_ptr<Bdev>* out);

}  // namespace dpukv::nvme
