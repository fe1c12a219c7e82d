#include "engines/compress/kv_codec.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engines/compress/checksum.h"
#include "engines/compress/fp16.h"
#include "engines/compress/huffman.h"
#include "engines/compress/kv_byte_planes.h"
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include "runtime/chunk_checksum.h"

namespace dpukv {

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

// ------------------------------------------------------------ quantization

inline float load_f32(const uint16_t* p, KvDtype dt) {
  return dt == KvDtype::kBf16 ? bf16_to_f32(*p) : fp16_to_f32(*p);
}
inline uint16_t store_16(float f, KvDtype dt) {
  return dt == KvDtype::kBf16 ? f32_to_bf16(f) : f32_to_fp16(f);
}
inline bool nonfinite16(uint16_t v, KvDtype dt) {
  return dt == KvDtype::kBf16 ? (v & 0x7f80u) == 0x7f80u : (v & 0x7c00u) == 0x7c00u;
}

uint16_t fp16_next_down(uint16_t h) {
  if ((h & 0x7fffu) == 0) return 0x8001u;
  return (h & 0x8000u) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h - 1);
}
uint16_t fp16_next_up(uint16_t h) {
  if ((h & 0x7fffu) == 0) return 0x0001u;
  return (h & 0x8000u) ? static_cast<uint16_t>(h - 1) : static_cast<uint16_t>(h + 1);
}

struct Params {
  float scale, zero, inv;
};

// From a group's min and max: fp16 zero <= min, fp16 scale with (max - zero) / scale
// <= qmax. False if they do not fit fp16.
bool make_params(float mn, float mx, float qmax, uint16_t* zh, uint16_t* sh, Params* p) {
  uint16_t z = f32_to_fp16(mn);
  if (fp16_to_f32(z) > mn) z = fp16_next_down(z);
  const float zero = fp16_to_f32(z);
  if (!std::isfinite(zero)) return false;
  const float range = mx - zero;
  uint16_t s = f32_to_fp16(range / qmax);
  if (fp16_to_f32(s) * qmax < range) s = fp16_next_up(s);
  const float scale = fp16_to_f32(s);
  if (!std::isfinite(scale)) return false;
  *zh = z;
  *sh = s;
  p->zero = zero;
  p->scale = scale;
  p->inv = scale > 0 ? 1.0f / scale : 0.0f;
  return true;
}

struct QuantJob {
  const uint16_t* src;  // slab base, [tokens][C]
  uint32_t C;
  uint32_t r0, r1;  // rows of the group
  KvDtype dt;
  float qmax;
  uint8_t* codes;        // [tokens][C] one byte per value
  const Params* params;  // per channel
};

struct ErrAcc {
  double se = 0, sx = 0, maxe = 0;
};

// Scalar reference for channels [c0, c1).
bool minmax_scalar(const QuantJob& j, uint32_t c0, uint32_t c1, float* mn, float* mx) {
  bool bad = false;
  for (uint32_t c = c0; c < c1; ++c) mn[c] = INFINITY, mx[c] = -INFINITY;
  for (uint32_t r = j.r0; r < j.r1; ++r) {
    const uint16_t* row = j.src + static_cast<size_t>(r) * j.C;
    for (uint32_t c = c0; c < c1; ++c) {
      bad |= nonfinite16(row[c], j.dt);
      const float x = load_f32(row + c, j.dt);
      mn[c] = std::min(mn[c], x);
      mx[c] = std::max(mx[c], x);
    }
  }
  return !bad;
}

void quant_scalar(const QuantJob& j, uint32_t c0, uint32_t c1, ErrAcc* e) {
  for (uint32_t r = j.r0; r < j.r1; ++r) {
    const uint16_t* row = j.src + static_cast<size_t>(r) * j.C;
    uint8_t* out = j.codes + static_cast<size_t>(r) * j.C;
    for (uint32_t c = c0; c < c1; ++c) {
      const Params& p = j.params[c];
      const float x = load_f32(row + c, j.dt);
      float t = std::nearbyint((x - p.zero) * p.inv);
      t = std::min(std::max(t, 0.0f), j.qmax);
      out[c] = static_cast<uint8_t>(t);
      const float y = t * p.scale + p.zero;
      const double d = static_cast<double>(x) - static_cast<double>(y);
      e->se += d * d;
      e->sx += static_cast<double>(x) * x;
      e->maxe = std::max(e->maxe, std::fabs(d));
    }
  }
}

