#include "tools/replay/trace.h"

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

namespace dpukv::replay {

const Preset* find_preset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return &p;
  return nullptr;
}

namespace {

// Limits that keep a hostile or broken trace from taking the machine: a request
// of more blocks than this is refused with its line number.
constexpr size_t kMaxBlocksPerRequest = 16384;

inline uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

}  // namespace

Status load_trace(const std::string& path, uint64_t limit, std::vector<Request>* out,
                  std::string* err) {
  std::ifstream f(path);
  if (!f) {
    *err = "cannot open " + path;
    return Code::kNotFound;
  }
  std::string line;
  uint64_t n = 0;
  auto bad = [&](const std::string& why) {
    *err = path + ":" + std::to_string(n) + ": " + why;
    return Status(Code::kInvalidValue);
  };
  while (std::getline(f, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("hash_ids") ||
        !j["hash_ids"].is_array() || !j.contains("input_length") ||
        !j["input_length"].is_number_unsigned() || !j.contains("timestamp") ||
        !j["timestamp"].is_number())
      return bad("not a trace record (timestamp, input_length, hash_ids)");
    const double ts = j["timestamp"].get<double>();
    if (!std::isfinite(ts) || ts < 0) return bad("timestamp must be a finite number >= 0");
    if (!out->empty() && ts < out->back().ts_ms)
      return bad("timestamp " + std::to_string(ts) + " is earlier than the line before's (" +
                 std::to_string(out->back().ts_ms) + "): a trace must be in time order");
    if (j["hash_ids"].size() > kMaxBlocksPerRequest)
      return bad(std::to_string(j["hash_ids"].size()) + " hash_ids; at most " +
                 std::to_string(kMaxBlocksPerRequest) + " per request");
    if (j["input_length"].get<uint64_t>() > 512ull * (j["hash_ids"].size() + 1) ||
        (j["input_length"].get<uint64_t>() == 0 && !j["hash_ids"].empty()))
      return bad("input_length " + std::to_string(j["input_length"].get<uint64_t>()) +
                 " does not fit " + std::to_string(j["hash_ids"].size()) + " blocks of 512 tokens");
    Request r{ts, j["input_length"].get<uint32_t>(), {}};
    r.ids.reserve(j["hash_ids"].size());
    for (const auto& id : j["hash_ids"]) {
      if (!id.is_number_unsigned()) return bad("hash_ids must be non-negative integers");
      r.ids.push_back(id.get<uint64_t>());
    }
    out->push_back(std::move(r));
    if (limit && out->size() >= limit) break;
  }
  return Code::kSuccess;
}

// Block contents are a function of the block id, so every retrieve can be checked.
void fill_block(uint64_t id, uint8_t* p, uint64_t len) {
  const uint64_t seed = mix(id + 1);
  auto* w = reinterpret_cast<uint64_t*>(p);
  for (uint64_t i = 0; i < len / 8; ++i) w[i] = seed ^ (i * 0x9e3779b97f4a7c15ull);
}
bool check_block(uint64_t id, const uint8_t* p, uint64_t len) {
  const uint64_t seed = mix(id + 1);
  auto* w = reinterpret_cast<const uint64_t*>(p);
  uint64_t bad = 0;
  for (uint64_t i = 0; i < len / 8; ++i) bad |= w[i] ^ (seed ^ (i * 0x9e3779b97f4a7c15ull));
  return bad == 0;
}

}  // namespace dpukv::replay
