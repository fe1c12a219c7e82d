// The GPU's checksum kernel: XXH3-64 of a chunk's bytes in GPU memory, so that a
// chunk copied to the GPU is verified where it landed (and a chunk saved from it
// is hashed where it lies) without host threads reading the bytes a second time.
// One thread block per chunk of a batch (verify_kernel_abi.h): every thread sums
// block lanes (xxh3_lanes.h) for a tile of blocks, eight threads fold the tile's
// sums in order, and thread 0 merges. Compiled to PTX by scripts/gen_verify_ptx.py (NVRTC, from PyPI's
// nvidia-cuda-nvrtc wheel) into verify_kernel_ptx.inc, which the CUDA engine
// loads with cuModuleLoadData: the driver JITs it for whatever GPU it runs on.
//
// Input: 8-byte-aligned, longer than 240 bytes (the engine hashes others on the
// host). Each digest goes to its job's `out`, host memory mapped for the device.
#include "engines/gpu/verify_kernel_abi.h"

namespace {
constexpr unsigned kThreads = 256;
constexpr unsigned kTileBlocks = 128;  // 128 KiB of input a tile; 8 KiB of sums
}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads)
    dpukv_xxh3_64_batch(const dpukv_xxh3::HashJobs jobs) {
  using namespace dpukv_xxh3;
  if (blockIdx.x >= jobs.n) return;
  const dpukv_u8* const p = reinterpret_cast<const dpukv_u8*>(jobs.job[blockIdx.x].p);
  const dpukv_u64 len = jobs.job[blockIdx.x].len;
  __shared__ dpukv_u64 sums[kTileBlocks][8];
  __shared__ dpukv_u64 acc[8];
  const unsigned tid = threadIdx.x;
  if (tid < 8) acc[tid] = kInitAcc[tid];
  const dpukv_u64 blocks = whole_blocks(len);
  for (dpukv_u64 first = 0; first < blocks; first += kTileBlocks) {
    const unsigned n =
        static_cast<unsigned>(blocks - first < kTileBlocks ? blocks - first : kTileBlocks);
    for (unsigned item = tid; item < n * 8; item += kThreads)
      sums[item / 8][item % 8] =
          block_lane_sum(p + (first + item / 8) * kBlock, item % 8, kStripesPerBlock);
    __syncthreads();
    if (tid < 8) {
      dpukv_u64 a = acc[tid];
      for (unsigned b = 0; b < n; ++b) a = scramble(a + sums[b][tid], tid);
      acc[tid] = a;
    }
    __syncthreads();
  }
  if (tid < 8) acc[tid] += tail_lane_sum(p, len, tid);
  __syncthreads();
  if (tid == 0) *reinterpret_cast<dpukv_u64*>(jobs.job[blockIdx.x].out) = merge(acc, len);
}