void dequant_scalar(const uint8_t* codes, uint32_t C, uint32_t r0, uint32_t r1, uint32_t c0,
                    uint32_t c1, const Params* params, KvDtype dt, uint16_t* out) {
  for (uint32_t r = r0; r < r1; ++r)
    for (uint32_t c = c0; c < c1; ++c) {
      const float q = static_cast<float>(codes[static_cast<size_t>(r) * C + c]);
      out[static_cast<size_t>(r) * C + c] = store_16(q * params[c].scale + params[c].zero, dt);
    }
}

// AVX-512: 16 channels per vector.
__attribute__((target("avx512f,avx512bw,f16c"))) inline __m512 load16_512(const uint16_t* p,
                                                                          KvDtype dt) {
  __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if (dt == KvDtype::kBf16)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
  return _mm512_cvtph_ps(v);
}

__attribute__((target("avx512f,avx512bw,f16c"))) bool minmax_avx512(const QuantJob& j, uint32_t c0,
                                                                    uint32_t c1, float* mn,
                                                                    float* mx) {
  const __m256i expm = _mm256_set1_epi16(j.dt == KvDtype::kBf16 ? 0x7f80 : 0x7c00);
  __m256i bad = _mm256_setzero_si256();
  for (uint32_t c = c0; c + 16 <= c1; c += 16) {
    __m512 vmn = _mm512_set1_ps(INFINITY), vmx = _mm512_set1_ps(-INFINITY);
    for (uint32_t r = j.r0; r < j.r1; ++r) {
      const uint16_t* p = j.src + static_cast<size_t>(r) * j.C + c;
      __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      bad = _mm256_or_si256(bad, _mm256_cmpeq_epi16(_mm256_and_si256(raw, expm), expm));
      __m512 x = load16_512(p, j.dt);
      vmn = _mm512_min_ps(vmn, x);
      vmx = _mm512_max_ps(vmx, x);
    }
    _mm512_storeu_ps(mn + c, vmn);
    _mm512_storeu_ps(mx + c, vmx);
  }
  return _mm256_testz_si256(bad, bad);
}

__attribute__((target("avx512f,avx512bw,f16c"))) void quant_avx512(const QuantJob& j, uint32_t c0,
                                                                   uint32_t c1, ErrAcc* e) {
  const __m512i zero_i = _mm512_setzero_si512(),
                qmax_i = _mm512_set1_epi32(static_cast<int>(j.qmax));
  __m512 se = _mm512_setzero_ps(), sx = _mm512_setzero_ps(), mxe = _mm512_setzero_ps();
  for (uint32_t c = c0; c + 16 <= c1; c += 16) {
    alignas(64) float zs[16], ss[16], is[16];
    for (int k = 0; k < 16; ++k)
      zs[k] = j.params[c + k].zero, ss[k] = j.params[c + k].scale, is[k] = j.params[c + k].inv;
    const __m512 vz = _mm512_load_ps(zs), vs = _mm512_load_ps(ss), vi = _mm512_load_ps(is);
    for (uint32_t r = j.r0; r < j.r1; ++r) {
      const size_t off = static_cast<size_t>(r) * j.C + c;
      const __m512 x = load16_512(j.src + off, j.dt);
      __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(x, vz), vi));  // RNE
      q = _mm512_min_epi32(_mm512_max_epi32(q, zero_i), qmax_i);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(j.codes + off), _mm512_cvtepi32_epi8(q));
      const __m512 y = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(q), vs), vz);
      const __m512 d = _mm512_sub_ps(x, y);
      se = _mm512_add_ps(se, _mm512_mul_ps(d, d));
      sx = _mm512_add_ps(sx, _mm512_mul_ps(x, x));
      mxe = _mm512_max_ps(mxe, _mm512_abs_ps(d));
    }
  }
  e->se += _mm512_reduce_add_ps(se);
  e->sx += _mm512_reduce_add_ps(sx);
  e->maxe = std::max<double>(e->maxe, _mm512_reduce_max_ps(mxe));
}

