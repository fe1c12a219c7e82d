#include "cluster/directory/replica_sync.h"

#include <cstring>
#include <memory>
#include <vector>

#include "cluster/directory/directory_event.h"
#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv {

// One SCAN step or one MGET of scanned keys in flight; freed by its reply (hiredis
// calls every callback once, with no reply when the connection goes).
struct ReplicaSync::ScanStep {
  ReplicaSync* sync;
  uint64_t epoch;
};
struct ReplicaSync::ScanBatch {
  ReplicaSync* sync;
  uint64_t epoch;
  std::vector<ChunkKey> keys;
};

ReplicaSync::ReplicaSync(ProgressEngine* pe, const ReplicaSyncOptions& o, const DirectoryKeys* keys,
                         RedisLink* link)
    : opts_(o),
      keys_(keys),
      link_(link),
      replica_(o.max_keys),
      feed_(pe, RedisLink::Events{this, &ReplicaSync::on_feed_up, &ReplicaSync::on_feed_down}) {}

ReplicaSync::~ReplicaSync() {
  feed_.drop();  // pending callbacks run with no reply
}

void ReplicaSync::start(uint64_t now) {
  started_ms_ = now;
  if (!feed_.connect(opts_.host, opts_.port, opts_.user, opts_.password))
    retry_at_ms_ = now + opts_.retry_ms;
}

void ReplicaSync::poll(uint64_t now, bool link_up) {
  if (!off_ && !feed_.open() && now >= retry_at_ms_) start(now);
  if (feed_.open() && !feed_.up() && now - started_ms_ >= opts_.connect_timeout_ms) {
    feed_.drop();  // no answer to AUTH/PING: Redis hung
    retry_at_ms_ = now + opts_.retry_ms;
  }
  if (link_up && subscribed_ && !ready_ && !scanning_ && now >= scan_retry_at_ms_) start_scan();
}

void ReplicaSync::link_up() {
  if (subscribed_ && !ready_) start_scan();
}

void ReplicaSync::on_feed_up(void* owner) {
  auto* s = static_cast<ReplicaSync*>(owner);
  const std::string channel = s->keys_->events_channel();
  const char* argv[] = {"SUBSCRIBE", channel.c_str()};
  const size_t lens[] = {9, channel.size()};
  if (!s->feed_.command(&ReplicaSync::on_feed_message, nullptr, 2, argv, lens)) s->feed_.drop();
}

void ReplicaSync::on_feed_down(void* owner, const char*) {
  auto* s = static_cast<ReplicaSync*>(owner);
  // Events may have been missed: the replica is rebuilt when the feed is back.
  s->subscribed_ = s->ready_ = s->scanning_ = false;
  ++s->epoch_;  // replies to a scan under way are ignored
  s->replica_.clear();
  s->retry_at_ms_ = monotonic_ms() + s->opts_.retry_ms;
}

void ReplicaSync::on_feed_message(redisAsyncContext* c, void* r, void*) {
  auto* s = static_cast<ReplicaSync*>(RedisLink::owner_of(c));
  auto* reply = static_cast<redisReply*>(r);
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY || reply->elements != 3 ||
      reply->element[0]->type != REDIS_REPLY_STRING)
    return;
  const std::string kind(reply->element[0]->str, reply->element[0]->len);
  if (kind == "subscribe") {
    s->subscribed_ = true;
    s->replica_.clear();
    if (s->link_->up()) s->start_scan();
    return;
  }
  if (kind != "message" || reply->element[2]->type != REDIS_REPLY_STRING) return;
  ++s->counters_.events;
  directory_event::Header h;
  const uint8_t* entries = nullptr;
  const redisReply* payload = reply->element[2];
  if (!directory_event::parse(reinterpret_cast<const uint8_t*>(payload->str), payload->len, &h,
                              &entries)
           .ok()) {
    if (s->counters_.bad_events++ == 0)
      LOG_WARN("cluster directory: a malformed event (%zu bytes) on %s; ignored (counted)",
               payload->len, s->keys_->events_channel().c_str());
    return;
  }
  for (uint32_t i = 0; i < h.count; ++i) {
    directory_event::Entry e;
    std::memcpy(&e, entries + i * sizeof(e), sizeof(e));
    if (e.op == static_cast<uint8_t>(directory_event::Op::kHolds))
      s->replica_.add(e.key, h.node);
    else
      s->replica_.drop(e.key, h.node);
  }
  if (s->replica_.overflow()) s->overflowed();
}

