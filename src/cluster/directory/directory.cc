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

constexpr size_t kMaxQueued = 1 << 20;  // queued removals while Redis is away

uint64_t wall_ms() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1000000;
}

}  // namespace

// A chunk's holders are one string, ",ID,ID,", so that a lookup of any number of
// keys is one MGET (a hash per chunk costs one command per key on the server:
// 190 us for 64 keys here, against 21 us for an MGET). Edits run server side.
constexpr const char* kAddScript =
    "local v = redis.call('GET', KEYS[1]) or ',' "
    "if not string.find(v, ',' .. ARGV[1] .. ',', 1, true) then v = v .. ARGV[1] .. ',' end "
    "redis.call('SET', KEYS[1], v, 'PX', ARGV[2]) return 1";
constexpr const char* kRemoveScript =
    "local v = redis.call('GET', KEYS[1]) if not v then return 0 end "
    "local s, e = string.find(v, ',' .. ARGV[1] .. ',', 1, true) if not s then return 0 end "
    "v = string.sub(v, 1, s) .. string.sub(v, e + 1) "
    "if v == ',' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], v, 'KEEPTTL') end "
    "return 1";

// Renews a node's lease; 1 if it had run out (or never was). Nodes dead for a
// minute leave the set.
constexpr const char* kLeaseScript =
    "local old = redis.call('ZSCORE', KEYS[1], ARGV[1]) "
    "redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1]) "
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[2]) - 60000) "
    "if not old or tonumber(old) <= tonumber(ARGV[2]) then return 1 end return 0";

// One clean-up per chunk, whatever its value holds: holders whose lease has
// really run out are dropped (this node's view of the live set may be older than a
// holder's rejoining), each holder is kept once, and a value longer than ARGV[2]
// bytes, or not a holder list, is deleted (live holders publish again as they
// store). Bounded work on the server: a poisoned value costs one pass.
constexpr const char* kDropDeadScript =
    "local v = redis.call('GET', KEYS[1]) if not v then return 0 end "
    "if #v > tonumber(ARGV[2]) or not string.match(v, '^,[%x,]*$') then "
    "redis.call('DEL', KEYS[1]) return -1 end "
    "local keep, seen = ',', {} "
    "for id in string.gmatch(v, '(%x+),') do "
    "if #id == 16 and not seen[id] then seen[id] = true "
    "local s = redis.call('ZSCORE', KEYS[2], id) "
    "if s and tonumber(s) > tonumber(ARGV[1]) then keep = keep .. id .. ',' end end end "
    "if keep == v then return 0 end "
    "if keep == ',' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], keep, "
    "'KEEPTTL') end "
    "return 1";

Directory::Directory(ProgressEngine* pe, const DirectoryOptions& o)
    : Context(pe),
      opts_(o),
      keys_(o.prefix),
      link_(pe, RedisLink::Events{this, &Directory::on_link_up, &Directory::on_link_down}),
      sync_(pe,
            ReplicaSyncOptions{o.host, o.port, o.user, o.password, o.retry_ms, o.connect_timeout_ms,
                               o.replica_max_keys},
            &keys_, &link_) {}

Status Directory::create(ProgressEngine* pe, const DirectoryOptions& o,
                         std::unique_ptr<Directory>* out) {
  if (o.host.empty() || o.port == 0 || o.lease_ms < 30 || o.live_refresh_ms == 0 ||
      o.prefix.empty() || o.description.size() > (1u << 20))
    return Code::kInvalidValue;
  out->reset(new Directory(pe, o));
  return Code::kSuccess;
}

Directory::~Directory() {
  link_.drop();  // pending callbacks run with no reply
  sync_.drop();
  for (LookupOp* op : local_ops_) delete op;
  for (LookupOp* op : free_ops_) delete op;
}

Directory::LookupOp* Directory::take_op() {
  if (free_ops_.empty()) return new LookupOp;
  LookupOp* op = free_ops_.back();
  free_ops_.pop_back();
  return op;
}

// ---- connection ------------------------------------------------------------------

