// The key the agent keeps: a client's ChunkKey with its tenant folded in, so that
// two tenants never share a chunk however they choose their keys (docs/protocols.md,
// "Tenants"). The tenant's tag takes the world_size field, and world size and rank
// share the rank field, 16 bits each; every other field is the client's. The map
// is one-to-one: the agent gives clients (events) their own keys back, and a
// key of one tag never equals a key of another. Agents of a cluster derive the
// same tag from the same tenant name, so the directory, peer reads and the remote
// tier carry the namespace with the key.
#pragma once

#include <cstdint>
#include <string_view>

#include "protocol/chunk_key.h"

namespace dpukv {

inline constexpr uint32_t kMaxKeyWorldSize = 0xFFFF;  // world sizes and ranks a key may name

// The tag of a tenant name: 32 bits of its XXH3-64, never 0. Names, not uid
// numbers, so that agents on other machines agree.
uint32_t tenant_tag(std::string_view tenant_name);

// False for a key whose world size or rank does not fit 16 bits (or a rank not
// below its world size): such a key is refused, never folded.
inline bool tenant_scope(const ChunkKey& client, uint32_t tag, ChunkKey* kept) {
  if (client.world_size == 0 || client.world_size > kMaxKeyWorldSize ||
      client.rank >= client.world_size)
    return false;
  const uint32_t ranks = (client.world_size << 16) | client.rank;
  *kept = client;  // kept may be client itself
  kept->world_size = tag;
  kept->rank = ranks;
  return true;
}

inline uint32_t key_tenant(const ChunkKey& kept) {
  return kept.world_size;
}

// The client's key again.
inline ChunkKey tenant_unscope(const ChunkKey& kept) {
  ChunkKey k = kept;
  k.world_size = kept.rank >> 16;
  k.rank = kept.rank & 0xFFFF;
  return k;
}

}  // namespace dpukv