__attribute__((target("avx512f,avx512bw,f16c"))) void dequant_avx512(
    const uint8_t* codes, uint32_t C, uint32_t r0, uint32_t r1, uint32_t c0, uint32_t c1,
    const Params* params, KvDtype dt, uint16_t* out) {
  for (uint32_t c = c0; c + 16 <= c1; c += 16) {
    alignas(64) float zs[16], ss[16];
    for (int k = 0; k < 16; ++k) zs[k] = params[c + k].zero, ss[k] = params[c + k].scale;
    const __m512 vz = _mm512_load_ps(zs), vs = _mm512_load_ps(ss);
    for (uint32_t r = r0; r < r1; ++r) {
      const size_t off = static_cast<size_t>(r) * C + c;
      const __m512i q =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + off)));
      const __m512 y = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(q), vs), vz);
      __m256i h;
      if (dt == KvDtype::kBf16) {
        // Round to nearest even in integer arithmetic, as f32_to_bf16 does (no NaN here).
        __m512i b = _mm512_castps_si512(y);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
        b = _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
        h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(b, 16));
      } else {
        h = _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + off), h);
    }
  }
}

// AVX2: 8 channels per vector.
__attribute__((target("avx2,f16c"))) inline __m256 load8_256(const uint16_t* p, KvDtype dt) {
  __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (dt == KvDtype::kBf16)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
  return _mm256_cvtph_ps(v);
}

__attribute__((target("avx2,f16c"))) bool minmax_avx2(const QuantJob& j, uint32_t c0, uint32_t c1,
                                                      float* mn, float* mx) {
  const __m128i expm = _mm_set1_epi16(j.dt == KvDtype::kBf16 ? 0x7f80 : 0x7c00);
  __m128i bad = _mm_setzero_si128();
  for (uint32_t c = c0; c + 8 <= c1; c += 8) {
    __m256 vmn = _mm256_set1_ps(INFINITY), vmx = _mm256_set1_ps(-INFINITY);
    for (uint32_t r = j.r0; r < j.r1; ++r) {
      const uint16_t* p = j.src + static_cast<size_t>(r) * j.C + c;
      __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      bad = _mm_or_si128(bad, _mm_cmpeq_epi16(_mm_and_si128(raw, expm), expm));
      __m256 x = load8_256(p, j.dt);
      vmn = _mm256_min_ps(vmn, x);
      vmx = _mm256_max_ps(vmx, x);
    }
    _mm256_storeu_ps(mn + c, vmn);
    _mm256_storeu_ps(mx + c, vmx);
  }
  return _mm_testz_si128(bad, bad);
}

__attribute__((target("avx2,f16c"))) inline void store8_codes(uint8_t* dst, __m256i q) {
  const __m256i p16 = _mm256_packus_epi32(q, q);
  const __m256i p8 = _mm256_packus_epi16(p16, p16);
  const uint32_t lo = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128(p8)));
  const uint32_t hi = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(p8, 1)));
  const uint64_t v = lo | (static_cast<uint64_t>(hi) << 32);
  std::memcpy(dst, &v, 8);
}

