// XXH3-64 (seed 0, default secret) for inputs longer than 240 bytes, cut into the
// pieces a GPU computes in parallel. The digest is the one XXH3_64bits gives (the
// chunk checksum, runtime/chunk_checksum.h): a chunk's bytes verified on the GPU
// are compared with the checksum the cache already keeps, no second hash to store.
//
// Why it parallelises: XXH3's eight 64-bit accumulators are independent until the
// final merge, and within a 1 KiB block each accumulator only adds terms of the
// block's stripes. So the per-block, per-lane sums (block_lane_sum) are computed
// by every thread at once; only the scramble after each block (one multiply a
// lane) runs in order, on eight threads. The host test (xxh3_lanes_test.cc)
// composes these pieces as the kernel does and checks the digest against
// libxxhash for every length class; verify_kernel.cu is the GPU's composition.
//
// Reference: xxhash.h 0.8.x, XXH3_hashLong_64b_internal and the scalar
// XXH3_accumulate_512 / XXH3_scrambleAcc / XXH3_mergeAccs (the algorithm, not the
// code: written here for lanes).
#pragma once

#if defined(__CUDACC_RTC__)
typedef unsigned long long dpukv_u64;  // NOLINT: NVRTC has no <cstdint>
typedef unsigned int dpukv_u32;
typedef unsigned char dpukv_u8;
#define DPUKV_HD __host__ __device__
#define DPUKV_CONST __constant__
#else
#include <cstdint>
using dpukv_u64 = uint64_t;
using dpukv_u32 = uint32_t;
using dpukv_u8 = uint8_t;
#define DPUKV_HD
#define DPUKV_CONST
#endif