void ReplicaSync::overflowed() {
  LOG_WARN(
      "cluster directory: more than %zu chunks in the cluster; lookups go to Redis "
      "from now on (replica_max_keys)",
      opts_.max_keys);
  off_ = true;
  subscribed_ = ready_ = scanning_ = false;
  ++epoch_;
  replica_.clear();
  feed_.close();
}

// Every entry as it is now, merged into what the events already said.
void ReplicaSync::start_scan() {
  scanning_ = true;
  cursor_done_ = false;
  batches_ = 0;
  ++epoch_;
  send_scan("0");
}

void ReplicaSync::send_scan(const std::string& cursor) {
  const std::string match = keys_->holders_pattern();
  const char* argv[] = {"SCAN", cursor.c_str(), "MATCH", match.c_str(), "COUNT", "1000"};
  const size_t lens[] = {4, cursor.size(), 5, match.size(), 5, 4};
  auto step = std::make_unique<ScanStep>(ScanStep{this, epoch_});
  if (!link_->command(&ReplicaSync::on_scan, step.get(), 6, argv, lens)) {
    scan_failed();
    return;
  }
  step.release();  // freed by its reply
}

void ReplicaSync::scan_failed() {
  ++counters_.errors;
  scanning_ = false;
  ++epoch_;  // what is still under way of this scan is ignored
  scan_retry_at_ms_ = monotonic_ms() + opts_.retry_ms;
}

void ReplicaSync::on_scan(redisAsyncContext*, void* r, void* priv) {
  std::unique_ptr<ScanStep> step(static_cast<ScanStep*>(priv));
  ReplicaSync* s = step->sync;
  if (step->epoch != s->epoch_) return;  // an old scan
  auto* reply = static_cast<redisReply*>(r);
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
      reply->element[0]->type != REDIS_REPLY_STRING ||
      reply->element[1]->type != REDIS_REPLY_ARRAY) {
    s->scan_failed();
    return;
  }
  const redisReply* keys = reply->element[1];
  auto batch = std::make_unique<ScanBatch>();
  batch->sync = s;
  batch->epoch = s->epoch_;
  std::vector<const char*> argv(1, "MGET");
  std::vector<size_t> lens(1, 4);
  for (size_t i = 0; i < keys->elements; ++i) {
    const redisReply* k = keys->element[i];
    ChunkKey ck;
    if (k->type != REDIS_REPLY_STRING || !s->keys_->parse_holders_key(k->str, k->len, &ck))
      continue;
    batch->keys.push_back(ck);
    argv.push_back(k->str);
    lens.push_back(k->len);
  }
  if (!batch->keys.empty()) {
    if (!s->link_->command(&ReplicaSync::on_scan_values, batch.get(), static_cast<int>(argv.size()),
                           argv.data(), lens.data())) {
      s->scan_failed();
      return;
    }
    batch.release();  // freed by its reply
    ++s->batches_;
  }
  const std::string cursor(reply->element[0]->str, reply->element[0]->len);
  if (cursor == "0")
    s->cursor_done_ = true;
  else
    s->send_scan(cursor);
  s->scan_settled();
}

void ReplicaSync::on_scan_values(redisAsyncContext*, void* r, void* priv) {
  std::unique_ptr<ScanBatch> batch(static_cast<ScanBatch*>(priv));
  ReplicaSync* s = batch->sync;
  if (batch->epoch != s->epoch_) return;
  --s->batches_;
  auto* reply = static_cast<redisReply*>(r);
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY ||
      reply->elements != batch->keys.size()) {
    s->scan_failed();
    return;
  }
  std::vector<uint64_t> nodes;
  for (size_t i = 0; i < reply->elements; ++i) {
    const redisReply* e = reply->element[i];
    if (e->type != REDIS_REPLY_STRING) continue;
    nodes.clear();
    if (!DirectoryKeys::parse_holders(e->str, e->len, &nodes)) ++s->counters_.bad_entries;
    for (uint64_t n : nodes) s->replica_.add(batch->keys[i], n);
  }
  if (s->replica_.overflow()) {
    s->overflowed();
    return;
  }
  s->scan_settled();
}

void ReplicaSync::scan_settled() {
  if (!scanning_ || !cursor_done_ || batches_ != 0) return;
  scanning_ = false;
  ready_ = subscribed_;
  ++counters_.syncs;
}

}  // namespace dpukv