__attribute__((target("avx2,f16c"))) void quant_avx2(const QuantJob& j, uint32_t c0, uint32_t c1,
                                                     ErrAcc* e) {
  const __m256i zero_i = _mm256_setzero_si256(),
                qmax_i = _mm256_set1_epi32(static_cast<int>(j.qmax));
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 se = _mm256_setzero_ps(), sx = _mm256_setzero_ps(), mxe = _mm256_setzero_ps();
  for (uint32_t c = c0; c + 8 <= c1; c += 8) {
    alignas(32) float zs[8], ss[8], is[8];
    for (int k = 0; k < 8; ++k)
      zs[k] = j.params[c + k].zero, ss[k] = j.params[c + k].scale, is[k] = j.params[c + k].inv;
    const __m256 vz = _mm256_load_ps(zs), vs = _mm256_load_ps(ss), vi = _mm256_load_ps(is);
    for (uint32_t r = j.r0; r < j.r1; ++r) {
      const size_t off = static_cast<size_t>(r) * j.C + c;
      const __m256 x = load8_256(j.src + off, j.dt);
      __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(x, vz), vi));
      q = _mm256_min_epi32(_mm256_max_epi32(q, zero_i), qmax_i);
      store8_codes(j.codes + off, q);
      const __m256 y = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), vs), vz);
      const __m256 d = _mm256_sub_ps(x, y);
      se = _mm256_add_ps(se, _mm256_mul_ps(d, d));
      sx = _mm256_add_ps(sx, _mm256_mul_ps(x, x));
      mxe = _mm256_max_ps(mxe, _mm256_and_ps(d, absmask));
    }
  }
  alignas(32) float a[8], b[8], m[8];
  _mm256_store_ps(a, se);
  _mm256_store_ps(b, sx);
  _mm256_store_ps(m, mxe);
  for (int k = 0; k < 8; ++k)
    e->se += a[k], e->sx += b[k], e->maxe = std::max<double>(e->maxe, m[k]);
}

__attribute__((target("avx2,f16c"))) void dequant_avx2(const uint8_t* codes, uint32_t C,
                                                       uint32_t r0, uint32_t r1, uint32_t c0,
                                                       uint32_t c1, const Params* params,
                                                       KvDtype dt, uint16_t* out) {
  for (uint32_t c = c0; c + 8 <= c1; c += 8) {
    alignas(32) float zs[8], ss[8];
    for (int k = 0; k < 8; ++k) zs[k] = params[c + k].zero, ss[k] = params[c + k].scale;
    const __m256 vz = _mm256_load_ps(zs), vs = _mm256_load_ps(ss);
    for (uint32_t r = r0; r < r1; ++r) {
      const size_t off = static_cast<size_t>(r) * C + c;
      uint64_t raw;
      std::memcpy(&raw, codes + off, 8);
      const __m256i q = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(raw)));
      const __m256 y = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), vs), vz);
      __m128i h;
      if (dt == KvDtype::kBf16) {
        __m256i b = _mm256_castps_si256(y);
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
        b = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)),
                              16);
        h = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
      } else {
        h = _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + off), h);
    }
  }
}

// One token of a value slab (kKvValuesPerToken): values [c0, c1) of a row share the
// token's scale and zero.
void dequant_row_scalar(const uint8_t* codes, uint32_t c0, uint32_t c1, Params p, KvDtype dt,
                        uint16_t* out) {
  for (uint32_t c = c0; c < c1; ++c)
    out[c] = store_16(static_cast<float>(codes[c]) * p.scale + p.zero, dt);
}

__attribute__((target("avx512f,avx512bw,f16c"))) void dequant_row_avx512(const uint8_t* codes,
                                                                         uint32_t c1, Params p,
                                                                         KvDtype dt,
                                                                         uint16_t* out) {
  const __m512 vz = _mm512_set1_ps(p.zero), vs = _mm512_set1_ps(p.scale);
  for (uint32_t c = 0; c + 16 <= c1; c += 16) {
    const __m512i q =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + c)));
    const __m512 y = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(q), vs), vz);
    __m256i h;
    if (dt == KvDtype::kBf16) {
      __m512i b = _mm512_castps_si512(y);
      __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
      b = _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
      h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(b, 16));
    } else {
      h = _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c), h);
  }
}

