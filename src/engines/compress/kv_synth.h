// Seeded generator of KV-cache-like tensors for tests and `dpukv bench compress`:
// per layer [tokens, heads, head_dim]; a log-normal scale per channel with 2-5% of
// channels 10-50x larger (the outlier channels of real keys), values AR(1) along
// tokens (rho 0.9) per channel. Deterministic for a seed, on any machine.
#pragma once

#include <cstdint>
#include <vector>

#include "engines/compress/kv_layout.h"

namespace dpukv {

enum class KvDataset { kRealistic, kIid };

// Fills out (elements() 16-bit values) for the dtype.
void kv_synth(KvDataset ds, KvDtype dt, const KvShape& shape, uint64_t seed,
              std::vector<uint16_t>* out);

}  // namespace dpukv
