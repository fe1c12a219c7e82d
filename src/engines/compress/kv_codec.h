// KV-aware codecs for chunks of bf16/fp16 KV tensors, with a self-describing
// header so that any reader can decode and verify a chunk without outside
// knowledge.
//
// Lossless (kLossless, kLosslessDelta): the 16-bit values are split into byte
// planes. The high plane (sign, exponent, top mantissa bit) holds most of the
// redundancy; with kLosslessDelta each high byte is XORed with the same channel's
// byte one token earlier first (values are correlated along tokens). The high plane
// is Huffman-coded (huffman.h); the near-random low plane is stored as is.
//
// Lossy (kInt8, kInt4): group-wise asymmetric quantization along tokens per channel
// (as KIVI does for keys): for each channel, each group of group_size tokens gets a
// scale and zero point (fp16) and codes q = round((x - zero) / scale). With
// kKvValuesPerToken the slabs alternate keys and values (K, V, K, V, ...: vLLM's CPU
// blocks) and value slabs are quantized per token instead, a scale and zero point
// for each token over its channels, as KIVI does for values: a value's error then
// stays within its token, where the attention weight multiplies it, instead of
// spreading a channel's outlier over its group (on SmolLM2, int4's next-token
// agreement went from 91.4 % to 94.4 % at the same bytes). The SIMD paths
// (AVX-512, AVX2) give bit-identical codes to the scalar path.
//
// Layout: KvChunkHeader (64 bytes) then the payload.
//   lossless: low plane [n bytes], Huffman(high plane) [section_len bytes], odd byte
//   lossy:    params [section_len bytes: per slab, per group, per channel (a value
//             slab with kKvValuesPerToken: per token): fp16 scale, fp16 zero],
//             codes (int8: one byte per value; int4: two channels per byte, low
//             nibble first)
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engines/compress/kv_layout.h"
#include "runtime/status.h"

namespace dpukv {

enum class KvCodec : uint8_t { kRaw = 0, kLossless = 1, kLosslessDelta = 2, kInt8 = 3, kInt4 = 4 };
const char* kv_codec_name(KvCodec c);
bool kv_codec_lossy(KvCodec c);

struct KvChunkHeader {
  static constexpr uint32_t kMagic = 0x564b4b44;  // "DKKV"
  static constexpr uint8_t kVersion = 1;
  uint32_t magic;
  uint8_t version;
  uint8_t codec;  // KvCodec
  uint8_t dtype;  // KvDtype
  uint8_t flags;  // lossy: kKvValuesPerToken or 0; others 0
  uint32_t slabs, tokens, channels;
  uint32_t group_size;    // lossy only
  uint64_t original_len;  // bytes of the decoded chunk
  uint64_t payload_len;   // bytes after the header
  uint64_t section_len;   // lossless: coded high plane; lossy: params
  uint64_t checksum;      // xxh3-64 of the original (lossless) or of the payload (lossy)
  uint32_t reserved;      // 0
  uint32_t header_crc;    // crc32c of the 60 bytes before it
};
static_assert(sizeof(KvChunkHeader) == 64);

// Header flag: the slabs alternate keys and values; value slabs are quantized per
// token. Lossy codecs only, with an even number of slabs.
inline constexpr uint8_t kKvValuesPerToken = 1;

struct KvCodecParams {
  KvCodec codec = KvCodec::kLosslessDelta;
  KvDtype dtype = KvDtype::kBf16;
  // The chunk's geometry. For lossless codecs without delta it may be left at
  // {1, 1, 0}: the chunk is then one row of len/2 values.
  KvShape shape{1, 1, 0};
  uint32_t group_size = 0;  // lossy: tokens per group; 0 = 128 for int8, 64 for int4
  uint8_t flags = 0;        // lossy: kKvValuesPerToken
};

// Error of a lossy encode, measured against the input in the same pass.
struct KvCodecError {
  double rel_rmse = 0;  // sqrt(sum (x - x')^2 / sum x^2)
  double max_abs_err = 0;
};

// Scratch memory for encode/decode, sized once (no allocation per chunk).
class KvScratch {
 public:
  explicit KvScratch(size_t max_chunk_bytes = 0) { reserve(max_chunk_bytes); }
  void reserve(size_t max_chunk_bytes) {
    plane_.resize(max_chunk_bytes / 2 + 64);
    // Also holds per-channel statistics: at least 64 KiB.
    row_.resize(std::max<size_t>(max_chunk_bytes / 2, 1 << 16) + 64);
  }
  size_t capacity() const { return plane_.size() >= 64 ? (plane_.size() - 64) * 2 : 0; }

 private:
  friend struct KvCodecImpl;
  std::vector<uint8_t> plane_;
  std::vector<uint8_t> row_;
  std::vector<uint8_t> whole_;  // kv_decode_rows' decoded chunk, grown on first use
};

// Largest encoded size for an input of len bytes.
size_t kv_encode_bound(const KvCodecParams& p, size_t len);

// Encodes len bytes of src. INVALID_VALUE if the shape does not describe len bytes
// (or a lossy codec gets an odd channel count for int4, or non-finite values, or
// kKvValuesPerToken with an odd slab count; or flags on a lossless codec);
// TOO_BIG if cap or the scratch is too small. err may be null.
Status kv_encode(const KvCodecParams& p, const uint8_t* src, size_t len, uint8_t* dst, size_t cap,
                 KvScratch* scratch, size_t* out_len, KvCodecError* err);

// Checks a header: magic, version, codec, dtype, crc, and that the geometry and
// lengths agree. CORRUPTED on any mismatch.
Status kv_read_header(const uint8_t* src, size_t len, KvChunkHeader* out);

// Decodes a chunk; verifies the checksum (lossless: of the output; lossy: of the
// payload). CORRUPTED on any inconsistency; TOO_BIG if cap is below original_len.
Status kv_decode(const uint8_t* src, size_t len, uint8_t* dst, size_t cap, KvScratch* scratch,
                 size_t* out_len);

// The length of the encoded chunk at the start of src, in a buffer of cap bytes
// (a retrieve fills a slot at least as large as the chunk): its header is checked
// (CORRUPTED if it is not a header or says more than cap bytes).
Status kv_encoded_length(const uint8_t* src, size_t cap, size_t* len);

// Decodes a chunk into rows: row i gets bytes [i * row_bytes, (i + 1) * row_bytes)
// of the decoded chunk, which must be nrows * row_bytes long (else CORRUPTED: a
// chunk of other rows). The rows are written only once the chunk is verified: a
// lossy chunk's payload before it is dequantized straight into them, any other
// decoded into the scratch and verified there first.
Status kv_decode_rows(const uint8_t* src, size_t len, uint8_t* const* rows, size_t nrows,
                      size_t row_bytes, KvScratch* scratch, size_t* out_len);

// Which SIMD path the lossy kernels use: "avx512", "avx2" or "scalar". Tests can
// force one to compare them.
enum class SimdLevel { kScalar, kAvx2, kAvx512 };
SimdLevel kv_simd_level();
void kv_force_simd_level(SimdLevel l);  // for tests and benchmarks
const char* simd_level_name(SimdLevel l);

}  // namespace dpukv
