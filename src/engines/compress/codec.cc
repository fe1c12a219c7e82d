#include "engines/compress/codec.h"

#include <isa-l/igzip_lib.h>
#include <lz4.h>
#include <lz4frame.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <climits>
#include <cstring>

#include "engines/compress/checksum.h"

namespace dpukv {

namespace {
constexpr const char* kNames[] = {"deflate", "lz4",         "lz4-frame",
                                  "zstd",    "kv-lossless", "kv-lossless-delta",
                                  "kv-int8", "kv-int4"};
static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(CompressAlgo::kCount_));

KvCodec kv_codec_of(CompressAlgo a) {
  switch (a) {
    case CompressAlgo::kKvLossless:
      return KvCodec::kLossless;
    case CompressAlgo::kKvLosslessDelta:
      return KvCodec::kLosslessDelta;
    case CompressAlgo::kKvInt8:
      return KvCodec::kInt8;
    default:
      return KvCodec::kInt4;
  }
}
}  // namespace

const char* compress_algo_name(CompressAlgo a) {
  auto i = static_cast<size_t>(a);
  return i < static_cast<size_t>(CompressAlgo::kCount_) ? kNames[i] : "?";
}

bool compress_algo_from_name(const char* name, CompressAlgo* out) {
  for (size_t i = 0; i < static_cast<size_t>(CompressAlgo::kCount_); ++i)
    if (std::strcmp(name, kNames[i]) == 0) {
      *out = static_cast<CompressAlgo>(i);
      return true;
    }
  return false;
}

struct CodecScratch::Native {
  ZSTD_CCtx* zc = nullptr;
  ZSTD_DCtx* zd = nullptr;
  LZ4F_dctx* lz4d = nullptr;
  inflate_state inflate{};
  isal_zstream deflate{};
  ~Native() {
    ZSTD_freeCCtx(zc);
    ZSTD_freeDCtx(zd);
    if (lz4d) LZ4F_freeDecompressionContext(lz4d);
  }
};

CodecScratch::~CodecScratch() = default;

Status CodecScratch::create(size_t max_chunk_bytes, std::unique_ptr<CodecScratch>* out) {
  std::unique_ptr<CodecScratch> s(new CodecScratch());
  s->max_chunk_ = max_chunk_bytes;
  s->kv_.reserve(max_chunk_bytes);
  s->isal_level_len_ = ISAL_DEF_LVL1_DEFAULT;
  s->isal_level_buf_.reset(new uint8_t[s->isal_level_len_]);
  s->native_ = std::make_unique<Native>();
  s->native_->zc = ZSTD_createCCtx();
  s->native_->zd = ZSTD_createDCtx();
  if (s->native_->zc == nullptr || s->native_->zd == nullptr ||
      LZ4F_isError(LZ4F_createDecompressionContext(&s->native_->lz4d, LZ4F_VERSION)))
    return Code::kNoMemory;
  *out = std::move(s);
  return Code::kSuccess;
}

struct CodecOps {
  static KvScratch* kv(CodecScratch* s) { return &s->kv_; }
  static CodecScratch::Native* native(CodecScratch* s) { return s->native_.get(); }
  static uint8_t* level_buf(CodecScratch* s) { return s->isal_level_buf_.get(); }
  static size_t level_len(CodecScratch* s) { return s->isal_level_len_; }
};

size_t compress_bound(CompressAlgo a, const CodecParams& p, size_t n) {
  switch (a) {
    case CompressAlgo::kDeflate:
      return n + n / 16 + 1024;  // stored blocks at worst
    case CompressAlgo::kLz4Block:
      return static_cast<size_t>(
          LZ4_compressBound(static_cast<int>(std::min<size_t>(n, LZ4_MAX_INPUT_SIZE))));
    case CompressAlgo::kLz4Frame:
      return LZ4F_compressFrameBound(n, nullptr);
    case CompressAlgo::kZstd:
      return ZSTD_compressBound(n);
    default: {
      KvCodecParams kp{kv_codec_of(a), p.dtype, p.shape, p.group_size};
      return kv_encode_bound(kp, n);
    }
  }
}

namespace {
// KV codecs carry an xxh3-64 of the original in their chunk header (checked on every
// decode), so they are not hashed a second time here.
void checksums_of(CompressAlgo a, const uint8_t* plain, size_t n, CodecResult* r) {
  if (a >= CompressAlgo::kKvLossless) return;
  if (a == CompressAlgo::kDeflate) {
    r->crc32 = crc32_gzip(plain, n);
    r->adler32 = adler32(plain, n);
  } else {
    r->xxh32 = xxh32(plain, n);
  }
}
}  // namespace

