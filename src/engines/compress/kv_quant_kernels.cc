#include "engines/compress/kv_quant_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engines/compress/fp16.h"

namespace dpukv::kv_quant {
namespace {

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

// 16 floats back to 16-bit values: bf16 rounds to nearest even in integer
// arithmetic, as f32_to_bf16 does (no NaN here); fp16 by F16C.
__attribute__((target("avx512f,avx512bw,f16c"))) inline __m256i store16_512(__m512 y, KvDtype dt) {
  if (dt != KvDtype::kBf16)
    return _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512i b = _mm512_castps_si512(y);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  b = _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(b, 16));
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
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + off), store16_512(y, dt));
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

// 8 floats back to 16-bit values, as store16_512.
__attribute__((target("avx2,f16c"))) inline __m128i store8_256(__m256 y, KvDtype dt) {
  if (dt != KvDtype::kBf16)
    return _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256i b = _mm256_castps_si256(y);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  b = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
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
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + off), store8_256(y, dt));
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
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c), store16_512(y, dt));
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
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c), store8_256(y, dt));
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

}  // namespace

uint32_t simd_channels(SimdLevel l, uint32_t C) {
  const uint32_t w = l == SimdLevel::kAvx512 ? 16 : l == SimdLevel::kAvx2 ? 8 : 0;
  return w ? C / w * w : 0;
}

bool quantize_group(const QuantJob& j, SimdLevel lvl, float* mn, float* mx, Params* prm,
                    uint8_t* params_out, ErrAcc* acc) {
  const uint32_t C = j.C, cv = simd_channels(lvl, C);
  bool ok = true;
  if (lvl == SimdLevel::kAvx512) ok &= minmax_avx512(j, 0, cv, mn, mx);
  if (lvl == SimdLevel::kAvx2) ok &= minmax_avx2(j, 0, cv, mn, mx);
  ok &= minmax_scalar(j, cv, C, mn, mx);
  if (!ok) return false;  // NaN or infinity in the input
  for (uint32_t c = 0; c < C; ++c) {
    uint16_t zh, shh;
    if (!make_params(mn[c], mx[c], j.qmax, &zh, &shh, &prm[c])) return false;
    std::memcpy(params_out + 4 * c, &shh, 2);
    std::memcpy(params_out + 4 * c + 2, &zh, 2);
  }
  if (lvl == SimdLevel::kAvx512) quant_avx512(j, 0, cv, acc);
  if (lvl == SimdLevel::kAvx2) quant_avx2(j, 0, cv, acc);
  quant_scalar(j, cv, C, acc);
  return true;
}

// A value slab under kKvValuesPerToken: each token's channels get one scale and
// zero. The per-channel kernels do the quantizing, with every channel given the
// token's parameters, so the codes are the same at every SIMD level.
bool quantize_tokens(const QuantJob& base, uint32_t T, SimdLevel lvl, Params* prm,
                     uint8_t* params_out, ErrAcc* acc) {
  const uint32_t C = base.C;
  const uint32_t cv = simd_channels(lvl, C);
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

void dequantize_group(const uint8_t* codes, uint32_t C, uint32_t r0, uint32_t r1,
                      const uint8_t* params, Params* prm, SimdLevel lvl, KvDtype dt,
                      uint16_t* out) {
  for (uint32_t c = 0; c < C; ++c) {
    uint16_t sh, zh;
    std::memcpy(&sh, params + 4 * c, 2);
    std::memcpy(&zh, params + 4 * c + 2, 2);
    prm[c].scale = fp16_to_f32(sh);
    prm[c].zero = fp16_to_f32(zh);
  }
  const uint32_t cv = simd_channels(lvl, C);
  if (lvl == SimdLevel::kAvx512) dequant_avx512(codes, C, r0, r1, 0, cv, prm, dt, out);
  if (lvl == SimdLevel::kAvx2) dequant_avx2(codes, C, r0, r1, 0, cv, prm, dt, out);
  dequant_scalar(codes, C, r0, r1, cv, C, prm, dt, out);
}

void dequantize_tokens(const uint8_t* codes, uint32_t T, uint32_t C, const uint8_t* params,
                       SimdLevel lvl, KvDtype dt, uint16_t* out) {
  const uint32_t cv = simd_channels(lvl, C);
  for (uint32_t r = 0; r < T; ++r) {
    uint16_t sh, zh;
    std::memcpy(&sh, params + 4 * static_cast<size_t>(r), 2);
    std::memcpy(&zh, params + 4 * static_cast<size_t>(r) + 2, 2);
    const Params tp{fp16_to_f32(sh), fp16_to_f32(zh), 0.0f};
    const uint8_t* cr = codes + static_cast<size_t>(r) * C;
    uint16_t* orow = out + static_cast<size_t>(r) * C;
    if (lvl == SimdLevel::kAvx512) dequant_row_avx512(cr, cv, tp, dt, orow);
    if (lvl == SimdLevel::kAvx2) dequant_row_avx2(cr, cv, tp, dt, orow);
    dequant_row_scalar(cr, cv, C, tp, dt, orow);
  }
}

void unpack_nibbles(const uint8_t* packed, size_t n, uint8_t* out, SimdLevel lvl) {
  size_t i = lvl != SimdLevel::kScalar ? unpack_nibbles_avx2(packed, n, out) : 0;
  for (; i < n; ++i) out[2 * i] = packed[i] & 15, out[2 * i + 1] = packed[i] >> 4;
}

}  // namespace dpukv::kv_quant
