// The replay's inputs: the model presets, a Mooncake-format trace (JSON lines of
// timestamp, input_length, hash_ids) read with every field checked, block contents
// that are a function of the block id (so every retrieve is checked), and the exact
// LRU the agents' hit ratio is compared with.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/status.h"

namespace dpukv::replay {

// KV bytes per token of each preset (bf16 unless noted), and an assumed prefill
// throughput used only to estimate the compute a hit saves. The throughputs are
// round figures for one 8xH100 node running the model with vLLM-class kernels;
// they are assumptions, stated in docs/replay.md, not measurements.
struct Preset {
  const char* name;
  uint64_t bytes_per_token;
  double prefill_tokens_per_s;
};
inline constexpr Preset kPresets[] = {
    {"llama-3.1-8b", 32ull * 8 * 128 * 2 * 2, 40000},  // 131,072 B/token
    {"qwen2.5-7b", 28ull * 4 * 128 * 2 * 2, 45000},    // 57,344 B/token
    {"llama-3.1-70b", 80ull * 8 * 128 * 2 * 2, 8000},  // 327,680 B/token
    {"deepseek-v3", 61ull * (512 + 64) * 2, 6000},     // MLA latent + rope key: 70,272 B/token
};

// The preset of that name, or null.
const Preset* find_preset(const std::string& name);

struct Request {
  double ts_ms;
  uint32_t input_length;
  std::vector<uint64_t> ids;
};

// Reads the trace's first `limit` requests (0: all); a bad line is refused with its
// number in *err.
Status load_trace(const std::string& path, uint64_t limit, std::vector<Request>* out,
                  std::string* err);

void fill_block(uint64_t id, uint8_t* p, uint64_t len);
bool check_block(uint64_t id, const uint8_t* p, uint64_t len);

// Exact LRU over block ids, with the replay's access pattern: a present block moves
// to the front, a missing one is inserted (evicting the least recent).
class LruSim {
 public:
  explicit LruSim(uint64_t cap) : cap_(cap) {}
  // Returns the request's prefix hits (leading present blocks).
  uint32_t access(const std::vector<uint64_t>& ids) {
    uint32_t hits = 0;
    bool prefix = true;
    for (uint64_t id : ids) {
      auto it = pos_.find(id);
      if (it != pos_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        if (prefix) ++hits;
      } else {
        prefix = false;
        lru_.push_front(id);
        pos_[id] = lru_.begin();
        if (lru_.size() > cap_) {
          pos_.erase(lru_.back());
          lru_.pop_back();
        }
      }
    }
    return hits;
  }

 private:
  uint64_t cap_;
  std::list<uint64_t> lru_;
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> pos_;
};

}  // namespace dpukv::replay
