// The client's ops on keys (client.h): LOOKUP (per layer too), CONTAINS, REMOVE,
// PREFETCH, UNPIN, PUSH, and the agent-wide CLEAR and STATS.
#include "client/client.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace dpukv {

using agent::AgentHeader;
using agent::IoEntry;
using agent::Op;

uint32_t Client::lookup(const ChunkKey* keys, uint32_t n, bool pin) {
  uint32_t hits = 0;
  return lookup(keys, n, pin, &hits).ok() ? hits : 0;  // unreachable or refused: recompute
}

Status Client::lookup(const ChunkKey* keys, uint32_t n, bool pin, uint32_t* hits) {
  std::lock_guard<std::mutex> g(mu_);
  DPUKV_RETURN_IF_ERROR(ensure_connected());
  const uint32_t per_msg = (ch_->connection()->max_msg() - sizeof(AgentHeader)) / sizeof(ChunkKey);
  uint32_t total = 0;
  std::vector<uint8_t> resp;
  for (uint32_t base = 0; base < n; base += per_msg) {
    const uint32_t k = std::min(per_msg, n - base);
    DPUKV_RETURN_IF_ERROR(
        call(Op::kLookup, pin ? agent::kPin : 0, keys + base, sizeof(ChunkKey), k, &resp));
    if (resp.size() < sizeof(AgentHeader) + 4) return Code::kCorrupted;
    uint32_t got;
    std::memcpy(&got, resp.data() + sizeof(AgentHeader), 4);
    if (got > k) return Code::kCorrupted;
    total += got;
    if (got < k) break;
  }
  *hits = total;
  return Code::kSuccess;
}

Status Client::lookup_layers(const ChunkKey* keys, uint32_t per_layer, uint32_t layers, bool pin,
                             uint32_t* hits) {
  if (keys == nullptr || hits == nullptr || layers == 0) return Code::kInvalidValue;
  std::unique_lock<std::mutex> g(mu_);
  DPUKV_RETURN_IF_ERROR(ensure_connected());
  const uint32_t per_msg = (ch_->connection()->max_msg() - sizeof(AgentHeader)) / sizeof(ChunkKey);
  if (per_layer > per_msg) {  // a layer needs several messages: one after the other
    g.unlock();
    for (uint32_t l = 0; l < layers; ++l)
      DPUKV_RETURN_IF_ERROR(
          lookup(keys + static_cast<size_t>(l) * per_layer, per_layer, pin, &hits[l]));
    return Code::kSuccess;
  }
  // Every layer's lookup sent before the first answer is awaited: one round trip.
  std::vector<uint64_t> ids(layers);
  for (uint32_t l = 0; l < layers; ++l)
    DPUKV_RETURN_IF_ERROR(send_request(Op::kLookup, pin ? agent::kPin : 0,
                                       keys + static_cast<size_t>(l) * per_layer, sizeof(ChunkKey),
                                       per_layer, &ids[l]));
  std::vector<uint8_t> resp;
  for (uint32_t l = 0; l < layers; ++l) {
    DPUKV_RETURN_IF_ERROR(wait_response(ids[l], &resp));
    AgentHeader r;
    uint32_t got;
    if (resp.size() < sizeof(AgentHeader) + 4) return Code::kCorrupted;
    std::memcpy(&r, resp.data(), sizeof(r));
    if (r.status != 0) return static_cast<Code>(r.status);
    std::memcpy(&got, resp.data() + sizeof(AgentHeader), 4);
    if (got > per_layer) return Code::kCorrupted;
    hits[l] = got;
  }
  return Code::kSuccess;
}

Status Client::keys_op(Op op, const ChunkKey* keys, uint32_t n, Status* per_entry, Status* call) {
  std::lock_guard<std::mutex> g(mu_);
  Status st = ensure_connected();
  std::vector<uint8_t> resp;
  if (st.ok()) st = this->call(op, 0, keys, sizeof(ChunkKey), n, &resp);
  if (st.ok() && resp.size() < sizeof(AgentHeader) + (per_entry ? n : 0)) st = Code::kCorrupted;
  if (call) *call = st;
  if (!st.ok()) {  // no answer per entry: each entry failed with the call
    for (uint32_t i = 0; per_entry && i < n; ++i) per_entry[i] = st;
    return st;
  }
  Status first;
  for (uint32_t i = 0; per_entry && i < n; ++i) {
    Status e = static_cast<Code>(resp[sizeof(AgentHeader) + i]);
    per_entry[i] = e;
    if (!e.ok() && first.ok()) first = e;
  }
  return first;
}

