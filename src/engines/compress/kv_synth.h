// Seeded generator of KV-cache-like tensors for tests and `dpukv bench compress`:
// per layer [tokens, heads, head_dim]; a log-normal scale per channel with 2-5% of
// channels 10-50x larger (the outlier channels of real keys), values AR(1) along
// tokens (rho 0.9) per channel. Deterministic for a seed, on any machine.
#pragma once

#include <cstdint>
#include <vector>

namespace dpukv {

enum class KvDtype : uint8_t { kBf16 = 1, kFp16 = 2 };

struct KvShape {
  uint32_t slabs = 1;  // layers x (K, V): independent [tokens, channels] matrices
  uint32_t tokens = 256;
  uint32_t channels = 1024;  // heads x head_dim
  uint64_t elements() const { return static_cast<uint64_t>(slabs) * tokens * channels; }
};

enum class KvDataset { kRealistic, kIid };

// Fills out (elements() 16-bit values) for the dtype.
void kv_synth(KvDataset ds, KvDtype dt, const KvShape& shape, uint64_t seed,
              std::vector<uint16_t>* out);

}  // namespace dpukv
