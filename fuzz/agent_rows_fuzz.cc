// Fuzzes a RETRIEVE_ROWS body as the agent receives it: a count (the header's, here
// the input's first 4 bytes) and the bytes after the header. A body the check takes
// must hold exactly the keys and row offsets it announces, with every field in its
// range; the agent then reads only those, and checks each row against its map.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "protocol/agent_wire.h"

using namespace dpukv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t count;
  std::memcpy(&count, data, 4);
  const uint8_t* body = data + 4;
  const size_t len = size - 4;
  agent::RowsHeader h;
  uint64_t rows = 0;
  if (!agent::rows_body_valid(count, body, len, &h, &rows)) return 0;
  if (count == 0 || h.row_bytes == 0 || h.rows_per_chunk == 0 ||
      h.rows_per_chunk > agent::kMaxRowsPerChunk || h.last_rows == 0 ||
      h.last_rows > h.rows_per_chunk || h.reserved != 0)
    abort();
  if (rows != static_cast<uint64_t>(count - 1) * h.rows_per_chunk + h.last_rows) abort();
  if (len != sizeof(h) + static_cast<uint64_t>(count) * sizeof(ChunkKey) + rows * 8) abort();
  // The agent's check of each row against a map (overflow-safe, as agent.cc's).
  constexpr uint64_t kMap = 1 << 20;
  const uint8_t* offs = body + sizeof(h) + static_cast<size_t>(count) * sizeof(ChunkKey);
  uint64_t inside = 0;
  for (uint64_t r = 0; r < rows; ++r) {
    uint64_t off;
    std::memcpy(&off, offs + r * 8, 8);
    if (off <= kMap && h.row_bytes <= kMap - off) {
      if (off + h.row_bytes > kMap) abort();
      ++inside;
    }
  }
  asm volatile("" : : "r"(inside));
  return 0;
}
