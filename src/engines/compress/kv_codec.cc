#include "engines/compress/kv_codec.h"

#include <cpuid.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engines/compress/checksum.h"
#include "engines/compress/huffman.h"
#include "engines/compress/kv_byte_planes.h"
#include "engines/compress/kv_quant_kernels.h"
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include "runtime/chunk_checksum.h"

namespace dpukv {

using kv_quant::ErrAcc;
using kv_quant::Params;
using kv_quant::QuantJob;

const char* kv_codec_name(KvCodec c) {
  switch (c) {
    case KvCodec::kRaw:
      return "raw";
    case KvCodec::kLossless:
      return "kv-lossless";
    case KvCodec::kLosslessDelta:
      return "kv-lossless-delta";
    case KvCodec::kInt8:
      return "kv-int8";
    case KvCodec::kInt4:
      return "kv-int4";
  }
  return "?";
}

bool kv_codec_lossy(KvCodec c) {
  return c == KvCodec::kInt8 || c == KvCodec::kInt4;
}

const char* simd_level_name(SimdLevel l) {
  return l == SimdLevel::kAvx512 ? "avx512" : l == SimdLevel::kAvx2 ? "avx2" : "scalar";
}

namespace {

bool cpu_has_f16c() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

SimdLevel detect_simd() {
  // The AVX-512 kernels also use F16C forms (fp16 chunks).
  const bool f16c = cpu_has_f16c();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && f16c)
    return SimdLevel::kAvx512;
  if (__builtin_cpu_supports("avx2") && f16c) return SimdLevel::kAvx2;
  return SimdLevel::kScalar;
}
SimdLevel g_simd = detect_simd();

}  // namespace

// Glue with access to KvScratch.
struct KvCodecImpl {
  static uint8_t* plane(KvScratch* s) { return s->plane_.data(); }
  static uint8_t* row(KvScratch* s) { return s->row_.data(); }
  static std::vector<uint8_t>& whole(KvScratch* s) { return s->whole_; }
  // The lossy paths keep min, max (floats) and Params per channel in the row scratch.
  static bool row_fits(KvScratch* s, uint32_t channels) {
    return s->row_.size() >= static_cast<size_t>(channels) * (8 + sizeof(Params)) + 64;
  }
};

SimdLevel kv_simd_level() {
  return g_simd;
}
void kv_force_simd_level(SimdLevel l) {
  SimdLevel best = detect_simd();
  g_simd = static_cast<int>(l) <= static_cast<int>(best) ? l : best;
  (void)huffman::use_portable(g_simd == SimdLevel::kScalar);  // the lossless codecs' coder
}