__attribute__((target("avx2,f16c"))) void dequant_row_avx2(const uint8_t* codes, uint32_t c1,
                                                           Params p, KvDtype dt, uint16_t* out) {
  const __m256 vz = _mm256_set1_ps(p.zero), vs = _mm256_set1_ps(p.scale);
  for (uint32_t c = 0; c + 8 <= c1; c += 8) {
    uint64_t raw;
    std::memcpy(&raw, codes + c, 8);
    const __m256i q = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(raw)));
    const __m256 y = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), vs), vz);
    __m128i h;
    if (dt == KvDtype::kBf16) {
      __m256i b = _mm256_castps_si256(y);
      __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
      b = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)),
                            16);
      h = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    } else {
      h = _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c), h);
  }
}

// int4 codes, two a byte (low nibble first), back to one a byte: 32 bytes a step,
// then the rest one by one (the same codes as the scalar loop).
__attribute__((target("avx2"))) size_t unpack_nibbles_avx2(const uint8_t* packed, size_t n,
                                                           uint8_t* out) {
  const __m256i mask = _mm256_set1_epi8(0x0f);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + i));
    const __m256i lo = _mm256_and_si256(v, mask);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    // Per 128-bit lane: a = bytes 0-7 interleaved, b = bytes 8-15.
    const __m256i a = _mm256_unpacklo_epi8(lo, hi);
    const __m256i b = _mm256_unpackhi_epi8(lo, hi);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i),
                        _mm256_permute2x128_si256(a, b, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i + 32),
                        _mm256_permute2x128_si256(a, b, 0x31));
  }
  return i;
}

void unpack_nibbles(const uint8_t* packed, size_t n, uint8_t* out, SimdLevel lvl) {
  size_t i = lvl != SimdLevel::kScalar ? unpack_nibbles_avx2(packed, n, out) : 0;
  for (; i < n; ++i) out[2 * i] = packed[i] & 15, out[2 * i + 1] = packed[i] >> 4;
}

// Channels [0, simd_channels) go through the SIMD kernels, the rest through scalar.
uint32_t simd_channels(SimdLevel l, uint32_t C) {
  const uint32_t w = l == SimdLevel::kAvx512 ? 16 : l == SimdLevel::kAvx2 ? 8 : 0;
  return w ? C / w * w : 0;
}

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

