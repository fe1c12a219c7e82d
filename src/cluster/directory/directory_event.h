// What a node publishes on the directory's event channel (PREFIX:events) each time
// it edits its entries: the chunks it now holds and no longer holds. Subscribers
// keep a replica of the directory from these, so that a lookup needs no round trip.
// Anyone who can reach the cluster's Redis can publish: every event is checked.
//
//   Header (16 bytes): magic "DKVE", version 1, count, node id
//   count entries (40 bytes): op (1: holds, 2: no longer holds), 7 zero bytes, key
#pragma once

#include <cstdint>
#include <string>

#include "protocol/chunk_key.h"
#include "runtime/status.h"

namespace dpukv::directory_event {

constexpr uint32_t kMagic = 0x45564b44;  // "DKVE"
constexpr uint16_t kVersion = 1;
constexpr uint16_t kMaxEntries = 1024;
enum class Op : uint8_t { kHolds = 1, kDrops = 2 };

struct Header {
  uint32_t magic;
  uint16_t version;
  uint16_t count;
  uint64_t node;
};
static_assert(sizeof(Header) == 16, "an event header travels between hosts");

struct Entry {
  uint8_t op;
  uint8_t zero[7];
  ChunkKey key;
};
static_assert(sizeof(Entry) == 40, "an event entry travels between hosts");

// Appends an entry to `msg` (started with a header by begin()).
void begin(uint64_t node, std::string* msg);
void append(Op op, const ChunkKey& key, std::string* msg);
bool full(const std::string& msg);

// Checks a message: INVALID_VALUE unless the header, the count, the length, every
// op and every padding byte are what they must be. On success *header and
// *entries (count of them, unaligned: memcpy each) point into msg.
Status parse(const uint8_t* msg, size_t len, Header* header, const uint8_t** entries);

}  // namespace dpukv::directory_event