namespace {

uint32_t default_group(KvCodec c) {
  return c == KvCodec::kInt8 ? 128 : 64;
}

// Where a lossy chunk's parameters lie. A slab quantized per channel has a scale
// and zero per group of G tokens and channel; a value slab under kKvValuesPerToken
// (an odd slab) one per token. Slabs come in (key, value) pairs then.
struct LossyLayout {
  uint32_t T, C, G, groups;
  bool per_token_values;
  LossyLayout(uint32_t tokens, uint32_t channels, uint32_t group, uint8_t flags)
      : T(tokens),
        C(channels),
        G(group),
        groups(group ? (tokens + group - 1) / group : 0),
        per_token_values((flags & kKvValuesPerToken) != 0) {}
  uint64_t channel_params() const { return static_cast<uint64_t>(groups) * C * 4; }
  uint64_t token_params() const { return static_cast<uint64_t>(T) * 4; }
  bool per_token(uint64_t s) const { return per_token_values && (s & 1); }
  uint64_t params_at(uint64_t s) const {
    if (!per_token_values) return s * channel_params();
    return s / 2 * (channel_params() + token_params()) + (s & 1 ? channel_params() : 0);
  }
  uint64_t params_len(uint64_t slabs) const { return params_at(slabs); }
};

void seal_header(KvChunkHeader* h) {
  h->header_crc = crc32c(h, offsetof(KvChunkHeader, header_crc));
}

// The lossless codecs split (encode) or merge (decode) rows in pieces of this many
// values and hash each piece while it is still in the cache, so the chunk's
// checksum costs no second pass over memory. Splitting and merging go value by
// value, so a row (or its predecessor) may be cut anywhere.
constexpr size_t kHashPiece = 16 * 1024;

// Every row of the chunk, in order, cut into pieces: fn(off, prev_row, m) for
// values [off, off + m), where prev_row is the previous row's value at off (null
// for a slab's first row or without delta).
template <typename Fn>
void for_each_piece(const KvShape& shape, bool delta, Fn&& fn) {
  const size_t C = shape.channels;
  for (uint64_t s = 0; s < shape.slabs; ++s)
    for (uint64_t t = 0; t < shape.tokens; ++t) {
      const size_t row = (s * shape.tokens + t) * C;
      for (size_t j = 0; j < C; j += kHashPiece)
        fn(row + j, delta && t > 0, std::min(kHashPiece, C - j));
    }
}

bool shape_matches(const KvShape& s, size_t len) {
  return s.tokens != 0 && s.channels != 0 && s.slabs != 0 && s.elements() * 2 == len;
}

Status encode_lossless(const KvCodecParams& p, const uint8_t* src, size_t len, uint8_t* dst,
                       size_t cap, KvScratch* scratch, size_t* out_len) {
  const bool delta = p.codec == KvCodec::kLosslessDelta;
  KvShape shape = p.shape;
  if (delta || shape.channels != 0) {
    if (!shape_matches(shape, len)) return Code::kInvalidValue;
  } else {
    shape = {1, 1, static_cast<uint32_t>(len / 2)};
    if (len / 2 > UINT32_MAX) return Code::kTooBig;
  }
  const size_t n = len / 2;
  if (scratch->capacity() < len) return Code::kTooBig;
  if (cap < sizeof(KvChunkHeader) + huffman::bound(n) + n + 1) return Code::kTooBig;
  // Payload: the low plane first, written in place by the split, then the coded
  // high plane, then the odd trailing byte if any.
  uint8_t* hi = KvCodecImpl::plane(scratch);
  uint8_t* lo = dst + sizeof(KvChunkHeader);
  const kv_planes::SplitFn split =
      g_simd != SimdLevel::kScalar ? kv_planes::split_avx2 : kv_planes::split_scalar;
  const uint16_t* v = reinterpret_cast<const uint16_t*>(src);
  const size_t C = shape.channels;
  XXH3_state_t hs;
  (void)XXH3_64bits_reset(&hs);
  for_each_piece(shape, delta, [&](size_t off, bool has_prev, size_t m) {
    split(v + off, has_prev ? v + off - C : nullptr, m, hi + off, lo + off);
    chunk_checksum_update(&hs, v + off, m * 2);
  });
  if (len & 1) chunk_checksum_update(&hs, src + len - 1, 1);
  size_t hlen = 0;
  uint8_t* coded = lo + n;
  DPUKV_RETURN_IF_ERROR(huffman::compress(hi, n, coded, cap - sizeof(KvChunkHeader) - n, &hlen));
  size_t payload = n + hlen;
  if (len & 1) lo[payload++] = src[len - 1];
  KvChunkHeader h{};
  h.magic = KvChunkHeader::kMagic;
  h.version = KvChunkHeader::kVersion;
  h.codec = static_cast<uint8_t>(p.codec);
  h.dtype = static_cast<uint8_t>(p.dtype);
  h.slabs = shape.slabs, h.tokens = shape.tokens, h.channels = shape.channels;
  h.original_len = len;
  h.payload_len = payload;
  h.section_len = hlen;
  h.checksum = XXH3_64bits_digest(&hs);
  seal_header(&h);
  std::memcpy(dst, &h, sizeof(h));
  *out_len = sizeof(h) + payload;
  return Code::kSuccess;
}

Status encode_lossy(const KvCodecParams& p, const uint8_t* src, size_t len, uint8_t* dst,
                    size_t cap, KvScratch* scratch, size_t* out_len, KvCodecError* err) {
  const KvShape& sh = p.shape;
  if (!shape_matches(sh, len)) return Code::kInvalidValue;
  const bool int4 = p.codec == KvCodec::kInt4;
  if (int4 && (sh.channels & 1)) return Code::kInvalidValue;
  if ((p.flags & ~kKvValuesPerToken) != 0 || ((p.flags & kKvValuesPerToken) && (sh.slabs & 1)))
    return Code::kInvalidValue;
  const uint32_t C = sh.channels, T = sh.tokens;
  const LossyLayout lay(T, C, p.group_size ? p.group_size : default_group(p.codec), p.flags);
  const uint32_t G = lay.G, groups = lay.groups;
  const size_t params_len = lay.params_len(sh.slabs);
  const size_t n = sh.elements();
  const size_t codes_len = int4 ? n / 2 : n;
  if (cap < sizeof(KvChunkHeader) + params_len + codes_len) return Code::kTooBig;
  if (scratch->capacity() < len || !KvCodecImpl::row_fits(scratch, C)) return Code::kTooBig;
  uint8_t* out_params = dst + sizeof(KvChunkHeader);
  uint8_t* out_codes = out_params + params_len;
  // int8 codes go straight to the output; int4 codes are staged, then packed.
  uint8_t* codes_base = int4 ? KvCodecImpl::plane(scratch) : out_codes;
  // Per-channel staging: min, max, params.
  auto* mn = reinterpret_cast<float*>(KvCodecImpl::row(scratch));
  float* mx = mn + C;
  Params* prm = reinterpret_cast<Params*>(mx + C);
  const SimdLevel lvl = g_simd;
  const float qmax = int4 ? 15.0f : 255.0f;
  ErrAcc acc;
  const auto* v = reinterpret_cast<const uint16_t*>(src);
  for (uint32_t s = 0; s < sh.slabs; ++s) {
    const uint16_t* slab = v + static_cast<size_t>(s) * T * C;
    uint8_t* codes = codes_base + (int4 ? 0 : static_cast<size_t>(s) * T * C);
    uint8_t* slab_params = out_params + lay.params_at(s);
    if (lay.per_token(s)) {
      const QuantJob j{slab, C, 0, T, p.dtype, qmax, codes, prm};
      if (!kv_quant::quantize_tokens(j, T, lvl, prm, slab_params, &acc)) return Code::kInvalidValue;
    } else {
      for (uint32_t g = 0; g < groups; ++g) {
        const QuantJob j{slab, C, g * G, std::min(T, (g + 1) * G), p.dtype, qmax, codes, prm};
        if (!kv_quant::quantize_group(j, lvl, mn, mx, prm,
                                      slab_params + static_cast<size_t>(g) * C * 4, &acc))
          return Code::kInvalidValue;  // NaN or infinity, or a range fp16 cannot hold
      }
    }
    if (int4) {
      uint8_t* o = out_codes + static_cast<size_t>(s) * T * C / 2;
      for (size_t i = 0; i < static_cast<size_t>(T) * C; i += 2)
        o[i / 2] = static_cast<uint8_t>(codes[i] | (codes[i + 1] << 4));
    }
  }
  KvChunkHeader h{};
  h.magic = KvChunkHeader::kMagic;
  h.version = KvChunkHeader::kVersion;
  h.codec = static_cast<uint8_t>(p.codec);
  h.dtype = static_cast<uint8_t>(p.dtype);
  h.flags = p.flags;
  h.slabs = sh.slabs, h.tokens = T, h.channels = C;
  h.group_size = G;
  h.original_len = len;
  h.payload_len = params_len + codes_len;
  h.section_len = params_len;
  h.checksum = xxh3_64(out_params, params_len + codes_len);
  seal_header(&h);
  std::memcpy(dst, &h, sizeof(h));
  *out_len = sizeof(h) + params_len + codes_len;
  if (err) {
    err->rel_rmse = acc.sx > 0 ? std::sqrt(acc.se / acc.sx) : 0.0;
    err->max_abs_err = acc.maxe;
  }
  return Code::kSuccess;
}

}  // namespace