void Directory::lost(const char* why) {
  ++counters_.unreachable;
  down_reason_ = why;
  retry_at_ms_ = monotonic_ms() + opts_.retry_ms;
  // Everything held is published again on reconnection; removals wait in removes_.
  adds_.clear();
  // Said when it happens and then once a minute, not at every retry.
  const uint64_t now = monotonic_ms();
  if (down_since_ms_ == 0) {
    down_since_ms_ = now;
    last_down_log_ms_ = now;
    LOG_WARN("cluster directory: Redis at %s:%u unreachable (%s); serving locally, retrying",
             opts_.host.c_str(), opts_.port, why);
  } else if (now - last_down_log_ms_ >= 60000) {
    last_down_log_ms_ = now;
    LOG_WARN("cluster directory: Redis at %s:%u still unreachable after %llu s (%s)",
             opts_.host.c_str(), opts_.port,
             static_cast<unsigned long long>((now - down_since_ms_) / 1000), why);
  }
}

// Lookups Redis has not answered in time are misses now; Redis is taken for hung
// (stopped, swapping, a script running long) and the connection is made again.
void Directory::expire_lookups(uint64_t now) {
  if (sent_ops_.empty() || sent_ops_.front()->deadline_ms > now) return;
  std::vector<LookupOp*> late;
  for (LookupOp* op : sent_ops_)
    if (!op->abandoned && op->deadline_ms <= now) late.push_back(op);
  for (LookupOp* op : late) {
    op->abandoned = true;
    ++counters_.lookup_timeouts;
    for (auto& h : holders_) h.clear();
    holders_.resize(op->keys.size());
    op->cb(op->arg, Code::kTimeout, holders_);
  }
  char why[96];
  std::snprintf(why, sizeof(why), "no answer to a lookup within %u ms", opts_.lookup_timeout_ms);
  link_.drop();  // the abandoned ops come back to the pool through on_reply
  sent_ops_.clear();
  lost(why);
}

void Directory::on_link_up(void* owner) {
  auto* d = static_cast<Directory*>(owner);
  d->leased_ = false;  // everything is published now anyway
  if (d->down_since_ms_ != 0) {
    LOG_WARN("cluster directory: Redis at %s:%u reachable again after %llu s; publishing again",
             d->opts_.host.c_str(), d->opts_.port,
             static_cast<unsigned long long>((monotonic_ms() - d->down_since_ms_) / 1000));
    d->down_since_ms_ = 0;
  }
  ++d->counters_.connects;
  d->down_reason_.clear();
  d->adds_.assign(d->held_.begin(), d->held_.end());
  d->renew_lease();
  if (d->opts_.replicate) d->sync_.link_up();
}

void Directory::on_link_down(void* owner, const char* why) {
  auto* d = static_cast<Directory*>(owner);
  if (d->state() == CtxState::kRunning) d->lost(why);
}

void Directory::command(redisCallbackFn* cb, void* priv, std::vector<std::string> argv) {
  argv_.clear();
  lens_.clear();
  for (const std::string& s : argv) {
    argv_.push_back(s.data());
    lens_.push_back(s.size());
  }
  if (!link_.command(cb, priv, static_cast<int>(argv_.size()), argv_.data(), lens_.data())) {
    ++counters_.errors;
    return;
  }
}

// An entry's add (or removal): counted when Redis took it, not when it was sent.
void Directory::on_edit_reply(redisAsyncContext* c, void* r, void* priv) {
  auto* d = static_cast<Directory*>(RedisLink::owner_of(c));
  auto* reply = static_cast<redisReply*>(r);
  const bool add = priv != nullptr;
  if (reply != nullptr && reply->type != REDIS_REPLY_ERROR) {
    ++(add ? d->counters_.published : d->counters_.unpublished);
    return;
  }
  ++d->counters_.errors;
  ++d->counters_.publish_failures;
  if (reply != nullptr)
    d->warn_refused(add ? "a directory entry" : "a directory entry's removal",
                    std::string(reply->str, reply->len));
}

