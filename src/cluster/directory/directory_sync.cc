// The directory's replica: a second connection subscribed to PREFIX:events, a scan
// of every entry when the subscription starts, and lookups answered from it.
#include <cstring>
#include <string>

#include "cluster/directory/directory.h"
#include "cluster/directory/directory_event.h"
#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv {

void Directory::on_feed_up(void* owner) {
  auto* d = static_cast<Directory*>(owner);
  const std::string channel = d->opts_.prefix + ":events";
  const char* argv[] = {"SUBSCRIBE", channel.c_str()};
  const size_t lens[] = {9, channel.size()};
  if (!d->feed_.command(&Directory::on_feed_message, nullptr, 2, argv, lens)) d->feed_.drop();
}

void Directory::on_feed_down(void* owner, const char*) {
  auto* d = static_cast<Directory*>(owner);
  // Events may have been missed: the replica is rebuilt when the feed is back.
  d->feed_subscribed_ = d->replica_ready_ = d->scanning_ = false;
  ++d->scan_epoch_;  // replies to a scan under way are ignored
  d->replica_.clear();
  d->feed_retry_at_ms_ = monotonic_ms() + d->opts_.retry_ms;
}

void Directory::on_feed_message(redisAsyncContext* c, void* r, void*) {
  auto* d = static_cast<Directory*>(RedisLink::owner_of(c));
  auto* reply = static_cast<redisReply*>(r);
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY || reply->elements != 3 ||
      reply->element[0]->type != REDIS_REPLY_STRING)
    return;
  const std::string kind(reply->element[0]->str, reply->element[0]->len);
  if (kind == "subscribe") {
    d->feed_subscribed_ = true;
    d->replica_.clear();
    if (d->link_.up()) d->start_scan();
    return;
  }
  if (kind != "message" || reply->element[2]->type != REDIS_REPLY_STRING) return;
  ++d->counters_.events;
  directory_event::Header h;
  const uint8_t* entries = nullptr;
  const redisReply* payload = reply->element[2];
  if (!directory_event::parse(reinterpret_cast<const uint8_t*>(payload->str), payload->len, &h,
                              &entries)
           .ok()) {
    if (d->counters_.bad_events++ == 0)
      LOG_WARN("cluster directory: a malformed event (%zu bytes) on %s:events; ignored (counted)",
               payload->len, d->opts_.prefix.c_str());
    return;
  }
  for (uint32_t i = 0; i < h.count; ++i) {
    directory_event::Entry e;
    std::memcpy(&e, entries + i * sizeof(e), sizeof(e));
    if (e.op == static_cast<uint8_t>(directory_event::Op::kHolds))
      d->replica_.add(e.key, h.node);
    else
      d->replica_.drop(e.key, h.node);
  }
  if (d->replica_.overflow()) d->replica_overflowed();
}

void Directory::replica_overflowed() {
  LOG_WARN(
      "cluster directory: more than %zu chunks in the cluster; lookups go to Redis "
      "from now on (replica_max_keys)",
      opts_.replica_max_keys);
  replica_off_ = true;
  feed_subscribed_ = replica_ready_ = scanning_ = false;
  ++scan_epoch_;
  replica_.clear();
  feed_.close();
}

// Every entry as it is now, merged into what the events already said.
void Directory::start_scan() {
  scanning_ = true;
  scan_cursor_done_ = false;
  scan_batches_ = 0;
  ++scan_epoch_;
  send_scan("0");
}

void Directory::send_scan(const std::string& cursor) {
  const std::string match = opts_.prefix + ":c:*";
  command(&Directory::on_scan, reinterpret_cast<void*>(static_cast<uintptr_t>(scan_epoch_)),
          {"SCAN", cursor, "MATCH", match, "COUNT", "1000"});
}

namespace {
struct ScanBatch {
  uint64_t epoch;
  std::vector<ChunkKey> keys;
};
}  // namespace

void Directory::on_scan(redisAsyncContext* c, void* r, void* priv) {
  auto* d = static_cast<Directory*>(RedisLink::owner_of(c));
  auto* reply = static_cast<redisReply*>(r);
  if (reinterpret_cast<uintptr_t>(priv) != d->scan_epoch_) return;  // an old scan
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
      reply->element[0]->type != REDIS_REPLY_STRING ||
      reply->element[1]->type != REDIS_REPLY_ARRAY) {
    ++d->counters_.errors;
    d->scanning_ = false;
    d->scan_retry_at_ms_ = monotonic_ms() + d->opts_.retry_ms;
    return;
  }
  const redisReply* keys = reply->element[1];
  auto batch = std::make_unique<ScanBatch>();
  batch->epoch = d->scan_epoch_;
  d->argv_.assign(1, "MGET");
  d->lens_.assign(1, 4);
  for (size_t i = 0; i < keys->elements; ++i) {
    const redisReply* k = keys->element[i];
    ChunkKey ck;
    if (k->type != REDIS_REPLY_STRING || !d->parse_key(k->str, k->len, &ck)) continue;
    batch->keys.push_back(ck);
    d->argv_.push_back(k->str);
    d->lens_.push_back(k->len);
  }
  if (!batch->keys.empty() &&
      d->link_.command(&Directory::on_scan_values, batch.get(), static_cast<int>(d->argv_.size()),
                       d->argv_.data(), d->lens_.data())) {
    batch.release();  // freed by its reply
    ++d->scan_batches_;
  }
  const std::string cursor(reply->element[0]->str, reply->element[0]->len);
  if (cursor == "0")
    d->scan_cursor_done_ = true;
  else
    d->send_scan(cursor);
  d->scan_settled();
}

void Directory::on_scan_values(redisAsyncContext* c, void* r, void* priv) {
  auto* d = static_cast<Directory*>(RedisLink::owner_of(c));
  std::unique_ptr<ScanBatch> batch(static_cast<ScanBatch*>(priv));
  if (batch->epoch != d->scan_epoch_) return;
  --d->scan_batches_;
  auto* reply = static_cast<redisReply*>(r);
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY ||
      reply->elements != batch->keys.size()) {
    ++d->counters_.errors;
    d->scanning_ = false;
    d->scan_retry_at_ms_ = monotonic_ms() + d->opts_.retry_ms;
    ++d->scan_epoch_;
    return;
  }
  std::vector<uint64_t> nodes;
  for (size_t i = 0; i < reply->elements; ++i) {
    const redisReply* e = reply->element[i];
    if (e->type != REDIS_REPLY_STRING) continue;
    nodes.clear();
    if (!parse_holders(e->str, e->len, &nodes)) ++d->counters_.bad_entries;
    for (uint64_t n : nodes) d->replica_.add(batch->keys[i], n);
  }
  if (d->replica_.overflow()) {
    d->replica_overflowed();
    return;
  }
  d->scan_settled();
}

void Directory::scan_settled() {
  if (!scanning_ || !scan_cursor_done_ || scan_batches_ != 0) return;
  scanning_ = false;
  replica_ready_ = feed_subscribed_;
  ++counters_.syncs;
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
    for (size_t k = 0; k < n; ++k) replica_.find(op->keys[k], &listed_[k]);
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
