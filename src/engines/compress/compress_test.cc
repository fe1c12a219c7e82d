#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engines/compress/checksum.h"
#include "engines/compress/fp16.h"
#include "engines/compress/huffman.h"
#include "engines/compress/kv_codec.h"
#include "engines/compress/kv_synth.h"

namespace dpukv {
namespace {

TEST(Checksum, KnownValues) {
  const char* s = "123456789";
  EXPECT_EQ(crc32_gzip(s, 9), 0xCBF43926u);
  EXPECT_EQ(crc32c(s, 9), 0xE3069283u);
  EXPECT_EQ(adler32("Wikipedia", 9), 0x11E60398u);
  EXPECT_EQ(xxh32("", 0), 0x02CC5D05u);
  EXPECT_EQ(xxh3_64("", 0), 0x2D06800538D394C2ull);
  // Incremental equals one shot.
  EXPECT_EQ(crc32c(s + 4, 5, crc32c(s, 4)), crc32c(s, 9));
  EXPECT_EQ(crc32_gzip(s + 4, 5, crc32_gzip(s, 4)), crc32_gzip(s, 9));
}

__attribute__((target("f16c"))) uint16_t hw_f32_to_fp16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float hw_fp16_to_f32(uint16_t h) {
  return _cvtsh_ss(h);
}

TEST(Fp16, SoftwareConversionsMatchHardware) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C to compare with";
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = fp16_to_f32(static_cast<uint16_t>(h)),
                b = hw_fp16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(b)) {
      ASSERT_TRUE(std::isnan(a));
      continue;
    }
    ASSERT_EQ(f32_to_bits(a), f32_to_bits(b)) << h;
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    float f = bits_to_f32(rng());
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_fp16(f), hw_f32_to_fp16(f)) << f;
  }
  // bf16 rounds to nearest even.
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808000u)), 0x3f80);  // tie to even (down)
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f818000u)), 0x3f82);  // tie to even (up)
}

std::vector<uint8_t> huff_roundtrip(const std::vector<uint8_t>& in) {
  std::vector<uint8_t> enc(huffman::bound(in.size()) + 8), dec(in.size());
  size_t n = 0, used = 0;
  EXPECT_TRUE(huffman::compress(in.data(), in.size(), enc.data(), enc.size(), &n).ok());
  enc.resize(n);
  EXPECT_TRUE(huffman::decompress(enc.data(), enc.size(), dec.data(), dec.size(), &used).ok());
  EXPECT_EQ(used, n);
  EXPECT_EQ(dec, in);
  return enc;
}

// Both builds of the coder's loops (x86-64-v3 where the CPU has it, and portable)
// run every Huffman test; a block from one decodes with the other.
class Huffman : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { portable_ = huffman::use_portable(GetParam()); }
  void TearDown() override { (void)huffman::use_portable(false); }
  bool portable_ = false;
};
INSTANTIATE_TEST_SUITE_P(Paths, Huffman, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "portable" : "cpu_best"; });

TEST_P(Huffman, RoundTripsEveryShape) {
  EXPECT_TRUE(portable_ || !GetParam());
  EXPECT_STREQ(huffman::path_name(), portable_ ? "portable" : "x86-64-v3");
  std::mt19937 rng(1);
  for (size_t n : {0ul, 1ul, 3ul, 4ul, 5ul, 17ul, 1000ul, 65535ul, 65536ul, 65537ul, 300000ul}) {
    std::vector<uint8_t> skewed(n), uniform(n), single(n, 42), two(n);
    std::geometric_distribution<int> g(0.3);
    for (size_t i = 0; i < n; ++i) {
      skewed[i] = static_cast<uint8_t>(std::min(g(rng), 255));
      uniform[i] = static_cast<uint8_t>(rng());
      two[i] = (rng() & 1) ? 7 : 9;
    }
    huff_roundtrip(skewed);
    huff_roundtrip(uniform);
    huff_roundtrip(single);
    huff_roundtrip(two);
  }
  // Very skewed frequencies force the 11-bit length limit.
  std::vector<uint8_t> fib;
  for (int s = 0, f = 1, f2 = 1; s < 20; ++s) {
    fib.insert(fib.end(), static_cast<size_t>(f), static_cast<uint8_t>(s));
    int t = f + f2;
    f = f2, f2 = t;
  }
  huff_roundtrip(fib);
}

