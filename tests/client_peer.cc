// A real client process for the agent tests. Exit 0 when its own checks pass.
// Usage: client_peer SOCKET store-retrieve SEED COUNT | stream SEED
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client/client.h"
#include "runtime/log.h"

using namespace dpukv;

static uint8_t pattern(uint64_t seed, uint64_t i) {
  return static_cast<uint8_t>((seed * 2654435761u) ^ (i * 131) ^ (i >> 9));
}

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  log_set_level(LogSource::kLib, LogLevel::kError);
  ClientOptions o;
  o.socket_path = argv[1];
  o.connect_timeout_ms = 10000;
  std::unique_ptr<Client> c;
  if (!Client::connect(o, &c).ok()) return 3;
  const std::string role = argv[2];
  const uint64_t seed = std::strtoull(argv[3], nullptr, 10);
  Staging s;
  if (!c->alloc_staging(32 << 20, &s).ok()) return 4;
  const KeyContext ctx{model_id("test-model"), 1, 0, 0};
  if (role == "store-retrieve") {
    const uint32_t n = static_cast<uint32_t>(std::atoi(argv[4]));
    std::vector<ChunkKey> keys;
    std::vector<uint64_t> offs, lens;
    uint64_t off = 0;
    for (uint32_t i = 0; i < n; ++i) {
      keys.push_back(key_from_block_id(ctx, seed * 1000000 + i));
      const uint64_t len = 4096 + (i * 7919 % 200000);
      offs.push_back(off);
      lens.push_back(len);
      for (uint64_t k = 0; k < len; ++k) s.data[off + k] = pattern(seed + i, k);
      off += (len + 63) / 64 * 64;
    }
    std::vector<Status> st(n);
    if (!c->store(s, keys.data(), offs.data(), lens.data(), n, st.data()).ok()) return 5;
    if (c->lookup(keys.data(), n, false) != n) return 6;
    std::memset(s.data, 0, off);
    if (!c->retrieve(s, keys.data(), offs.data(), lens.data(), n, st.data()).ok()) return 7;
    for (uint32_t i = 0; i < n; ++i)
      for (uint64_t k = 0; k < lens[i]; ++k)
        if (s.data[offs[i] + k] != pattern(seed + i, k)) return 8;
    return 0;
  }
  if (role == "stream") {  // stores forever (until killed) in big batches
    std::vector<ChunkKey> keys(64);
    std::vector<uint64_t> offs(64), lens(64, 256 << 10);
    for (uint32_t i = 0; i < 64; ++i) offs[i] = i * (256 << 10);
    std::printf("streaming\n");
    std::fflush(stdout);
    for (uint64_t round = 0;; ++round) {
      for (uint32_t i = 0; i < 64; ++i)
        keys[i] = key_from_block_id(ctx, seed * 1000000 + round * 64 + i);
      (void)c->store(s, keys.data(), offs.data(), lens.data(), 64, nullptr);
    }
  }
  return 2;
}
