#include "engines/compress/kv_synth.h"

#include <cmath>

#include "engines/compress/fp16.h"

namespace dpukv {
namespace {

// SplitMix64 and Box-Muller: fully specified, so every platform makes the same data.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) / 9007199254740992.0; }
  double normal() {
    double u = uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }
};

uint16_t encode(KvDtype dt, double v) {
  return dt == KvDtype::kBf16 ? f32_to_bf16(static_cast<float>(v))
                              : f32_to_fp16(static_cast<float>(v));
}

}  // namespace

void kv_synth(KvDataset ds, KvDtype dt, const KvShape& shape, uint64_t seed,
              std::vector<uint16_t>* out) {
  out->resize(shape.elements());
  Rng rng{seed};
  const uint32_t C = shape.channels, T = shape.tokens;
  std::vector<double> scale(C), state(C);
  for (uint32_t s = 0; s < shape.slabs; ++s) {
    uint16_t* slab = out->data() + static_cast<uint64_t>(s) * T * C;
    if (ds == KvDataset::kIid) {
      for (uint64_t i = 0; i < static_cast<uint64_t>(T) * C; ++i)
        slab[i] = encode(dt, rng.normal());
      continue;
    }
    const double outlier_frac = 0.02 + 0.03 * rng.uniform();
    for (uint32_t c = 0; c < C; ++c) {
      scale[c] = std::exp(0.5 * rng.normal());  // log-normal, sigma 0.5
      if (rng.uniform() < outlier_frac) scale[c] *= 10.0 + 40.0 * rng.uniform();
      state[c] = rng.normal();
    }
    const double rho = 0.9, innov = std::sqrt(1.0 - rho * rho);
    for (uint32_t t = 0; t < T; ++t) {
      for (uint32_t c = 0; c < C; ++c) {
        if (t > 0) state[c] = rho * state[c] + innov * rng.normal();
        slab[static_cast<uint64_t>(t) * C + c] = encode(dt, scale[c] * state[c]);
      }
    }
  }
}

}  // namespace dpukv
