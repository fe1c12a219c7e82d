// The directory's names and values in Redis, written and read in one place:
//
//   PREFIX:nodes     sorted set: node id (16 hex) -> lease deadline (ms, wall clock)
//   PREFIX:n:NODE    the node's peer description
//   PREFIX:c:CHUNK   string ",NODE,NODE,": the chunk's holders
//   PREFIX:v:CHUNK   the chunk's remote-tier value (remote_tier.h)
//   PREFIX:events    channel of edits (directory_event.h)
//
// CHUNK is the key's 32 bytes (model, prefix hash, world size << 32 | rank, layout;
// little endian), binary, because Redis parses and hashes every byte of 64 keys per
// lookup. NODE is 16 lowercase hex digits.
//
// Everything read back is untrusted (anyone who can write to the Redis can put
// anything there): the parsers take any bytes and say false for what this code
// did not write. Pure functions over the prefix; no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "protocol/chunk_key.h"

namespace dpukv {

class DirectoryKeys {
 public:
  // Holders one chunk may list; a longer list is not one this code wrote.
  static constexpr size_t kMaxHolders = 256;

  explicit DirectoryKeys(std::string prefix) : prefix_(std::move(prefix)) {}
  const std::string& prefix() const { return prefix_; }

  // PREFIX:c:CHUNK and PREFIX:v:CHUNK are this long.
  size_t chunk_key_size() const { return prefix_.size() + 3 + 32; }
  // Writes PREFIX:kind:CHUNK (chunk_key_size() bytes) at p; kind 'c' or 'v'.
  void format(char* p, char kind, const ChunkKey& k) const;
  std::string holders_key(const ChunkKey& k) const;  // PREFIX:c:CHUNK
  std::string value_key(const ChunkKey& k) const;    // PREFIX:v:CHUNK
  std::string node_key(uint64_t node) const;         // PREFIX:n:NODE
  std::string nodes_key() const { return prefix_ + ":nodes"; }
  std::string events_channel() const { return prefix_ + ":events"; }
  std::string holders_pattern() const { return prefix_ + ":c:*"; }  // SCAN MATCH
  // A PREFIX:c:CHUNK name back into its key; false for any other name.
  bool parse_holders_key(const char* p, size_t len, ChunkKey* k) const;

  // Node ids as 16 lowercase hex digits (no snprintf: a 64-key lookup formats
  // 256 of these, and snprintf cost as much as the Redis round trip).
  static void put_hex16(char* p, uint64_t v);
  static std::string hex16(uint64_t v);
  static bool parse_hex16(const char* s, size_t n, uint64_t* out);
  // ",ID,ID,": 16 hex and a comma each, at most kMaxHolders, each once. Appends
  // them to out; false (out as it was) for a value not of this form.
  static bool parse_holders(const char* s, size_t len, std::vector<uint64_t>* out);

 private:
  std::string prefix_;
};

}  // namespace dpukv