TEST_P(Huffman, CompressesSkewedDataAndRejectsBadInput) {
  std::mt19937 rng(2);
  std::geometric_distribution<int> g(0.5);
  std::vector<uint8_t> in(200000);
  for (auto& x : in) x = static_cast<uint8_t>(std::min(g(rng), 255));
  auto enc = huff_roundtrip(in);
  EXPECT_LT(enc.size(), in.size() / 3);
  std::vector<uint8_t> out(in.size());
  size_t used;
  // Truncated input.
  EXPECT_EQ(huffman::decompress(enc.data(), enc.size() / 2, out.data(), out.size(), &used),
            Code::kCorrupted);
  // Random corruption: an error or wrong bytes, never a crash (ASan watches).
  for (int i = 0; i < 2000; ++i) {
    auto bad = enc;
    bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
    (void)huffman::decompress(bad.data(), bad.size(), out.data(), out.size(), &used);
  }
  // Too small a destination.
  size_t n;
  std::vector<uint8_t> small(100);
  EXPECT_EQ(huffman::compress(in.data(), in.size(), small.data(), small.size(), &n), Code::kTooBig);
}

// Chunks written before the encoder's blocks grew to 256 KiB (64 KiB blocks, still
// on disk tiers) decode; a block longer than the decoder takes is refused.
TEST_P(Huffman, SmallerAndLargerBlocksThanTheEncoderWrites) {
  std::mt19937 rng(3);
  std::geometric_distribution<int> g(0.3);
  std::vector<uint8_t> in(5 * 65536 + 777);
  for (auto& x : in) x = static_cast<uint8_t>(std::min(g(rng), 255));
  // The stream is blocks back to back: 64 KiB pieces encoded one by one make the
  // stream the old encoder wrote.
  std::vector<uint8_t> old_stream;
  for (size_t i = 0; i < in.size(); i += 65536) {
    const size_t m = std::min<size_t>(65536, in.size() - i);
    std::vector<uint8_t> enc(huffman::bound(m) + 8);
    size_t n = 0;
    ASSERT_TRUE(huffman::compress(in.data() + i, m, enc.data(), enc.size(), &n).ok());
    old_stream.insert(old_stream.end(), enc.begin(), enc.begin() + static_cast<long>(n));
  }
  std::vector<uint8_t> out(in.size());
  size_t used = 0;
  ASSERT_TRUE(
      huffman::decompress(old_stream.data(), old_stream.size(), out.data(), out.size(), &used)
          .ok());
  EXPECT_EQ(used, old_stream.size());
  EXPECT_EQ(out, in);
  // The encoder's own blocks are larger than 64 KiB now.
  std::vector<uint8_t> enc(huffman::bound(in.size()) + 8);
  size_t n = 0;
  ASSERT_TRUE(huffman::compress(in.data(), in.size(), enc.data(), enc.size(), &n).ok());
  uint32_t first_block;
  std::memcpy(&first_block, enc.data() + 1, 4);
  EXPECT_EQ(first_block, huffman::kBlockSymbols);
  // A block that claims more symbols than the decoder takes is refused.
  const uint32_t bn = static_cast<uint32_t>(huffman::kMaxBlockSymbols + 1);
  std::vector<uint8_t> raw(5 + bn, 7);  // mode raw (0), then u32 n, then n bytes
  raw[0] = 0;
  std::memcpy(raw.data() + 1, &bn, 4);
  std::vector<uint8_t> dst(bn);
  EXPECT_EQ(huffman::decompress(raw.data(), raw.size(), dst.data(), dst.size(), &used),
            Code::kCorrupted);
}

