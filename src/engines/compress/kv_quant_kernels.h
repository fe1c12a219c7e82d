// The lossy KV codecs' arithmetic (kv_codec.h has the formats): asymmetric
// quantization of [tokens, channels] slabs with fp16 scales and zero points, per
// channel over a group of tokens or per token over its channels, and back, at three
// SIMD levels (scalar, AVX2, AVX-512) that give bit-identical codes and values.
// kv_codec.cc lays the parameters and codes out; these kernels only compute.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engines/compress/kv_codec.h"
#include "engines/compress/kv_layout.h"

namespace dpukv::kv_quant {

// A group's (or a token's) parameters, as decoded from fp16; inv = 1 / scale.
struct Params {
  float scale, zero, inv;
};

// What one kernel call quantizes: rows [r0, r1) of a slab of C channels.
struct QuantJob {
  const uint16_t* src;  // slab base, [tokens][C]
  uint32_t C;
  uint32_t r0, r1;  // rows of the group
  KvDtype dt;
  float qmax;
  uint8_t* codes;        // [tokens][C] one byte per value
  const Params* params;  // per channel
};

// Squared error and squared input summed over what was quantized, and the largest
// absolute error (KvCodecError).
struct ErrAcc {
  double se = 0, sx = 0, maxe = 0;
};

// Channels [0, simd_channels) go through the SIMD kernels, the rest through scalar.
uint32_t simd_channels(SimdLevel l, uint32_t C);

// One group of a slab quantized per channel (rows [j.r0, j.r1)): each channel's min
// and max, its fp16 scale and zero written to params_out (4 bytes a channel: scale,
// zero) and kept in prm, then the codes. mn, mx, prm: C entries of scratch. False
// on NaN or infinity in the input, or a range fp16 cannot hold.
bool quantize_group(const QuantJob& j, SimdLevel lvl, float* mn, float* mx, Params* prm,
                    uint8_t* params_out, ErrAcc* acc);
// A whole slab quantized per token (rows [0, T) of base): one scale and zero per
// token over its C channels, written to params_out (4 bytes a token). prm: C
// entries of scratch. False as quantize_group.
bool quantize_tokens(const QuantJob& base, uint32_t T, SimdLevel lvl, Params* prm,
                     uint8_t* params_out, ErrAcc* acc);
// Rows [r0, r1) of a slab of C channels back to 16-bit values, with the group's
// per-channel params (C * 4 bytes). prm: C entries of scratch.
void dequantize_group(const uint8_t* codes, uint32_t C, uint32_t r0, uint32_t r1,
                      const uint8_t* params, Params* prm, SimdLevel lvl, KvDtype dt, uint16_t* out);
// A slab quantized per token back to 16-bit values (T * 4 bytes of params).
void dequantize_tokens(const uint8_t* codes, uint32_t T, uint32_t C, const uint8_t* params,
                       SimdLevel lvl, KvDtype dt, uint16_t* out);
// int4 codes, two a byte (low nibble first), to one a byte.
void unpack_nibbles(const uint8_t* packed, size_t n, uint8_t* out, SimdLevel lvl);

}  // namespace dpukv::kv_quant