void Directory::on_reply(redisAsyncContext* c, void* r, void* priv) {
  auto* d = static_cast<Directory*>(RedisLink::owner_of(c));
  auto* reply = static_cast<redisReply*>(r);
  if (priv == nullptr) {  // fire and forget: count failures
    if (reply == nullptr || reply->type == REDIS_REPLY_ERROR) ++d->counters_.errors;
    if (reply != nullptr && reply->type == REDIS_REPLY_ERROR)
      d->warn_refused("a directory edit", std::string(reply->str, reply->len));
    return;
  }
  auto* op = static_cast<LookupOp*>(priv);
  auto sent = std::find(d->sent_ops_.begin(), d->sent_ops_.end(), op);
  if (sent != d->sent_ops_.end()) d->sent_ops_.erase(sent);
  if (op->abandoned) {  // answered TIMEOUT already
    op->abandoned = false;
    d->free_ops_.push_back(op);
    return;
  }
  const LookupCb cb = op->cb;
  void* const arg = op->arg;
  const size_t n = op->keys.size();
  // Reused: the callback may not keep them, and a nested lookup does not touch them.
  std::vector<std::vector<uint64_t>>& listed = d->listed_;
  if (listed.size() < n) listed.resize(n);
  for (size_t k = 0; k < n; ++k) listed[k].clear();
  listed.resize(n);
  const bool ok = reply != nullptr && reply->type == REDIS_REPLY_ARRAY && reply->elements == n;
  for (size_t k = 0; ok && k < n; ++k) {
    const redisReply* e = reply->element[k];
    if (e->type == REDIS_REPLY_STRING &&
        !DirectoryKeys::parse_holders(e->str, e->len, &listed[k])) {
      ++d->counters_.bad_entries;
      d->drop_dead(op->keys[k]);  // removes it
    }
  }
  d->live_holders(*op, listed);
  d->free_ops_.push_back(op);  // reusable by a lookup the callback makes, not before
  if (!ok) {
    ++d->counters_.errors;
    cb(arg, Code::kConnectionReset, d->holders_);
    return;
  }
  cb(arg, Code::kSuccess, d->holders_);
}

// Only live holders are answered; entries of dead nodes are removed.
void Directory::live_holders(const LookupOp& op, const std::vector<std::vector<uint64_t>>& listed) {
  const size_t n = op.keys.size();
  if (holders_.size() < n) holders_.resize(n);
  for (size_t k = 0; k < n; ++k) holders_[k].clear();
  holders_.resize(n);
  for (size_t k = 0; k < n; ++k) {
    bool dead = false;
    for (uint64_t node : listed[k]) {
      if (std::binary_search(live_.begin(), live_.end(), node)) {
        holders_[k].push_back(node);
        continue;
      }
      // Not dropped from the replica: this node's view of the live set may be older
      // than the holder's rejoining, whose events said it holds the chunk.
      ++counters_.stale_dropped;
      dead = true;
    }
    if (dead) drop_dead(op.keys[k]);  // once per key, however many are dead
    if (!holders_[k].empty()) ++counters_.lookup_hits;
  }
}

void Directory::drop_dead(const ChunkKey& k) {
  if (!link_.up()) return;
  command(&Directory::on_reply, nullptr,
          {"EVAL", kDropDeadScript, "2", keys_.holders_key(k), keys_.nodes_key(),
           std::to_string(wall_ms()), std::to_string(1 + DirectoryKeys::kMaxHolders * 17)});
}

void Directory::on_live_nodes(redisAsyncContext* c, void* r, void*) {
  auto* d = static_cast<Directory*>(RedisLink::owner_of(c));
  auto* reply = static_cast<redisReply*>(r);
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY) {
    ++d->counters_.errors;
    return;
  }
  d->live_.clear();
  for (size_t i = 0; i < reply->elements; ++i) {
    uint64_t node;
    const redisReply* e = reply->element[i];
    if (e->type == REDIS_REPLY_STRING && DirectoryKeys::parse_hex16(e->str, e->len, &node))
      d->live_.push_back(node);
  }
  std::sort(d->live_.begin(), d->live_.end());
}

// The lease script answers 1 when the node's lease had run out (a long pause, Redis
// restarted): others may have dropped its entries, so it publishes them again.
void Directory::on_lease(redisAsyncContext* c, void* r, void*) {
  auto* d = static_cast<Directory*>(RedisLink::owner_of(c));
  auto* reply = static_cast<redisReply*>(r);
  if (reply == nullptr || reply->type != REDIS_REPLY_INTEGER) {
    ++d->counters_.errors;
    return;
  }
  if (reply->integer == 1 && d->counters_.connects > 0 && d->leased_) {
    ++d->counters_.rejoined;
    d->adds_.assign(d->held_.begin(), d->held_.end());
  }
  d->leased_ = true;
}