// The encoder's output is a format (disk tiers keep it): whatever makes it faster
// must write the same bytes. The digests are of what the first encoder wrote for
// these inputs (a skewed byte stream, and the delta-coded high plane of a KV chunk).
TEST_P(Huffman, WritesTheSameBytesAsTheFirstEncoder) {
  std::vector<uint8_t> skewed(300001);
  uint64_t x = 88172645463325252ull;
  for (auto& b : skewed) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const int z = __builtin_ctzll(x | (1ull << 40));
    b = static_cast<uint8_t>(z < 8 ? z : (x >> 48));
  }
  const KvShape sh{2, 256, 1024};
  std::vector<uint16_t> kv;
  kv_synth(KvDataset::kRealistic, KvDtype::kBf16, sh, 5, &kv);
  std::vector<uint8_t> hi(kv.size());
  for (size_t i = 0; i < kv.size(); ++i) {
    const bool first_token = (i / sh.channels) % sh.tokens == 0;
    hi[i] = static_cast<uint8_t>((kv[i] >> 8) ^ (first_token ? 0 : kv[i - sh.channels] >> 8));
  }
  const struct {
    const std::vector<uint8_t>* in;
    size_t coded;
    uint64_t digest;
  } cases[] = {{&skewed, 91027, 0xe9d5b693a0187a40ull}, {&hi, 159513, 0xa7b6bfa0f054f1f2ull}};
  for (const auto& c : cases) {
    std::vector<uint8_t> enc(huffman::bound(c.in->size()) + 8);
    size_t n = 0;
    ASSERT_TRUE(huffman::compress(c.in->data(), c.in->size(), enc.data(), enc.size(), &n).ok());
    EXPECT_EQ(n, c.coded);
    EXPECT_EQ(xxh3_64(enc.data(), n), c.digest);
    // The other build decodes it.
    (void)huffman::use_portable(!GetParam());
    std::vector<uint8_t> dec(c.in->size());
    size_t used = 0;
    EXPECT_TRUE(huffman::decompress(enc.data(), n, dec.data(), dec.size(), &used).ok());
    EXPECT_EQ(used, n);
    EXPECT_EQ(dec, *c.in);
    (void)huffman::use_portable(GetParam());
  }
}

struct KvCase {
  KvDataset ds;
  KvDtype dt;
};

std::vector<uint16_t> make_kv(KvDataset ds, KvDtype dt, const KvShape& sh, uint64_t seed = 5) {
  std::vector<uint16_t> v;
  kv_synth(ds, dt, sh, seed, &v);
  return v;
}

TEST(KvCodec, LosslessRoundTripsAndCompressesRealisticKv) {
  const KvShape sh{4, 256, 1024};
  KvScratch scratch(sh.elements() * 2);
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp16}) {
    for (KvDataset ds : {KvDataset::kRealistic, KvDataset::kIid}) {
      auto v = make_kv(ds, dt, sh);
      const size_t len = v.size() * 2;
      for (KvCodec c : {KvCodec::kRaw, KvCodec::kLossless, KvCodec::kLosslessDelta}) {
        KvCodecParams p{c, dt, sh, 0};
        std::vector<uint8_t> enc(kv_encode_bound(p, len)), dec(len);
        size_t n = 0, m = 0;
        ASSERT_TRUE(kv_encode(p, reinterpret_cast<uint8_t*>(v.data()), len, enc.data(), enc.size(),
                              &scratch, &n, nullptr)
                        .ok());
        ASSERT_TRUE(kv_decode(enc.data(), n, dec.data(), dec.size(), &scratch, &m).ok());
        ASSERT_EQ(m, len);
        ASSERT_EQ(std::memcmp(dec.data(), v.data(), len), 0) << kv_codec_name(c);
        if (ds == KvDataset::kRealistic && dt == KvDtype::kBf16 && c == KvCodec::kLosslessDelta) {
          EXPECT_GE(static_cast<double>(len) / n, 1.45) << "ratio on realistic bf16 KV";
        }
      }
    }
  }
}

TEST(KvCodec, LosslessOddSizesAndShapelessBuffers) {
  KvScratch scratch(1 << 20);
  std::mt19937 rng(3);
  for (size_t len : {0ul, 1ul, 2ul, 3ul, 999ul, 65537ul, 200001ul}) {
    std::vector<uint8_t> in(len);
    for (auto& x : in) x = static_cast<uint8_t>(rng() & 0x1f);
    KvCodecParams p{KvCodec::kLossless, KvDtype::kBf16, KvShape{1, 1, 0}, 0};
    std::vector<uint8_t> enc(kv_encode_bound(p, len)), dec(len + 1);
    size_t n = 0, m = 0;
    ASSERT_TRUE(kv_encode(p, in.data(), len, enc.data(), enc.size(), &scratch, &n, nullptr).ok())
        << len;
    ASSERT_TRUE(kv_decode(enc.data(), n, dec.data(), dec.size(), &scratch, &m).ok()) << len;
    ASSERT_EQ(m, len);
    if (len) {
      ASSERT_EQ(std::memcmp(dec.data(), in.data(), len), 0);
    }
  }
  // Delta needs a shape that describes the bytes.
  std::vector<uint8_t> in(1000), enc(4096);
  size_t n;
  KvCodecParams p{KvCodec::kLosslessDelta, KvDtype::kBf16, KvShape{1, 10, 10}, 0};
  EXPECT_EQ(kv_encode(p, in.data(), in.size(), enc.data(), enc.size(), &scratch, &n, nullptr),
            Code::kInvalidValue);
}