namespace dpukv_xxh3 {

constexpr dpukv_u64 kPrime32_1 = 0x9E3779B1ULL, kPrime32_2 = 0x85EBCA77ULL,
                    kPrime32_3 = 0xC2B2AE3DULL;
constexpr dpukv_u64 kPrime64_1 = 0x9E3779B185EBCA87ULL, kPrime64_2 = 0xC2B2AE3D27D4EB4FULL,
                    kPrime64_3 = 0x165667B19E3779F9ULL, kPrime64_4 = 0x85EBCA77C2B2AE63ULL,
                    kPrime64_5 = 0x27D4EB2F165667C5ULL;
constexpr dpukv_u64 kMinLength = 241;  // shorter inputs take XXH3's other paths: not here
constexpr dpukv_u64 kStripe = 64, kBlock = 1024, kStripesPerBlock = 16;

// XXH3's default secret (192 bytes) as little-endian words at 8-byte steps: the
// stripes and the scramble read it there.
DPUKV_CONST static const dpukv_u64 kSecretWords[24] = {
    0xbe4ba423396cfeb8ULL, 0x1cad21f72c81017cULL, 0xdb979083e96dd4deULL, 0x1f67b3b7a4a44072ULL,
    0x78e5c0cc4ee679cbULL, 0x2172ffcc7dd05a82ULL, 0x8e2443f7744608b8ULL, 0x4c263a81e69035e0ULL,
    0xcb00c391bb52283cULL, 0xa32e531b8b65d088ULL, 0x4ef90da297486471ULL, 0xd8acdea946ef1938ULL,
    0x3f349ce33f76faa8ULL, 0x1d4f0bc7c7bbdcf9ULL, 0x3159b4cd4be0518aULL, 0x647378d9c97e9fc8ULL,
    0xc3ebd33483acc5eaULL, 0xeb6313faffa081c5ULL, 0x49daf0b751dd0d17ULL, 0x9e68d429265516d3ULL,
    0xfca1477d58be162bULL, 0xce31d07ad1b8f88fULL, 0x280416958f3acb45ULL, 0x7e404bbbcafbd7afULL,
};
// The words at the unaligned offsets the last stripe (121 + 8 lane) and the merge
// (11 + 8 i) read.
DPUKV_CONST static const dpukv_u64 kLastStripeWords[8] = {
    0xea647378d9c97e9fULL, 0xc5c3ebd33483acc5ULL, 0x17eb6313faffa081ULL, 0xd349daf0b751dd0dULL,
    0x2b9e68d429265516ULL, 0x8ffca1477d58be16ULL, 0x45ce31d07ad1b8f8ULL, 0xaf280416958f3acbULL,
};
DPUKV_CONST static const dpukv_u64 kMergeWords[8] = {
    0x6dd4de1cad21f72cULL, 0xa44072db979083e9ULL, 0xe679cb1f67b3b7a4ULL, 0xd05a8278e5c0cc4eULL,
    0x4608b82172ffcc7dULL, 0x9035e08e2443f774ULL, 0x52283c4c263a81e6ULL, 0x65d088cb00c391bbULL,
};
DPUKV_CONST static const dpukv_u64 kInitAcc[8] = {kPrime32_3, kPrime64_1, kPrime64_2, kPrime64_3,
                                                  kPrime64_4, kPrime32_2, kPrime64_5, kPrime32_1};

// The stripes of whole blocks lie at multiples of 64 bytes from the input's start,
// so their words are 8-byte aligned whenever the input is (the engine hashes other
// inputs on the host). A test may define DPUKV_XXH3_ALIGNED_LOAD(p) to watch them.
DPUKV_HD inline dpukv_u64 load64(const dpukv_u8* p) {
#if defined(__CUDACC_RTC__)
  return *reinterpret_cast<const dpukv_u64*>(p);
#else
#if defined(DPUKV_XXH3_ALIGNED_LOAD)
  DPUKV_XXH3_ALIGNED_LOAD(p);
#endif
  dpukv_u64 v;
  __builtin_memcpy(&v, p, 8);
  return v;
#endif
}

// The last stripe starts at len - 64, aligned only when the length is a multiple
// of 8. A GPU faults on a misaligned 8-byte load (CUDA_ERROR_MISALIGNED_ADDRESS,
// sticky: the context is lost, every later copy fails), so it is read by bytes.
DPUKV_HD inline dpukv_u64 load64_any(const dpukv_u8* p) {
#if defined(__CUDACC_RTC__)
  dpukv_u64 v = 0;
  for (unsigned i = 0; i < 8; ++i) v |= static_cast<dpukv_u64>(p[i]) << (8 * i);
  return v;
#else
  dpukv_u64 v;
  __builtin_memcpy(&v, p, 8);
  return v;
#endif
}

// One stripe's term for `lane`, with the secret word `key` (data of the lane, key
// for the multiply; the neighbour lane's data added raw).
DPUKV_HD inline dpukv_u64 stripe_term(dpukv_u64 mine, dpukv_u64 neighbour, dpukv_u64 key) {
  const dpukv_u64 k = mine ^ key;
  return (k & 0xFFFFFFFFULL) * (k >> 32) + neighbour;
}

// What `stripes` stripes from p add to accumulator `lane` (stripe s reads the
// secret at 8 s): a whole block's 16, or the last block's remainder.
DPUKV_HD inline dpukv_u64 block_lane_sum(const dpukv_u8* p, unsigned lane, unsigned stripes) {
  dpukv_u64 sum = 0;
  for (unsigned s = 0; s < stripes; ++s)
    sum += stripe_term(load64(p + s * kStripe + 8 * lane), load64(p + s * kStripe + 8 * (lane ^ 1)),
                       kSecretWords[s + lane]);
  return sum;
}

// After each whole block, in block order.
DPUKV_HD inline dpukv_u64 scramble(dpukv_u64 acc, unsigned lane) {
  acc ^= acc >> 47;
  acc ^= kSecretWords[16 + lane];
  return acc * kPrime32_1;
}

// The whole blocks: (len - 1) / 1024 (the last byte always falls in the tail).
DPUKV_HD inline dpukv_u64 whole_blocks(dpukv_u64 len) {
  return (len - 1) / kBlock;
}

// What the tail adds to accumulator `lane` after the whole blocks: the last
// block's whole stripes, then the input's last 64 bytes with the offset secret.
DPUKV_HD inline dpukv_u64 tail_lane_sum(const dpukv_u8* p, dpukv_u64 len, unsigned lane) {
  const dpukv_u64 blocks = whole_blocks(len);
  const unsigned stripes = static_cast<unsigned>(((len - 1) - kBlock * blocks) / kStripe);
  const dpukv_u8* const last = p + len - kStripe;
  return block_lane_sum(p + blocks * kBlock, lane, stripes) +
         stripe_term(load64_any(last + 8 * lane), load64_any(last + 8 * (lane ^ 1)),
                     kLastStripeWords[lane]);
}

DPUKV_HD inline dpukv_u64 mul128_fold64(dpukv_u64 a, dpukv_u64 b) {
#if defined(__CUDACC_RTC__)
  return (a * b) ^ __umul64hi(a, b);
#else
  const unsigned __int128 m = static_cast<unsigned __int128>(a) * b;
  return static_cast<dpukv_u64>(m) ^ static_cast<dpukv_u64>(m >> 64);
#endif
}

// The digest from the eight finished accumulators.
DPUKV_HD inline dpukv_u64 merge(const dpukv_u64 acc[8], dpukv_u64 len) {
  dpukv_u64 h = len * kPrime64_1;
  for (unsigned i = 0; i < 4; ++i)
    h += mul128_fold64(acc[2 * i] ^ kMergeWords[2 * i], acc[2 * i + 1] ^ kMergeWords[2 * i + 1]);
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  return h ^ (h >> 32);
}

}  // namespace dpukv_xxh3
