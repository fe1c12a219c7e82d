// What the CUDA engine passes its checksum kernel (verify_kernel.cu), by value as
// the launch's one parameter, so a batch needs no device memory of its own: one
// block per chunk, at most kMaxHashJobs chunks a launch (1,544 bytes of the
// 4 KiB a launch's parameters may take).
#pragma once

#include "engines/gpu/xxh3_lanes.h"

namespace dpukv_xxh3 {

constexpr unsigned kMaxHashJobs = 64;

struct HashJob {
  dpukv_u64 p;    // device address of the bytes (8-byte aligned)
  dpukv_u64 len;  // > 240
  dpukv_u64 out;  // device address of the digest (host memory mapped for the GPU)
};

struct HashJobs {
  dpukv_u32 n;  // jobs used; the launch's grid is n blocks
  dpukv_u32 reserved;
  HashJob job[kMaxHashJobs];
};

static_assert(sizeof(HashJobs) == 8 + 24 * kMaxHashJobs, "the kernel's parameter layout");

}  // namespace dpukv_xxh3
