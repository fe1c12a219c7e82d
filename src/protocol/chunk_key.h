// Chunk keys, with LMCache's semantics: a prompt is cut into chunks of N tokens
// (default 256); the key of chunk i names the model, the world size and worker
// rank, a fingerprint of the KV layout, and a prefix hash chained over the tokens
// of chunks 0..i, so two processes or machines derive the same keys for the same
// prefix and two prompts share a key only if they share the whole prefix.
//
// Hash: h_{-1} = kPrefixSeed; h_i = XXH3_64bits_withSeed(tokens of chunk i as
// little-endian int32, h_{i-1}). Documented in docs/protocols.md; golden values are
// in the tests, and changing either is a cache-format change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace dpukv {

inline constexpr uint64_t kPrefixSeed = 0x6470756b765f7631ull;  // "dpukv_v1" in ASCII; fixed

struct ChunkKey {
  uint64_t model = 0;  // xxh3-64 of the model name
  uint32_t world_size = 1;
  uint32_t rank = 0;
  uint64_t layout = 0;       // fingerprint of dtype and shape (kv_layout_fingerprint)
  uint64_t prefix_hash = 0;  // chained over the chunk's whole prefix

  friend bool operator==(const ChunkKey& a, const ChunkKey& b) {
    return a.model == b.model && a.world_size == b.world_size && a.rank == b.rank &&
           a.layout == b.layout && a.prefix_hash == b.prefix_hash;
  }
  uint64_t hash() const;
};
static_assert(sizeof(ChunkKey) == 32, "keys travel on the wire and in the disk log");

// A key as logs name it: "model:prefix_hash", 16 hex digits each (the two fields that
// tell chunks apart; rank and layout are the same across one instance's logs).
struct ChunkKeyText {
  char text[34];
  const char* c_str() const { return text; }
};
ChunkKeyText key_text(const ChunkKey& k);

// What every key of one serving instance shares.
struct KeyContext {
  uint64_t model = 0;
  uint32_t world_size = 1;
  uint32_t rank = 0;
  uint64_t layout = 0;
};

uint64_t model_id(std::string_view model_name);
// E.g. kv_layout_fingerprint("bf16", 32, 8, 128).
uint64_t kv_layout_fingerprint(std::string_view dtype, uint32_t layers, uint32_t kv_heads,
                               uint32_t head_dim);

// Keys of the chunks of a token sequence. The last partial chunk is keyed only with
// include_partial (as LMCache's save_unfull_chunk).
void chunk_keys(const KeyContext& ctx, const int32_t* tokens, size_t n, uint32_t chunk_tokens,
                bool include_partial, std::vector<ChunkKey>* out);

// Keys from external block ids that are already prefix-chained (vLLM block hashes,
// the Mooncake traces' hash_ids): the id itself is the prefix hash, mixed once.
ChunkKey key_from_block_id(const KeyContext& ctx, uint64_t block_id);

}  // namespace dpukv