size_t kv_encode_bound(const KvCodecParams& p, size_t len) {
  if (kv_codec_lossy(p.codec)) {
    const LossyLayout lay(p.shape.tokens, p.shape.channels,
                          p.group_size ? p.group_size : default_group(p.codec), p.flags);
    // An odd slab count under kKvValuesPerToken is refused by the encode; bound it
    // as if the last slab were a pair's key.
    return sizeof(KvChunkHeader) + lay.params_len(p.shape.slabs + (p.shape.slabs & 1)) + len / 2 +
           1;
  }
  return sizeof(KvChunkHeader) + huffman::bound(len / 2) + len / 2 + 1 + 8;
}

Status kv_encode(const KvCodecParams& p, const uint8_t* src, size_t len, uint8_t* dst, size_t cap,
                 KvScratch* scratch, size_t* out_len, KvCodecError* err) {
  if ((src == nullptr && len) || dst == nullptr || scratch == nullptr || out_len == nullptr)
    return Code::kInvalidValue;
  if (p.dtype != KvDtype::kBf16 && p.dtype != KvDtype::kFp16) return Code::kInvalidValue;
  if (err) *err = {};
  if (p.flags != 0 && !kv_codec_lossy(p.codec)) return Code::kInvalidValue;
  switch (p.codec) {
    case KvCodec::kLossless:
    case KvCodec::kLosslessDelta:
      return encode_lossless(p, src, len, dst, cap, scratch, out_len);
    case KvCodec::kInt8:
    case KvCodec::kInt4:
      return encode_lossy(p, src, len, dst, cap, scratch, out_len, err);
    case KvCodec::kRaw: {
      if (cap < sizeof(KvChunkHeader) + len) return Code::kTooBig;
      KvChunkHeader h{};
      h.magic = KvChunkHeader::kMagic;
      h.version = KvChunkHeader::kVersion;
      h.codec = static_cast<uint8_t>(KvCodec::kRaw);
      h.dtype = static_cast<uint8_t>(p.dtype);
      h.slabs = h.tokens = 1;
      h.channels = static_cast<uint32_t>(len / 2);
      h.original_len = h.payload_len = len;
      h.checksum = xxh3_64(src, len);
      seal_header(&h);
      std::memcpy(dst, &h, sizeof(h));
      std::memcpy(dst + sizeof(h), src, len);
      *out_len = sizeof(h) + len;
      return Code::kSuccess;
    }
  }
  return Code::kInvalidValue;
}

