// Order-0 Huffman coder for byte streams, built for the high-byte plane of KV
// tensors: canonical codes limited to 11 bits, four interleaved bit streams per
// block so that the decoder's table lookups overlap, and branch-light bit I/O.
//
// Block format (blocks of up to kMaxBlockSymbols input bytes, back to back):
//   u8 mode: 0 = raw (u32 n, then n bytes), 1 = single symbol (u32 n, u8 symbol),
//            2 = Huffman (u32 n, 128 bytes of 4-bit code lengths, u32 sizes of
//            streams 0..2, then the four streams; stream k codes the k-th quarter)
// The decoder checks every length, size and code against its buffers: corrupt
// input gives CORRUPTED, never a read or write out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/status.h"

namespace dpukv::huffman {

// Blocks the encoder writes: each block pays for building the decoder's tables
// (2,048 entries, two of them), which at 64 KiB blocks cost about a tenth of
// decoding (kv_bf16 on AVX2: 2.6-2.8 GB/s at 64 KiB, 3.0-3.2 at 256 KiB, the same
// ratio). The decoder takes blocks up to kMaxBlockSymbols, so chunks written with
// 64 KiB blocks (on a disk tier) still decode; a decoder older than 256 KiB
// blocks refuses these as CORRUPTED, never misreads them.
inline constexpr size_t kBlockSymbols = 256 * 1024;
inline constexpr size_t kMaxBlockSymbols = 1024 * 1024;
inline constexpr int kMaxCodeLen = 11;

// The coder's loops run as built for x86-64-v3 where the CPU has it, else portable.
// use_portable(true) forces the portable build (tests, `bench compress --simd
// scalar`), false goes back to the CPU's best; returns whether portable is in use.
// Not for use while another thread codes.
bool use_portable(bool portable);
const char* path_name();  // "x86-64-v3" or "portable"

// Worst-case output size for n input bytes.
size_t bound(size_t n);

// Encodes n bytes. TOO_BIG if cap is below what the data needs (bound(n) always fits).
Status compress(const uint8_t* src, size_t n, uint8_t* dst, size_t cap, size_t* out_len);

// Decodes exactly n bytes from src_len bytes; *consumed gets the bytes of src used.
Status decompress(const uint8_t* src, size_t src_len, uint8_t* dst, size_t n, size_t* consumed);

}  // namespace dpukv::huffman