double measured_rel_rmse(const std::vector<uint16_t>& a, const uint8_t* b, KvDtype dt) {
  double se = 0, sx = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    uint16_t y;
    std::memcpy(&y, b + 2 * i, 2);
    const double x = dt == KvDtype::kBf16 ? bf16_to_f32(a[i]) : fp16_to_f32(a[i]);
    const double z = dt == KvDtype::kBf16 ? bf16_to_f32(y) : fp16_to_f32(y);
    se += (x - z) * (x - z), sx += x * x;
  }
  return std::sqrt(se / sx);
}

TEST(KvCodec, LossyMeetsErrorBoundsAndRatios) {
  const KvShape sh{4, 256, 1024};
  KvScratch scratch(sh.elements() * 2);
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp16}) {
    auto v = make_kv(KvDataset::kRealistic, dt, sh);
    const size_t len = v.size() * 2;
    for (KvCodec c : {KvCodec::kInt8, KvCodec::kInt4}) {
      KvCodecParams p{c, dt, sh, 0};
      std::vector<uint8_t> enc(kv_encode_bound(p, len)), dec(len);
      size_t n = 0, m = 0;
      KvCodecError err;
      ASSERT_TRUE(kv_encode(p, reinterpret_cast<uint8_t*>(v.data()), len, enc.data(), enc.size(),
                            &scratch, &n, &err)
                      .ok());
      ASSERT_TRUE(kv_decode(enc.data(), n, dec.data(), dec.size(), &scratch, &m).ok());
      const double ratio = static_cast<double>(len) / n;
      const double rmse = measured_rel_rmse(v, dec.data(), dt);
      if (c == KvCodec::kInt8) {
        EXPECT_GE(ratio, 1.9);
        EXPECT_LE(err.rel_rmse, 1e-2);
      } else {
        EXPECT_GE(ratio, 3.5);
        EXPECT_LE(err.rel_rmse, 1e-1);
      }
      // The reported error is the error of what decode returns (up to output rounding).
      EXPECT_NEAR(rmse, err.rel_rmse, 0.2 * err.rel_rmse + 2e-3) << kv_codec_name(c);
      EXPECT_GT(err.max_abs_err, 0.0);
    }
  }
}

TEST(KvCodec, SimdPathsAreBitIdenticalToScalar) {
  const SimdLevel best = kv_simd_level();
  // 1000 channels: not a multiple of 16, so the scalar tail runs next to SIMD.
  const KvShape sh{2, 200, 1000};
  KvScratch scratch(sh.elements() * 2);
  for (KvDtype dt : {KvDtype::kBf16, KvDtype::kFp16}) {
    auto v = make_kv(KvDataset::kRealistic, dt, sh, 11);
    const size_t len = v.size() * 2;
    for (auto [c, flags] :
         {std::pair{KvCodec::kInt8, 0}, std::pair{KvCodec::kInt4, 0}, std::pair{KvCodec::kInt8, 1},
          std::pair{KvCodec::kInt4, 1}, std::pair{KvCodec::kLosslessDelta, 0}}) {
      KvCodecParams p{c, dt, sh, 32, static_cast<uint8_t>(flags)};
      std::vector<std::vector<uint8_t>> encs, decs;
      for (SimdLevel l : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
        kv_force_simd_level(l);
        std::vector<uint8_t> enc(kv_encode_bound(p, len)), dec(len);
        size_t n = 0, m = 0;
        ASSERT_TRUE(kv_encode(p, reinterpret_cast<uint8_t*>(v.data()), len, enc.data(), enc.size(),
                              &scratch, &n, nullptr)
                        .ok());
        enc.resize(n);
        ASSERT_TRUE(kv_decode(enc.data(), n, dec.data(), dec.size(), &scratch, &m).ok());
        encs.push_back(enc);
        decs.push_back(dec);
      }
      for (size_t i = 1; i < encs.size(); ++i) {
        EXPECT_EQ(encs[i], encs[0]) << kv_codec_name(c) << " encode differs at level " << i;
        EXPECT_EQ(decs[i], decs[0]) << kv_codec_name(c) << " decode differs at level " << i;
      }
    }
  }
  kv_force_simd_level(best);
}