Status codec_compress(CompressAlgo a, const CodecParams& p, const uint8_t* src, size_t n,
                      uint8_t* dst, size_t cap, CodecScratch* s, CodecResult* r) {
  if ((src == nullptr && n) || dst == nullptr || s == nullptr || r == nullptr)
    return Code::kInvalidValue;
  if (n > s->max_chunk()) return Code::kTooBig;
  *r = {};
  switch (a) {
    case CompressAlgo::kDeflate: {
      isal_zstream& z = CodecOps::native(s)->deflate;
      isal_deflate_stateless_init(&z);
      z.next_in = const_cast<uint8_t*>(src);
      z.avail_in = static_cast<uint32_t>(n);
      z.next_out = dst;
      z.avail_out = static_cast<uint32_t>(std::min<size_t>(cap, UINT32_MAX));
      z.level = 1;
      z.level_buf = CodecOps::level_buf(s);
      z.level_buf_size = static_cast<uint32_t>(CodecOps::level_len(s));
      z.end_of_stream = 1;
      z.flush = NO_FLUSH;
      int rc = isal_deflate_stateless(&z);
      if (rc == STATELESS_OVERFLOW) return Code::kTooBig;
      if (rc != COMP_OK) return Code::kDriver;
      r->out_len = z.total_out;
      break;
    }
    case CompressAlgo::kLz4Block: {
      if (n > LZ4_MAX_INPUT_SIZE) return Code::kTooBig;
      int w = LZ4_compress_default(reinterpret_cast<const char*>(src), reinterpret_cast<char*>(dst),
                                   static_cast<int>(n),
                                   static_cast<int>(std::min<size_t>(cap, INT_MAX)));
      if (w <= 0) return n == 0 ? Status() : Status(Code::kTooBig);
      r->out_len = static_cast<size_t>(w);
      break;
    }
    case CompressAlgo::kLz4Frame: {
      size_t w = LZ4F_compressFrame(dst, cap, src, n, nullptr);
      if (LZ4F_isError(w)) return Code::kTooBig;
      r->out_len = w;
      break;
    }
    case CompressAlgo::kZstd: {
      size_t w = ZSTD_compressCCtx(CodecOps::native(s)->zc, dst, cap, src, n, p.zstd_level);
      if (ZSTD_isError(w))
        return ZSTD_getErrorCode(w) == ZSTD_error_dstSize_tooSmall ? Code::kTooBig : Code::kDriver;
      r->out_len = w;
      break;
    }
    default: {
      KvCodecParams kp{kv_codec_of(a), p.dtype, p.shape, p.group_size};
      DPUKV_RETURN_IF_ERROR(
          kv_encode(kp, src, n, dst, cap, CodecOps::kv(s), &r->out_len, &r->error));
      break;
    }
  }
  checksums_of(a, src, n, r);
  return Code::kSuccess;
}

Status codec_decompress(CompressAlgo a, const CodecParams& /*p*/, const uint8_t* src, size_t n,
                        uint8_t* dst, size_t cap, CodecScratch* s, CodecResult* r) {
  if ((src == nullptr && n) || dst == nullptr || s == nullptr || r == nullptr)
    return Code::kInvalidValue;
  *r = {};
  cap = std::min(cap, s->max_chunk());
  switch (a) {
    case CompressAlgo::kDeflate: {
      inflate_state& st = CodecOps::native(s)->inflate;
      isal_inflate_init(&st);
      st.next_in = const_cast<uint8_t*>(src);
      st.avail_in = static_cast<uint32_t>(std::min<size_t>(n, UINT32_MAX));
      st.next_out = dst;
      st.avail_out = static_cast<uint32_t>(std::min<size_t>(cap, UINT32_MAX));
      st.crc_flag = ISAL_DEFLATE;
      int rc = isal_inflate_stateless(&st);
      if (rc == ISAL_OUT_OVERFLOW) return Code::kTooBig;
      if (rc != ISAL_DECOMP_OK || st.avail_in != 0) return Code::kCorrupted;
      r->out_len = st.total_out;
      break;
    }
    case CompressAlgo::kLz4Block: {
      if (n > INT_MAX) return Code::kCorrupted;
      int w = LZ4_decompress_safe(reinterpret_cast<const char*>(src), reinterpret_cast<char*>(dst),
                                  static_cast<int>(n),
                                  static_cast<int>(std::min<size_t>(cap, INT_MAX)));
      if (w < 0) return Code::kCorrupted;  // LZ4 cannot tell a short destination apart
      r->out_len = static_cast<size_t>(w);
      break;
    }
    case CompressAlgo::kLz4Frame: {
      LZ4F_dctx* d = CodecOps::native(s)->lz4d;
      LZ4F_resetDecompressionContext(d);
      size_t in = n, out = cap;
      size_t rc = LZ4F_decompress(d, dst, &out, src, &in, nullptr);
      if (LZ4F_isError(rc)) return Code::kCorrupted;
      if (rc != 0)
        return in == n ? (out == cap ? Status(Code::kTooBig) : Status(Code::kCorrupted))
                       : Status(Code::kTooBig);
      r->out_len = out;
      break;
    }
    case CompressAlgo::kZstd: {
      size_t w = ZSTD_decompressDCtx(CodecOps::native(s)->zd, dst, cap, src, n);
      if (ZSTD_isError(w))
        return ZSTD_getErrorCode(w) == ZSTD_error_dstSize_tooSmall ? Code::kTooBig
                                                                   : Code::kCorrupted;
      r->out_len = w;
      break;
    }
    default:
      DPUKV_RETURN_IF_ERROR(kv_decode(src, n, dst, cap, CodecOps::kv(s), &r->out_len));
      break;
  }
  checksums_of(a, dst, r->out_len, r);
  return Code::kSuccess;
}

}  // namespace dpukv
