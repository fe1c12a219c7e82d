// The compress engine's algorithms behind one interface: general-purpose codecs
// from Debian's libraries (ISA-L deflate, LZ4 block and frame, zstd) and the KV
// codecs (kv_codec.h). Every decoder is safe on hostile input: corrupt or
// truncated data gives CORRUPTED, a short destination TOO_BIG, never a read or
// write outside the buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "engines/compress/kv_codec.h"
#include "runtime/status.h"

namespace dpukv {

enum class CompressAlgo : uint8_t {
  kDeflate,  // raw deflate (RFC 1951), ISA-L level 1
  kLz4Block,
  kLz4Frame,
  kZstd,  // level from CodecParams (default 1)
  kKvLossless,
  kKvLosslessDelta,
  kKvInt8,
  kKvInt4,
  kCount_,
};
const char* compress_algo_name(CompressAlgo a);
bool compress_algo_from_name(const char* name, CompressAlgo* out);

struct CodecParams {
  int zstd_level = 1;
  KvDtype dtype = KvDtype::kBf16;
  KvShape shape{1, 1, 0};
  uint32_t group_size = 0;
};

// What a task returns besides its bytes, as doca_compress does: checksums of the
// uncompressed data (CRC-32 and Adler-32 for deflate, xxHash32 for LZ4 and the
// rest), and for lossy codecs the error of the encode.
struct CodecResult {
  size_t out_len = 0;
  uint32_t crc32 = 0;
  uint32_t adler32 = 0;
  uint32_t xxh32 = 0;
  KvCodecError error;
};

// Per-thread working memory, sized once for the largest chunk.
class CodecScratch {
 public:
  static Status create(size_t max_chunk_bytes, std::unique_ptr<CodecScratch>* out);
  ~CodecScratch();
  CodecScratch(const CodecScratch&) = delete;
  CodecScratch& operator=(const CodecScratch&) = delete;
  size_t max_chunk() const { return max_chunk_; }

 private:
  friend struct CodecOps;
  CodecScratch() = default;
  size_t max_chunk_ = 0;
  KvScratch kv_;
  std::unique_ptr<uint8_t[]> isal_level_buf_;
  size_t isal_level_len_ = 0;
  struct Native;
  std::unique_ptr<Native> native_;  // library contexts (zstd, lz4f, isa-l inflate)
};

size_t compress_bound(CompressAlgo a, const CodecParams& p, size_t n);
Status codec_compress(CompressAlgo a, const CodecParams& p, const uint8_t* src, size_t n,
                      uint8_t* dst, size_t cap, CodecScratch* s, CodecResult* r);
Status codec_decompress(CompressAlgo a, const CodecParams& p, const uint8_t* src, size_t n,
                        uint8_t* dst, size_t cap, CodecScratch* s, CodecResult* r);

}  // namespace dpukv