// A connector decodes a retrieved chunk straight into the engine's blocks (rows
// scattered in memory): the rows get exactly what a whole decode gives, and a
// corrupt chunk, or one of other rows, leaves every row as it was.
TEST(KvCodec, DecodeIntoRowsEqualsWholeDecodeAndCorruptionTouchesNoRow) {
  // vLLM's CPU layout: a block row [3 heads, K|V, 128 tokens, 64 channels], 2 rows.
  const KvShape sh{2 * 3 * 2, 128, 64};
  const size_t rows = 2, row_bytes = sh.elements() * 2 / rows;
  KvScratch scratch(sh.elements() * 2);
  auto v = make_kv(KvDataset::kRealistic, KvDtype::kBf16, sh);
  const size_t len = v.size() * 2;
  for (auto [c, flags] : {std::pair{KvCodec::kLosslessDelta, 0}, std::pair{KvCodec::kInt8, 0},
                          std::pair{KvCodec::kInt4, 0}, std::pair{KvCodec::kInt4, 1}}) {
    KvCodecParams p{c, KvDtype::kBf16, sh, 0, static_cast<uint8_t>(flags)};
    std::vector<uint8_t> enc(kv_encode_bound(p, len) + 100), whole(len);
    size_t n = 0, m = 0;
    ASSERT_TRUE(kv_encode(p, reinterpret_cast<uint8_t*>(v.data()), len, enc.data(), enc.size(),
                          &scratch, &n, nullptr)
                    .ok());
    // A retrieve fills a slot larger than the chunk: the header says where it ends.
    size_t found = 0;
    ASSERT_TRUE(kv_encoded_length(enc.data(), enc.size(), &found).ok());
    EXPECT_EQ(found, n);
    EXPECT_EQ(kv_encoded_length(enc.data(), n - 1, &found), Code::kCorrupted);
    ASSERT_TRUE(kv_decode(enc.data(), n, whole.data(), whole.size(), &scratch, &m).ok());
    // The rows in reverse order, apart, in one arena with guard bytes between.
    std::vector<uint8_t> arena(3 * row_bytes + 64, 0xA5);
    uint8_t* dst[2] = {arena.data() + 2 * row_bytes + 32, arena.data() + 16};
    ASSERT_TRUE(kv_decode_rows(enc.data(), n, dst, rows, row_bytes, &scratch, &m).ok())
        << kv_codec_name(c);
    EXPECT_EQ(m, len);
    EXPECT_EQ(std::memcmp(dst[0], whole.data(), row_bytes), 0) << kv_codec_name(c);
    EXPECT_EQ(std::memcmp(dst[1], whole.data() + row_bytes, row_bytes), 0) << kv_codec_name(c);
    EXPECT_EQ(arena[15], 0xA5);
    EXPECT_EQ(arena[16 + row_bytes], 0xA5);
    EXPECT_EQ(arena[2 * row_bytes + 31], 0xA5);
    EXPECT_EQ(arena[3 * row_bytes + 32], 0xA5);
    // Rows that are not 128-token slabs apart take the whole-decode path: same bytes.
    std::vector<uint8_t> thirds(len);
    uint8_t* dst3[3] = {thirds.data(), thirds.data() + len / 3, thirds.data() + 2 * len / 3};
    ASSERT_TRUE(kv_decode_rows(enc.data(), n, dst3, 3, len / 3, &scratch, &m).ok());
    EXPECT_EQ(thirds, whole) << kv_codec_name(c);

    std::vector<uint8_t> before = arena;
    auto bad = enc;
    bad[sizeof(KvChunkHeader) + (n - sizeof(KvChunkHeader)) / 2] ^= 0x10;  // in the payload
    EXPECT_EQ(kv_decode_rows(bad.data(), n, dst, rows, row_bytes, &scratch, &m), Code::kCorrupted);
    bad = enc;
    bad[20] ^= 1;  // in the header
    EXPECT_EQ(kv_decode_rows(bad.data(), n, dst, rows, row_bytes, &scratch, &m), Code::kCorrupted);
    // A chunk of other rows (one row short): not this chunk.
    EXPECT_EQ(kv_decode_rows(enc.data(), n, dst, 1, row_bytes, &scratch, &m), Code::kCorrupted);
    EXPECT_EQ(arena, before) << kv_codec_name(c) << ": a refused chunk wrote into the rows";
  }
}