void Directory::renew_lease() {
  const std::string id = DirectoryKeys::hex16(opts_.node_id);
  const uint64_t now = wall_ms();
  command(&Directory::on_lease, nullptr,
          {"EVAL", kLeaseScript, "1", keys_.nodes_key(), id, std::to_string(now),
           std::to_string(now + opts_.lease_ms)});
  command(&Directory::on_reply, nullptr,
          {"SET", keys_.node_key(opts_.node_id), opts_.description, "PX",
           std::to_string(2ull * opts_.lease_ms)});
  renew_at_ms_ = monotonic_ms() + opts_.lease_ms / 3;
  refresh_live();
}

// The live nodes, read apart from lookups so that a lookup is one MGET.
void Directory::refresh_live() {
  command(&Directory::on_live_nodes, nullptr,
          {"ZRANGEBYSCORE", keys_.nodes_key(), std::to_string(wall_ms()), "+inf"});
  live_at_ms_ = monotonic_ms() + opts_.live_refresh_ms;
}

void Directory::flush() {
  const std::string id = DirectoryKeys::hex16(opts_.node_id);
  const std::string expiry = std::to_string(kChunkExpiryMs);
  // priv: non-null for an add (on_edit_reply counts what Redis took).
  static char kAdd;
  for (const ChunkKey& k : adds_)
    command(&Directory::on_edit_reply, &kAdd,
            {"EVAL", kAddScript, "1", keys_.holders_key(k), id, expiry});
  published_now_.swap(adds_);
  adds_.clear();
  for (const ChunkKey& k : removes_)
    command(&Directory::on_edit_reply, nullptr,
            {"EVAL", kRemoveScript, "1", keys_.holders_key(k), id});
  publish_events();
  removes_.clear();
}

// The same edits as events, after them on the same connection: a subscriber that
// hears of an entry finds it in Redis too.
void Directory::publish_events() {
  const std::string channel = keys_.events_channel();
  std::string msg;
  auto send = [&] {
    command(&Directory::on_reply, nullptr, {"PUBLISH", channel, msg});
    ++counters_.events_published;
  };
  directory_event::begin(opts_.node_id, &msg);
  size_t in_msg = 0;
  auto add = [&](directory_event::Op op, const ChunkKey& k) {
    directory_event::append(op, k, &msg);
    if (++in_msg == directory_event::kMaxEntries) {
      send();
      directory_event::begin(opts_.node_id, &msg);
      in_msg = 0;
    }
  };
  for (const ChunkKey& k : published_now_) add(directory_event::Op::kHolds, k);
  for (const ChunkKey& k : removes_) add(directory_event::Op::kDrops, k);
  if (in_msg > 0) send();
  published_now_.clear();
}

// ---- the agent's calls -----------------------------------------------------------

void Directory::add(const ChunkKey& k) {
  if (!held_.insert(k).second) return;
  if (connected()) adds_.push_back(k);
}

void Directory::remove(const ChunkKey& k) {
  if (held_.erase(k) == 0) return;
  if (removes_.size() < kMaxQueued) removes_.push_back(k);
}

Status Directory::lookup(const ChunkKey* keys, uint32_t n, LookupCb cb, void* arg) {
  if (state() != CtxState::kRunning) return Code::kBadState;
  if (n == 0 || keys == nullptr || cb == nullptr) return Code::kInvalidValue;
  if (!connected()) {
    ++counters_.unreachable;
    return Code::kConnectionReset;
  }
  LookupOp* op = take_op();
  op->cb = cb;
  op->arg = arg;
  op->keys.assign(keys, keys + n);
  ++counters_.lookups;
  counters_.lookup_keys += n;
  if (sync_.ready()) {  // answered from the replica in the next poll()
    ++counters_.lookups_local;
    local_ops_.push_back(op);
    return Code::kSuccess;
  }
  // The MGET in RESP, written here: every argument but the first has the same
  // length, and hiredis' general formatter cost more than Redis' work.
  const size_t klen = keys_.chunk_key_size();
  char head[32], each[32];
  const int hn = std::snprintf(head, sizeof(head), "*%u\r\n$4\r\nMGET\r\n", n + 1);
  const int an = std::snprintf(each, sizeof(each), "$%zu\r\n", klen);
  key_buf_.resize(static_cast<size_t>(hn) + n * (an + klen + 2));
  char* p = key_buf_.data();
  std::memcpy(p, head, static_cast<size_t>(hn));
  p += hn;
  for (uint32_t i = 0; i < n; ++i) {
    std::memcpy(p, each, static_cast<size_t>(an));
    keys_.format(p + an, 'c', keys[i]);
    p += an + klen;
    *p++ = '\r';
    *p++ = '\n';
  }
  if (!link_.formatted(&Directory::on_reply, op, key_buf_.data(), key_buf_.size())) {
    ++counters_.errors;
    free_ops_.push_back(op);  // else back to the pool by the reply
    return Code::kConnectionReset;
  }
  op->deadline_ms = monotonic_ms() + opts_.lookup_timeout_ms;
  sent_ops_.push_back(op);
  return Code::kSuccess;
}

