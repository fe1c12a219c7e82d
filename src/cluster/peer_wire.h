// The control messages agents exchange to share chunks (UCX active messages; see
// UcxNode::send_control). A reader asks a holder to pin chunks and say where they
// lie in its arena, reads them one-sided, and releases them:
//
//   reader ── PIN(request, keys) ──────────────▶ holder   pins each chunk it has
//   reader ◀── PLACED(request, one entry/key) ── holder   status, offset, sizes, checksum
//   reader ── ucp_get_nbx of each placed chunk ─▶ holder's arena
//   reader ── UNPIN(keys) ─────────────────────▶ holder
//
// A prefill-to-decode transfer is the same read, started by the holder:
//
//   prefill agent ── OFFER(request, keys) ─▶ decode agent   reads them as above
//   prefill agent ◀── TAKEN(request, one status byte/key) ── decode agent
//
// Everything arrives from another host: parse_peer_message() checks magic,
// version, type, counts and lengths before anything is read from a message.
// Little-endian, fixed layout.
#pragma once

#include <cstddef>
#include <cstdint>

#include "protocol/chunk_key.h"
#include "runtime/status.h"

namespace dpukv::peer {

constexpr uint32_t kMagic = 0x53564b44;  // "DKVS"
constexpr uint16_t kVersion = 1;
constexpr uint32_t kMaxKeys = 64;  // keys per message: a PLACED reply stays under 4 KiB

enum class Type : uint16_t { kPin = 1, kPlaced = 2, kUnpin = 3, kOffer = 4, kTaken = 5 };

struct Header {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint64_t request;  // chosen by the reader, echoed in PLACED
  uint32_t count;    // keys or entries that follow
  uint32_t reserved;
};
static_assert(sizeof(Header) == 24, "travels between hosts");

struct Placed {
  uint8_t status;  // a Code: SUCCESS (pinned, read it), NOT_FOUND, ...
  uint8_t encoded;
  uint8_t reserved[6];
  uint64_t offset;  // in the holder's exposed region
  uint64_t stored;
  uint64_t size;
  uint64_t checksum;
};
static_assert(sizeof(Placed) == 40, "travels between hosts");

// A checked view of a message; keys or placed point into the message itself.
struct Message {
  Type type = Type::kPin;
  uint64_t request = 0;
  uint32_t count = 0;
  // count ChunkKeys (PIN, UNPIN, OFFER), Placed (PLACED) or status bytes (TAKEN)
  const uint8_t* items = nullptr;
  ChunkKey key(uint32_t i) const;
  Placed placed(uint32_t i) const;
  Code status(uint32_t i) const { return static_cast<Code>(items[i]); }
};

// INVALID_VALUE unless msg is exactly one well-formed message.
Status parse_peer_message(const uint8_t* msg, size_t len, Message* out);
// Writes a header for count items of type into out (sizeof(Header) bytes).
void write_header(Type type, uint64_t request, uint32_t count, uint8_t* out);
size_t message_bytes(Type type, uint32_t count);

}  // namespace dpukv::peer