// kKvValuesPerToken: slabs alternate keys and values, and value slabs get a scale
// and zero per token. A value slab whose tokens differ in scale by orders of
// magnitude (as KV values do) keeps each token's own precision: its small tokens'
// error falls well below the per-channel quantizer's, which spreads the large
// tokens' range over the group. Keys are quantized as without the flag. The bytes
// are the same for 64-channel heads (one scale and zero per token or per channel
// and 64-token group).
TEST(KvCodec, ValuesPerTokenKeepEachTokensPrecision) {
  const KvShape sh{2, 128, 64};
  KvScratch scratch(sh.elements() * 2);
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> v(sh.elements());
  for (uint32_t s = 0; s < 2; ++s)
    for (uint32_t t = 0; t < 128; ++t)
      for (uint32_t c = 0; c < 64; ++c) {
        // Token t's values: scale 1 on odd tokens, 1/256 on even ones.
        const float x = nd(rng) * ((t & 1) ? 1.0f : 1.0f / 256);
        v[(static_cast<size_t>(s) * 128 + t) * 64 + c] = f32_to_bf16(x);
      }
  const size_t len = v.size() * 2;
  auto small_token_error = [&](const std::vector<uint8_t>& dec, uint32_t slab) {
    double se = 0, sx = 0;
    for (uint32_t t = 0; t < 128; t += 2)
      for (uint32_t c = 0; c < 64; ++c) {
        const size_t i = (static_cast<size_t>(slab) * 128 + t) * 64 + c;
        uint16_t y;
        std::memcpy(&y, dec.data() + 2 * i, 2);
        const double d = static_cast<double>(bf16_to_f32(v[i])) - bf16_to_f32(y);
        se += d * d, sx += static_cast<double>(bf16_to_f32(v[i])) * bf16_to_f32(v[i]);
      }
    return std::sqrt(se / sx);
  };
  std::vector<uint8_t> decs[2];
  size_t sizes[2];
  for (uint8_t flags : {uint8_t{0}, kKvValuesPerToken}) {
    KvCodecParams p{KvCodec::kInt4, KvDtype::kBf16, sh, 0, flags};
    std::vector<uint8_t> enc(kv_encode_bound(p, len)), dec(len);
    size_t n = 0, m = 0;
    ASSERT_TRUE(kv_encode(p, reinterpret_cast<uint8_t*>(v.data()), len, enc.data(), enc.size(),
                          &scratch, &n, nullptr)
                    .ok());
    KvChunkHeader h;
    ASSERT_TRUE(kv_read_header(enc.data(), n, &h).ok());
    EXPECT_EQ(h.flags, flags);
    ASSERT_TRUE(kv_decode(enc.data(), n, dec.data(), dec.size(), &scratch, &m).ok());
    decs[flags] = dec;
    sizes[flags] = n;
  }
  EXPECT_EQ(sizes[0], sizes[1]);
  // Keys (slab 0): the same quantizer with or without the flag.
  EXPECT_EQ(std::memcmp(decs[0].data(), decs[1].data(), len / 2), 0);
  // Values (slab 1): the small tokens keep their precision only per token.
  const double per_channel = small_token_error(decs[0], 1),
               per_token = small_token_error(decs[1], 1);
  EXPECT_LT(per_token, 0.2) << per_token;
  EXPECT_GT(per_channel, 10 * per_token) << per_channel << " vs " << per_token;

  // The flag needs key and value slabs in pairs, and a lossy codec.
  size_t n = 0;
  std::vector<uint8_t> enc(1 << 20);
  KvCodecParams odd{KvCodec::kInt4, KvDtype::kBf16, KvShape{1, 256, 64}, 0, kKvValuesPerToken};
  EXPECT_EQ(kv_encode(odd, reinterpret_cast<uint8_t*>(v.data()), len, enc.data(), enc.size(),
                      &scratch, &n, nullptr),
            Code::kInvalidValue);
  KvCodecParams lossless{KvCodec::kLosslessDelta, KvDtype::kBf16, sh, 0, kKvValuesPerToken};
  EXPECT_EQ(kv_encode(lossless, reinterpret_cast<uint8_t*>(v.data()), len, enc.data(), enc.size(),
                      &scratch, &n, nullptr),
            Code::kInvalidValue);
  KvCodecParams unknown{KvCodec::kInt8, KvDtype::kBf16, sh, 0, 2};
  EXPECT_EQ(kv_encode(unknown, reinterpret_cast<uint8_t*>(v.data()), len, enc.data(), enc.size(),
                      &scratch, &n, nullptr),
            Code::kInvalidValue);
  // A header whose flags were changed (and its crc resealed) describes other
  // parameters than the payload holds, or flags no reader knows: refused.
  KvCodecParams p{KvCodec::kInt8, KvDtype::kBf16, KvShape{2, 128, 32}, 0, 0};
  ASSERT_TRUE(kv_encode(p, reinterpret_cast<uint8_t*>(v.data()), 2 * 128 * 32 * 2, enc.data(),
                        enc.size(), &scratch, &n, nullptr)
                  .ok());
  for (uint8_t flags : {kKvValuesPerToken, uint8_t{2}, uint8_t{0x80}}) {
    KvChunkHeader h;
    std::memcpy(&h, enc.data(), sizeof(h));
    h.flags = flags;
    h.header_crc = crc32c(&h, offsetof(KvChunkHeader, header_crc));
    std::vector<uint8_t> bad(enc.begin(), enc.begin() + static_cast<std::ptrdiff_t>(n));
    std::memcpy(bad.data(), &h, sizeof(h));
    KvChunkHeader out;
    EXPECT_EQ(kv_read_header(bad.data(), bad.size(), &out), Code::kCorrupted) << int{flags};
  }
}