Status kv_read_header(const uint8_t* src, size_t len, KvChunkHeader* out) {
  if (src == nullptr || len < sizeof(KvChunkHeader)) return Code::kCorrupted;
  KvChunkHeader h;
  std::memcpy(&h, src, sizeof(h));
  if (h.magic != KvChunkHeader::kMagic || h.version != KvChunkHeader::kVersion ||
      (h.flags & ~kKvValuesPerToken) != 0 || h.reserved != 0 ||
      h.header_crc != crc32c(&h, offsetof(KvChunkHeader, header_crc)))
    return Code::kCorrupted;
  if (h.dtype != static_cast<uint8_t>(KvDtype::kBf16) &&
      h.dtype != static_cast<uint8_t>(KvDtype::kFp16))
    return Code::kCorrupted;
  if (h.payload_len != len - sizeof(KvChunkHeader) || h.section_len > h.payload_len)
    return Code::kCorrupted;
  const auto codec = static_cast<KvCodec>(h.codec);
  const uint64_t n = static_cast<uint64_t>(h.slabs) * h.tokens * h.channels;
  switch (codec) {
    case KvCodec::kRaw:
      if (h.payload_len != h.original_len || h.flags != 0) return Code::kCorrupted;
      break;
    case KvCodec::kLossless:
    case KvCodec::kLosslessDelta:
      if (h.flags != 0 || n != h.original_len / 2 ||
          h.payload_len != h.section_len + n + (h.original_len & 1))
        return Code::kCorrupted;
      break;
    case KvCodec::kInt8:
    case KvCodec::kInt4: {
      if (h.group_size == 0 || h.tokens == 0 || h.channels == 0 || n * 2 != h.original_len ||
          (codec == KvCodec::kInt4 && (h.channels & 1)) ||
          ((h.flags & kKvValuesPerToken) && (h.slabs & 1)))
        return Code::kCorrupted;
      const uint64_t params =
          LossyLayout(h.tokens, h.channels, h.group_size, h.flags).params_len(h.slabs);
      const uint64_t codes = codec == KvCodec::kInt4 ? n / 2 : n;
      if (h.section_len != params || h.payload_len != params + codes) return Code::kCorrupted;
      break;
    }
    default:
      return Code::kCorrupted;
  }
  *out = h;
  return Code::kSuccess;
}

