// The directory's values beyond holders (directory.h): what a node puts under a
// key, read back in one MGET; node descriptions by id; lookups answered from the
// local replica while it is complete; and Redis refusing writes, said clearly.
#include "cluster/directory/directory.h"

#include <algorithm>
#include <cstring>
#include <ctime>
#include "cluster/directory/directory_event.h"
#include "cluster/directory/directory_keys.h"
#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv {

namespace {
struct ValuesOp {
  Directory::ValuesCb cb;
  void* arg;
  size_t n;
};
}  // namespace

namespace {
struct NodeOp {
  Directory::NodeCb cb;
  void* arg;
};
}  // namespace

void Directory::put_value(const ChunkKey& k, std::string value) {
  if (!connected()) {
    ++counters_.value_put_failures;
    return;
  }
  // The size rides in the callback's pointer: counted as put only when Redis says OK.
  void* size = reinterpret_cast<void*>(static_cast<uintptr_t>(value.size()));
  const uint64_t before = counters_.errors;
  command(&Directory::on_put, size,
          {"SET", keys_.value_key(k), std::move(value), "PX", std::to_string(kChunkExpiryMs)});
  if (counters_.errors != before) ++counters_.value_put_failures;  // not even sent
}

void Directory::on_put(redisAsyncContext* c, void* r, void* priv) {
  auto* d = static_cast<Directory*>(RedisLink::owner_of(c));
  auto* reply = static_cast<redisReply*>(r);
  if (reply != nullptr && reply->type == REDIS_REPLY_STATUS) {
    ++d->counters_.values_put;
    d->counters_.value_bytes_put += reinterpret_cast<uintptr_t>(priv);
    return;
  }
  ++d->counters_.value_put_failures;
  if (reply != nullptr && reply->type == REDIS_REPLY_ERROR) {
    ++d->counters_.errors;
    d->warn_refused("a remote-tier value", std::string(reply->str, reply->len));
  }
}

// Redis refusing writes (maxmemory with noeviction, a read-only replica, an ACL
// that forbids the command): said when it starts, then at most once a minute with
// how many more there were.
void Directory::warn_refused(const char* what, const std::string& why) {
  const uint64_t now = monotonic_ms();
  ++refusals_unlogged_;
  if (last_refusal_log_ms_ != 0 && now - last_refusal_log_ms_ < 60000) return;
  LOG_WARN(
      "cluster directory: Redis refused %s: %s (%llu refusals since the last report; "
      "see remote_tier_put_failures and directory_errors)",
      what, why.c_str(), static_cast<unsigned long long>(refusals_unlogged_));
  refusals_unlogged_ = 0;
  last_refusal_log_ms_ = now;
}

Status Directory::get_values(const ChunkKey* keys, uint32_t n, ValuesCb cb, void* arg) {
  if (state() != CtxState::kRunning) return Code::kBadState;
  if (n == 0 || keys == nullptr || cb == nullptr) return Code::kInvalidValue;
  if (!connected()) {
    ++counters_.unreachable;
    return Code::kConnectionReset;
  }
  std::vector<std::string> argv = {"MGET"};
  for (uint32_t i = 0; i < n; ++i) argv.push_back(keys_.value_key(keys[i]));
  auto reply_cb = [](redisAsyncContext*, void* r, void* priv) {
    std::unique_ptr<ValuesOp> o(static_cast<ValuesOp*>(priv));
    auto* reply = static_cast<redisReply*>(r);
    std::vector<std::string> values(o->n);
    if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY || reply->elements != o->n) {
      o->cb(o->arg, Code::kConnectionReset, values);
      return;
    }
    for (size_t i = 0; i < o->n; ++i)
      if (reply->element[i]->type == REDIS_REPLY_STRING)
        values[i].assign(reply->element[i]->str, reply->element[i]->len);
    o->cb(o->arg, Code::kSuccess, values);
  };
  ++counters_.value_gets;
  command(reply_cb, new ValuesOp{cb, arg, n}, std::move(argv));
  return Code::kSuccess;
}

Status Directory::find_node(uint64_t node_id, NodeCb cb, void* arg) {
  if (state() != CtxState::kRunning) return Code::kBadState;
  if (!connected()) return Code::kConnectionReset;
  auto* op = new NodeOp{cb, arg};
  std::string key = keys_.node_key(node_id);
  const char* argv[] = {"GET", key.c_str()};
  const size_t len[] = {3, key.size()};
  auto reply_cb = [](redisAsyncContext*, void* r, void* priv) {
    std::unique_ptr<NodeOp> o(static_cast<NodeOp*>(priv));
    auto* reply = static_cast<redisReply*>(r);
    if (reply == nullptr)
      o->cb(o->arg, Code::kConnectionReset, std::string());
    else if (reply->type != REDIS_REPLY_STRING)
      o->cb(o->arg, Code::kNotFound, std::string());
    else
      o->cb(o->arg, Code::kSuccess, std::string(reply->str, reply->len));
  };
  if (!link_.command(reply_cb, op, 2, argv, len)) {
    delete op;
    return Code::kConnectionReset;
  }
  return Code::kSuccess;
}

// Lookups taken while the replica was complete, answered as an MGET would be.
size_t Directory::answer_local() {
  if (local_ops_.empty()) return 0;
  answering_.swap(local_ops_);
  for (LookupOp* op : answering_) {
    const size_t n = op->keys.size();
    if (listed_.size() < n) listed_.resize(n);
    for (size_t k = 0; k < n; ++k) listed_[k].clear();
    listed_.resize(n);
    for (size_t k = 0; k < n; ++k) sync_.replica().find(op->keys[k], &listed_[k]);
    live_holders(*op, listed_);
    const LookupCb cb = op->cb;
    void* const arg = op->arg;
    free_ops_.push_back(op);
    cb(arg, Code::kSuccess, holders_);
  }
  const size_t n = answering_.size();
  answering_.clear();
  return n;
}

}  // namespace dpukv