// As many messages as the keys need (a model's layers unpinned together), all sent
// before the first answer is awaited: one round trip.
Status Client::unpin(const ChunkKey* keys, uint32_t n) {
  if (n == 0) return Code::kSuccess;
  if (keys == nullptr) return Code::kInvalidValue;
  std::lock_guard<std::mutex> g(mu_);
  DPUKV_RETURN_IF_ERROR(ensure_connected());
  const uint32_t per_msg = (ch_->connection()->max_msg() - sizeof(AgentHeader)) / sizeof(ChunkKey);
  std::vector<uint64_t> ids;
  ids.reserve((n + per_msg - 1) / per_msg);
  for (uint32_t base = 0; base < n; base += per_msg) {
    uint64_t id;
    DPUKV_RETURN_IF_ERROR(send_request(Op::kUnpin, 0, keys + base, sizeof(ChunkKey),
                                       std::min(per_msg, n - base), &id));
    ids.push_back(id);
  }
  Status first;
  std::vector<uint8_t> resp;
  for (uint64_t id : ids) {
    Status st = wait_response(id, &resp);
    if (st.ok() && resp.size() < sizeof(AgentHeader)) st = Code::kCorrupted;
    if (st.ok()) st = static_cast<Code>(resp[offsetof(AgentHeader, status)]);
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

Status Client::contains(const ChunkKey* keys, uint32_t n, Status* p, Status* call) {
  return keys_op(Op::kContains, keys, n, p, call);
}

Status Client::remove(const ChunkKey* keys, uint32_t n, Status* p, Status* call) {
  return keys_op(Op::kRemove, keys, n, p, call);
}

Status Client::prefetch(const ChunkKey* keys, uint32_t n, Status* p, Status* call) {
  return keys_op(Op::kPrefetch, keys, n, p, call);
}

Status Client::push(uint64_t node, const ChunkKey* keys, uint32_t n, Status* per_entry) {
  if (keys == nullptr || n == 0 || n > agent::kMaxPushKeys) return Code::kInvalidValue;
  std::lock_guard<std::mutex> g(mu_);
  DPUKV_RETURN_IF_ERROR(ensure_connected());
  // The body is a PushHeader and the keys, sent as one 16-byte "entry" per piece.
  std::vector<uint8_t> body(sizeof(agent::PushHeader) + n * sizeof(ChunkKey));
  const agent::PushHeader ph{node, 0};
  std::memcpy(body.data(), &ph, sizeof(ph));
  std::memcpy(body.data() + sizeof(ph), keys, n * sizeof(ChunkKey));
  uint64_t id;
  DPUKV_RETURN_IF_ERROR(
      send_request(Op::kPush, 0, body.data(), 1, static_cast<uint32_t>(body.size()), &id, n));
  std::vector<uint8_t> resp;
  DPUKV_RETURN_IF_ERROR(wait_response(id, &resp));
  if (resp.size() < sizeof(AgentHeader)) return Code::kCorrupted;
  AgentHeader r;
  std::memcpy(&r, resp.data(), sizeof(r));
  if (resp.size() >= sizeof(AgentHeader) + n && per_entry != nullptr)
    for (uint32_t i = 0; i < n; ++i) per_entry[i] = static_cast<Code>(resp[sizeof(r) + i]);
  return static_cast<Code>(r.status);
}

Status Client::clear(uint64_t* removed, bool every_tenant) {
  std::lock_guard<std::mutex> g(mu_);
  DPUKV_RETURN_IF_ERROR(ensure_connected());
  std::vector<uint8_t> resp;
  DPUKV_RETURN_IF_ERROR(
      call(Op::kClear, every_tenant ? agent::kAllTenants : 0, nullptr, 0, 0, &resp));
  if (resp.size() < sizeof(AgentHeader) + sizeof(uint64_t)) return Code::kCorrupted;
  if (removed != nullptr) std::memcpy(removed, resp.data() + sizeof(AgentHeader), sizeof(*removed));
  return Code::kSuccess;
}

Status Client::stats_json(std::string* out) {
  std::lock_guard<std::mutex> g(mu_);
  DPUKV_RETURN_IF_ERROR(ensure_connected());
  std::vector<uint8_t> resp;
  DPUKV_RETURN_IF_ERROR(call(Op::kStats, 0, nullptr, 0, 0, &resp));
  out->assign(reinterpret_cast<const char*>(resp.data()) + sizeof(AgentHeader),
              resp.size() - sizeof(AgentHeader));
  return Code::kSuccess;
}

}  // namespace dpukv