namespace {

// Dequantizes a lossy chunk whose header h was checked and whose payload body
// verified; slab s lands at out(s) (T * C values).
template <typename SlabOut>
Status dequantize(const KvChunkHeader& h, const uint8_t* body, KvScratch* scratch, SlabOut&& out) {
  const bool int4 = static_cast<KvCodec>(h.codec) == KvCodec::kInt4;
  const auto dt = static_cast<KvDtype>(h.dtype);
  const uint32_t C = h.channels, T = h.tokens;
  const LossyLayout lay(T, C, h.group_size, h.flags);
  if ((int4 && scratch->capacity() < h.original_len) || !KvCodecImpl::row_fits(scratch, C))
    return Code::kTooBig;
  const uint8_t* params = body;
  const uint8_t* codes_in = body + h.section_len;
  Params* prm = reinterpret_cast<Params*>(KvCodecImpl::row(scratch));
  const SimdLevel lvl = g_simd;
  for (uint32_t s = 0; s < h.slabs; ++s) {
    const uint8_t* codes = codes_in + static_cast<size_t>(s) * T * C;
    if (int4) {
      uint8_t* un = KvCodecImpl::plane(scratch);
      kv_quant::unpack_nibbles(codes_in + static_cast<size_t>(s) * T * C / 2,
                               static_cast<size_t>(T) * C / 2, un, lvl);
      codes = un;
    }
    uint16_t* o = out(s);
    const uint8_t* slab_params = params + lay.params_at(s);
    if (lay.per_token(s)) {
      kv_quant::dequantize_tokens(codes, T, C, slab_params, lvl, dt, o);
      continue;
    }
    for (uint32_t g = 0; g < lay.groups; ++g)
      kv_quant::dequantize_group(codes, C, g * lay.G, std::min(T, (g + 1) * lay.G),
                                 slab_params + static_cast<size_t>(g) * C * 4, prm, lvl, dt, o);
  }
  return Code::kSuccess;
}

}  // namespace

