// What a KV-cache tensor is, as the KV codecs and their callers see it: the 16-bit
// element type and the shape of the independent [tokens, channels] matrices.
#pragma once

#include <cstdint>

namespace dpukv {

enum class KvDtype : uint8_t { kBf16 = 1, kFp16 = 2 };

struct KvShape {
  uint32_t slabs = 1;  // layers x (K, V): independent [tokens, channels] matrices
  uint32_t tokens = 256;
  uint32_t channels = 1024;  // heads x head_dim
  uint64_t elements() const { return static_cast<uint64_t>(slabs) * tokens * channels; }
};

}  // namespace dpukv
