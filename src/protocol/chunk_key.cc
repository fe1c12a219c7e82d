#include "protocol/chunk_key.h"

#include "protocol/tenant_key.h"

// XXH3 compiled into this file: a key is 32 bytes, hashed on every table probe,
// and the library's call and length dispatch cost more than the hash (same digest).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace dpukv {

uint64_t ChunkKey::hash() const {
  return XXH3_64bits(this, sizeof(*this));
}

ChunkKeyText key_text(const ChunkKey& k) {
  ChunkKeyText t;
  std::snprintf(t.text, sizeof(t.text), "%016llx:%016llx", static_cast<unsigned long long>(k.model),
                static_cast<unsigned long long>(k.prefix_hash));
  return t;
}

uint64_t model_id(std::string_view name) {
  return XXH3_64bits(name.data(), name.size());
}

uint64_t kv_layout_fingerprint(std::string_view dtype, uint32_t layers, uint32_t kv_heads,
                               uint32_t head_dim) {
  std::string s(dtype);
  s += ":" + std::to_string(layers) + ":" + std::to_string(kv_heads) + ":" +
       std::to_string(head_dim);
  return XXH3_64bits(s.data(), s.size());
}

void chunk_keys(const KeyContext& ctx, const int32_t* tokens, size_t n, uint32_t chunk_tokens,
                bool include_partial, std::vector<ChunkKey>* out) {
  out->clear();
  if (chunk_tokens == 0) return;
  uint64_t h = kPrefixSeed;
  for (size_t i = 0; i < n; i += chunk_tokens) {
    const size_t len = n - i < chunk_tokens ? n - i : chunk_tokens;
    if (len < chunk_tokens && !include_partial) break;
    // Tokens hash as little-endian int32 (this code runs on little-endian hosts).
    h = XXH3_64bits_withSeed(tokens + i, len * sizeof(int32_t), h);
    out->push_back(ChunkKey{ctx.model, ctx.world_size, ctx.rank, ctx.layout, h});
  }
}

ChunkKey key_from_block_id(const KeyContext& ctx, uint64_t block_id) {
  return ChunkKey{ctx.model, ctx.world_size, ctx.rank, ctx.layout,
                  XXH3_64bits_withSeed(&block_id, sizeof(block_id), kPrefixSeed)};
}

uint32_t tenant_tag(std::string_view tenant_name) {
  const uint32_t t = static_cast<uint32_t>(
      XXH3_64bits_withSeed(tenant_name.data(), tenant_name.size(), 0x74656e616e74));
  return t != 0 ? t : 1;
}

}  // namespace dpukv