Status kv_decode(const uint8_t* src, size_t len, uint8_t* dst, size_t cap, KvScratch* scratch,
                 size_t* out_len) {
  KvChunkHeader h;
  DPUKV_RETURN_IF_ERROR(kv_read_header(src, len, &h));
  if (cap < h.original_len) return Code::kTooBig;
  const uint8_t* body = src + sizeof(KvChunkHeader);
  const auto codec = static_cast<KvCodec>(h.codec);
  const size_t n = static_cast<size_t>(h.slabs) * h.tokens * h.channels;
  if (codec == KvCodec::kRaw) {
    std::memcpy(dst, body, h.original_len);
  } else if (codec == KvCodec::kLossless || codec == KvCodec::kLosslessDelta) {
    if (scratch->capacity() < h.original_len) return Code::kTooBig;
    uint8_t* hi = KvCodecImpl::plane(scratch);
    size_t used = 0;
    const uint8_t* lo = body;
    DPUKV_RETURN_IF_ERROR(huffman::decompress(body + n, h.section_len, hi, n, &used));
    if (used != h.section_len) return Code::kCorrupted;
    const kv_planes::MergeFn merge =
        g_simd != SimdLevel::kScalar ? kv_planes::merge_avx2 : kv_planes::merge_scalar;
    auto* out = reinterpret_cast<uint16_t*>(dst);
    const size_t C = h.channels;
    XXH3_state_t hs;
    (void)XXH3_64bits_reset(&hs);
    for_each_piece(KvShape{h.slabs, h.tokens, h.channels}, codec == KvCodec::kLosslessDelta,
                   [&](size_t off, bool has_prev, size_t m) {
                     merge(hi + off, lo + off, has_prev ? out + off - C : nullptr, m, out + off);
                     chunk_checksum_update(&hs, out + off, m * 2);
                   });
    if (h.original_len & 1) {
      dst[h.original_len - 1] = body[h.payload_len - 1];
      chunk_checksum_update(&hs, dst + h.original_len - 1, 1);
    }
    if (XXH3_64bits_digest(&hs) != h.checksum) return Code::kCorrupted;
    *out_len = h.original_len;
    return Code::kSuccess;
  } else {
    // Lossy: verify the payload first, then dequantize.
    if (xxh3_64(body, h.payload_len) != h.checksum) return Code::kCorrupted;
    const size_t slab = static_cast<size_t>(h.tokens) * h.channels;
    auto* out = reinterpret_cast<uint16_t*>(dst);
    DPUKV_RETURN_IF_ERROR(dequantize(h, body, scratch, [&](uint32_t s) { return out + s * slab; }));
    *out_len = h.original_len;
    return Code::kSuccess;
  }
  if (xxh3_64(dst, h.original_len) != h.checksum) return Code::kCorrupted;
  *out_len = h.original_len;
  return Code::kSuccess;
}

Status kv_encoded_length(const uint8_t* src, size_t cap, size_t* len) {
  if (src == nullptr || len == nullptr || cap < sizeof(KvChunkHeader)) return Code::kCorrupted;
  KvChunkHeader h;
  std::memcpy(&h, src, sizeof(h));
  if (h.payload_len > cap - sizeof(KvChunkHeader)) return Code::kCorrupted;
  DPUKV_RETURN_IF_ERROR(kv_read_header(src, sizeof(h) + h.payload_len, &h));
  *len = sizeof(h) + h.payload_len;
  return Code::kSuccess;
}

Status kv_decode_rows(const uint8_t* src, size_t len, uint8_t* const* rows, size_t nrows,
                      size_t row_bytes, KvScratch* scratch, size_t* out_len) {
  if (rows == nullptr || scratch == nullptr || out_len == nullptr || row_bytes == 0)
    return Code::kInvalidValue;
  KvChunkHeader h;
  DPUKV_RETURN_IF_ERROR(kv_read_header(src, len, &h));
  // A chunk of other rows than these is not this chunk: never served.
  if (h.original_len != static_cast<uint64_t>(nrows) * row_bytes) return Code::kCorrupted;
  const uint8_t* body = src + sizeof(KvChunkHeader);
  const size_t slab_bytes = static_cast<size_t>(h.tokens) * h.channels * 2;
  if (kv_codec_lossy(static_cast<KvCodec>(h.codec)) && row_bytes % slab_bytes == 0) {
    // Slabs do not straddle rows: dequantized straight into them, once verified.
    if (xxh3_64(body, h.payload_len) != h.checksum) return Code::kCorrupted;
    const size_t per_row = row_bytes / slab_bytes;
    DPUKV_RETURN_IF_ERROR(dequantize(h, body, scratch, [&](uint32_t s) {
      return reinterpret_cast<uint16_t*>(rows[s / per_row] + (s % per_row) * slab_bytes);
    }));
    *out_len = h.original_len;
    return Code::kSuccess;
  }
  // The others are verified on their output: decoded whole, then copied.
  std::vector<uint8_t>& whole = KvCodecImpl::whole(scratch);
  if (whole.size() < h.original_len) whole.resize(h.original_len);
  size_t m = 0;
  DPUKV_RETURN_IF_ERROR(kv_decode(src, len, whole.data(), whole.size(), scratch, &m));
  for (size_t i = 0; i < nrows; ++i) std::memcpy(rows[i], whole.data() + i * row_bytes, row_bytes);
  *out_len = m;
  return Code::kSuccess;
}

}  // namespace dpukv
