// What the directory reads back from Redis (anyone who reaches the cluster's Redis
// can write there): a holder list, and a key name from a SCAN. Any bytes are
// refused or parsed into what formats back to exactly those bytes.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cluster/directory/directory_keys.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using dpukv::DirectoryKeys;
  const char* s = reinterpret_cast<const char*>(data);
  std::vector<uint64_t> nodes = {7};  // parse_holders appends, or leaves it as it was
  if (DirectoryKeys::parse_holders(s, size, &nodes)) {
    if (nodes.size() < 1 || nodes.size() - 1 > DirectoryKeys::kMaxHolders) abort();
    // Formatted back (duplicates dropped), every id is one of the input's.
    for (size_t i = 1; i < nodes.size(); ++i) {
      const std::string id = "," + DirectoryKeys::hex16(nodes[i]) + ",";
      if (std::string(s, size).find(id) == std::string::npos) abort();
    }
  } else if (nodes.size() != 1 || nodes[0] != 7) {
    abort();
  }
  const DirectoryKeys keys("dpukv");
  dpukv::ChunkKey k;
  if (keys.parse_holders_key(s, size, &k)) {
    std::string back(keys.chunk_key_size(), '\0');
    keys.format(back.data(), 'c', k);
    if (back != std::string(s, size)) abort();
  }
  return 0;
}
