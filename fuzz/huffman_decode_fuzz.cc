// Fuzzes the Huffman decoder below the KV codecs directly: a chunk's header carries
// a CRC, so mutations of a whole chunk rarely reach the coder. Byte 0 picks the
// build (x86-64-v3 or portable), bytes 1-3 the decoded length (1 B to 1 MiB,
// so blocks of every size and the fast loop's edges are reached); the rest is the
// coded stream. A decode may fail, but never reads or writes outside its buffers
// (ASan) nor says it used more input than it had.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "engines/compress/huffman.h"

using namespace dpukv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  (void)huffman::use_portable(data[0] & 1);
  const size_t n = (data[1] | data[2] << 8 | (data[3] & 0x0f) << 16) + 1;
  // Exact sizes, so ASan sees any access past either end.
  std::vector<uint8_t> in(data + 4, data + size), out(n);
  size_t used = 0;
  if (huffman::decompress(in.data(), in.size(), out.data(), out.size(), &used).ok() &&
      used > in.size())
    abort();
  return 0;
}