// A value slab under kKvValuesPerToken: each token's channels get one scale and
// zero. The per-channel kernels do the quantizing, with every channel given the
// token's parameters, so the codes are the same at every SIMD level.
bool quantize_tokens(const QuantJob& base, uint32_t T, uint32_t cv, SimdLevel lvl, Params* prm,
                     uint8_t* params_out, ErrAcc* acc) {
  const uint32_t C = base.C;
  for (uint32_t r = 0; r < T; ++r) {
    const uint16_t* row = base.src + static_cast<size_t>(r) * C;
    float mn = INFINITY, mx = -INFINITY;
    bool bad = false;
    for (uint32_t c = 0; c < C; ++c) {
      bad |= nonfinite16(row[c], base.dt);
      const float x = load_f32(row + c, base.dt);
      mn = std::min(mn, x);
      mx = std::max(mx, x);
    }
    uint16_t zh, shh;
    Params tp;
    if (bad || !make_params(mn, mx, base.qmax, &zh, &shh, &tp)) return false;
    std::memcpy(params_out + 4 * static_cast<size_t>(r), &shh, 2);
    std::memcpy(params_out + 4 * static_cast<size_t>(r) + 2, &zh, 2);
    std::fill(prm, prm + C, tp);
    QuantJob j = base;
    j.r0 = r, j.r1 = r + 1;
    if (lvl == SimdLevel::kAvx512) quant_avx512(j, 0, cv, acc);
    if (lvl == SimdLevel::kAvx2) quant_avx2(j, 0, cv, acc);
    quant_scalar(j, cv, C, acc);
  }
  return true;
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
  const uint32_t cv = simd_channels(lvl, C);
  const float qmax = int4 ? 15.0f : 255.0f;
  ErrAcc acc;
  const auto* v = reinterpret_cast<const uint16_t*>(src);
  for (uint32_t s = 0; s < sh.slabs; ++s) {
    const uint16_t* slab = v + static_cast<size_t>(s) * T * C;
    uint8_t* codes = codes_base + (int4 ? 0 : static_cast<size_t>(s) * T * C);
    uint8_t* slab_params = out_params + lay.params_at(s);
    if (lay.per_token(s)) {
      const QuantJob j{slab, C, 0, T, p.dtype, qmax, codes, prm};
      if (!quantize_tokens(j, T, cv, lvl, prm, slab_params, &acc)) return Code::kInvalidValue;
    } else {
      for (uint32_t g = 0; g < groups; ++g) {
        QuantJob j{slab, C, g * G, std::min(T, (g + 1) * G), p.dtype, qmax, codes, prm};
        bool ok = true;
        if (lvl == SimdLevel::kAvx512) ok &= minmax_avx512(j, 0, cv, mn, mx);
        if (lvl == SimdLevel::kAvx2) ok &= minmax_avx2(j, 0, cv, mn, mx);
        ok &= minmax_scalar(j, cv, C, mn, mx);
        if (!ok) return Code::kInvalidValue;  // NaN or infinity in the input
        uint8_t* pp = slab_params + static_cast<size_t>(g) * C * 4;
        for (uint32_t c = 0; c < C; ++c) {
          uint16_t zh, shh;
          if (!make_params(mn[c], mx[c], qmax, &zh, &shh, &prm[c])) return Code::kInvalidValue;
          std::memcpy(pp + 4 * c, &shh, 2);
          std::memcpy(pp + 4 * c + 2, &zh, 2);
        }
        if (lvl == SimdLevel::kAvx512) quant_avx512(j, 0, cv, &acc);
        if (lvl == SimdLevel::kAvx2) quant_avx2(j, 0, cv, &acc);
        quant_scalar(j, cv, C, &acc);
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
  const uint32_t cv = simd_channels(lvl, C);
  for (uint32_t s = 0; s < h.slabs; ++s) {
    const uint8_t* codes = codes_in + static_cast<size_t>(s) * T * C;
    if (int4) {
      uint8_t* un = KvCodecImpl::plane(scratch);
      unpack_nibbles(codes_in + static_cast<size_t>(s) * T * C / 2, static_cast<size_t>(T) * C / 2,
                     un, lvl);
      codes = un;
    }
    uint16_t* o = out(s);
    const uint8_t* slab_params = params + lay.params_at(s);
    if (lay.per_token(s)) {
      for (uint32_t r = 0; r < T; ++r) {
        uint16_t sh, zh;
        std::memcpy(&sh, slab_params + 4 * static_cast<size_t>(r), 2);
        std::memcpy(&zh, slab_params + 4 * static_cast<size_t>(r) + 2, 2);
        const Params tp{fp16_to_f32(sh), fp16_to_f32(zh), 0.0f};
        const uint8_t* cr = codes + static_cast<size_t>(r) * C;
        uint16_t* orow = o + static_cast<size_t>(r) * C;
        if (lvl == SimdLevel::kAvx512) dequant_row_avx512(cr, cv, tp, dt, orow);
        if (lvl == SimdLevel::kAvx2) dequant_row_avx2(cr, cv, tp, dt, orow);
        dequant_row_scalar(cr, cv, C, tp, dt, orow);
      }
      continue;
    }
    for (uint32_t g = 0; g < lay.groups; ++g) {
      const uint8_t* pp = slab_params + static_cast<size_t>(g) * C * 4;
      for (uint32_t c = 0; c < C; ++c) {
        uint16_t sh, zh;
        std::memcpy(&sh, pp + 4 * c, 2);
        std::memcpy(&zh, pp + 4 * c + 2, 2);
        prm[c].scale = fp16_to_f32(sh);
        prm[c].zero = fp16_to_f32(zh);
      }
      const uint32_t r0 = g * lay.G, r1 = std::min(T, (g + 1) * lay.G);
      if (lvl == SimdLevel::kAvx512) dequant_avx512(codes, C, r0, r1, 0, cv, prm, dt, o);
      if (lvl == SimdLevel::kAvx2) dequant_avx2(codes, C, r0, r1, 0, cv, prm, dt, o);
      dequant_scalar(codes, C, r0, r1, cv, C, prm, dt, o);
    }
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