TEST(KvCodec, CorruptionIsDetectedNeverReturned) {
  const KvShape sh{1, 256, 512};
  KvScratch scratch(sh.elements() * 2);
  auto v = make_kv(KvDataset::kRealistic, KvDtype::kBf16, sh);
  const size_t len = v.size() * 2;
  std::mt19937 rng(9);
  for (auto [c, flags] :
       {std::pair{KvCodec::kRaw, 0}, std::pair{KvCodec::kLosslessDelta, 0},
        std::pair{KvCodec::kInt8, 0}, std::pair{KvCodec::kInt4, 0}, std::pair{KvCodec::kInt4, 1}}) {
    const KvShape shape = flags ? KvShape{2, 128, 512} : sh;  // keys and values: two slabs
    KvCodecParams p{c, KvDtype::kBf16, shape, 0, static_cast<uint8_t>(flags)};
    std::vector<uint8_t> enc(kv_encode_bound(p, len)), dec(len);
    size_t n = 0, m = 0;
    ASSERT_TRUE(kv_encode(p, reinterpret_cast<uint8_t*>(v.data()), len, enc.data(), enc.size(),
                          &scratch, &n, nullptr)
                    .ok());
    enc.resize(n);
    for (int i = 0; i < 300; ++i) {
      auto bad = enc;
      bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
      EXPECT_NE(kv_decode(bad.data(), bad.size(), dec.data(), dec.size(), &scratch, &m),
                Code::kSuccess)
          << kv_codec_name(c) << " returned corrupted bytes as good";
    }
    EXPECT_EQ(kv_decode(enc.data(), n - 1, dec.data(), dec.size(), &scratch, &m), Code::kCorrupted);
    EXPECT_EQ(kv_decode(enc.data(), n, dec.data(), len - 1, &scratch, &m), Code::kTooBig);
    size_t k;
    std::vector<uint8_t> tiny(100);
    EXPECT_EQ(kv_encode(p, reinterpret_cast<uint8_t*>(v.data()), len, tiny.data(), tiny.size(),
                        &scratch, &k, nullptr),
              Code::kTooBig);
  }
  // Non-finite input cannot be quantized.
  v[77] = 0x7f80;  // +inf in bf16
  KvCodecParams p{KvCodec::kInt8, KvDtype::kBf16, sh, 0};
  std::vector<uint8_t> enc(kv_encode_bound(p, len));
  size_t n;
  EXPECT_EQ(kv_encode(p, reinterpret_cast<uint8_t*>(v.data()), len, enc.data(), enc.size(),
                      &scratch, &n, nullptr),
            Code::kInvalidValue);
}

}  // namespace
}  // namespace dpukv