// ---- the context -------------------------------------------------------------------

Status Directory::do_start() {
  // An unreachable Redis is retried; the agent runs meanwhile.
  link_started_ms_ = monotonic_ms();
  if (!link_.connect(opts_.host, opts_.port, opts_.user, opts_.password))
    retry_at_ms_ = monotonic_ms() + opts_.retry_ms;
  if (opts_.replicate) sync_.start(monotonic_ms());
  return Code::kSuccess;
}

void Directory::do_stop() {
  stop_deadline_ms_ = monotonic_ms() + opts_.stop_timeout_ms;
  sync_.close();
  if (!connected()) return;
  // Leave at once: peers stop asking this node; its chunk fields age out with it.
  const std::string id = DirectoryKeys::hex16(opts_.node_id);
  command(&Directory::on_reply, nullptr, {"ZREM", keys_.nodes_key(), id});
  command(&Directory::on_reply, nullptr, {"DEL", keys_.node_key(opts_.node_id)});
  link_.close();  // after the replies
}

bool Directory::drained() {
  answer_local();
  // Still connecting: give up. A Redis that does not answer the goodbye in time
  // (hung, stopped) does not hold the agent's stop.
  if (link_.open() && !link_.up()) link_.drop();
  if (sync_.connecting()) sync_.drop();
  if (monotonic_ms() >= stop_deadline_ms_ && (link_.open() || sync_.open())) {
    LOG_WARN(
        "cluster directory: Redis at %s:%u did not answer within %u ms; leaving without "
        "its answer (this node's lease runs out on its own)",
        opts_.host.c_str(), opts_.port, opts_.stop_timeout_ms);
    link_.drop();
    sync_.drop();
  }
  return !link_.open() && !sync_.open() && local_ops_.empty();
}

bool Directory::arm_notification() {
  link_.service();
  sync_.service();
  return !local_ops_.empty();
}

size_t Directory::poll() {
  size_t n = answer_local();
  if (state() != CtxState::kRunning) {  // stopping: the leave commands still go out
    link_.service();
    sync_.service();
    return n;
  }
  const uint64_t now = monotonic_ms();
  expire_lookups(now);
  if (opts_.replicate) sync_.poll(now, link_.up());
  if (!link_.open()) {
    if (now >= retry_at_ms_) {
      link_started_ms_ = now;
      if (!link_.connect(opts_.host, opts_.port, opts_.user, opts_.password))
        retry_at_ms_ = now + opts_.retry_ms;
    }
    return n;
  }
  if (!link_.up()) {  // connecting, or waiting for AUTH's answer
    if (now - link_started_ms_ >= opts_.connect_timeout_ms) {
      link_.drop();
      lost("no answer to the connection's first command (Redis hung?)");
      return n;
    }
    link_.service();
    sync_.service();
    return n;
  }
  n += adds_.size() + removes_.size();
  if (now >= renew_at_ms_) {
    renew_lease();
    ++n;
  } else if (now >= live_at_ms_) {
    refresh_live();
    ++n;
  }
  if (!adds_.empty() || !removes_.empty()) flush();
  link_.service();
  sync_.service();
  return n;
}

Directory::Counters Directory::counters() const {
  Counters c = counters_;
  const ReplicaSync::Counters& r = sync_.counters();
  c.events = r.events;
  c.bad_events = r.bad_events;
  c.syncs = r.syncs;
  c.bad_entries += r.bad_entries;
  c.errors += r.errors;
  return c;
}

}  // namespace dpukv
