#include "cluster/directory.h"

#include <sys/epoll.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <unordered_map>

#include "runtime/clock.h"
#include "runtime/log.h"

namespace dpukv {
namespace {

constexpr size_t kMaxQueued = 1 << 20;                // queued removals while Redis is away
constexpr uint64_t kChunkExpiryMs = 7ull * 86400000;  // a hash nobody refreshes goes eventually

uint64_t wall_ms() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1000000;
}

// Lowercase hex without snprintf: a 64-key lookup formats 256 of these, and
// snprintf made formatting cost as much as the Redis round trip.
void put_hex16(char* p, uint64_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  for (int i = 15; i >= 0; --i, v >>= 4) p[i] = kDigits[v & 15];
}

bool parse_hex16(const char* s, size_t n, uint64_t* out) {
  if (n != 16) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) {
    const char c = s[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

}  // namespace

// One lookup: a single MGET of the keys' holder strings. Pooled: a lookup
// allocates nothing once the pool is warm.
struct Directory::LookupOp {
  LookupCb cb = nullptr;
  void* arg = nullptr;
  std::vector<ChunkKey> keys;  // to drop entries of dead holders
};

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

// A holder is dropped from a chunk only if its lease has really run out: this
// node's view of the live set may be older than the holder's (re)joining.
constexpr const char* kDropDeadScript =
    "local s = redis.call('ZSCORE', KEYS[2], ARGV[1]) "
    "if s and tonumber(s) > tonumber(ARGV[2]) then return 0 end "
    "local v = redis.call('GET', KEYS[1]) if not v then return 0 end "
    "local b, e = string.find(v, ',' .. ARGV[1] .. ',', 1, true) if not b then return 0 end "
    "v = string.sub(v, 1, b) .. string.sub(v, e + 1) "
    "if v == ',' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], v, 'KEEPTTL') end "
    "return 1";

Directory::Directory(ProgressEngine* pe, const DirectoryOptions& o) : Context(pe), opts_(o) {
  watch_.owner = this;
}

Status Directory::create(ProgressEngine* pe, const DirectoryOptions& o,
                         std::unique_ptr<Directory>* out) {
  if (o.host.empty() || o.port == 0 || o.lease_ms < 30 || o.live_refresh_ms == 0 ||
      o.prefix.empty() || o.description.size() > (1u << 20))
    return Code::kInvalidValue;
  out->reset(new Directory(pe, o));
  return Code::kSuccess;
}

Directory::~Directory() {
  if (ctx_ != nullptr) {
    redisAsyncContext* c = ctx_;
    ctx_ = nullptr;
    c->onDisconnect = nullptr;
    redisAsyncFree(c);  // pending callbacks run with no reply
  }
  for (LookupOp* op : free_ops_) delete op;
}

std::string Directory::hex16(uint64_t v) {
  std::string s(16, '0');
  put_hex16(s.data(), v);
  return s;
}

size_t Directory::key_size() const {
  return opts_.prefix.size() + 3 + 32;
}

// PREFIX:K:BYTES where K is 'c' (holders) or 'v' (remote-tier value) and BYTES the
// key's 32 bytes (model, prefix hash, world size and rank, layout; little endian):
// binary, because Redis parses and hashes every byte of 64 keys per lookup.
void Directory::format_key(char* p, char kind, const ChunkKey& k) const {
  std::memcpy(p, opts_.prefix.data(), opts_.prefix.size());
  p += opts_.prefix.size();
  *p++ = ':';
  *p++ = kind;
  *p++ = ':';
  const uint64_t w[4] = {k.model, k.prefix_hash, (uint64_t{k.world_size} << 32) | k.rank, k.layout};
  std::memcpy(p, w, sizeof(w));
}

std::string Directory::chunk_key(const ChunkKey& k) const {
  std::string s(key_size(), '\0');
  format_key(s.data(), 'c', k);
  return s;
}

std::string Directory::value_key(const ChunkKey& k) const {
  std::string s(key_size(), '\0');
  format_key(s.data(), 'v', k);
  return s;
}

std::string Directory::node_key(uint64_t node) const {
  return opts_.prefix + ":n:" + hex16(node);
}

// ---- the hiredis event hooks: the socket in the progress engine's epoll set -----

// hiredis asks for read and write interest as it queues and sends; the epoll set
// is brought up to date only before the engine could sleep (and in poll()), so a
// command written at once by poll() costs no epoll_ctl calls.
void Directory::update_watch() {
  if (ctx_ == nullptr) return;
  const uint32_t ev = (reading_ ? EPOLLIN : 0u) | (writing_ ? EPOLLOUT : 0u);
  if (watched_ && ev == watched_events_) return;
  fd_ = ctx_->c.fd;
  if (!watched_) {
    if (pe()->watch_fd(fd_, ev, &watch_).ok()) {
      watched_ = true;
      watched_events_ = ev;
    }
  } else if (pe()->modify_fd(fd_, ev, &watch_).ok()) {
    watched_events_ = ev;
  }
}

// Queued commands go out now rather than after an epoll round; EPOLLOUT is
// watched only while the socket is full (or the connection is being made).
void Directory::write_through() {
  if (ctx_ != nullptr && ready_ && writing_ && !(watched_events_ & EPOLLOUT))
    redisAsyncHandleWrite(ctx_);
}

bool Directory::arm_notification() {
  write_through();
  update_watch();
  return false;
}

void Directory::add_read(void* p) {
  static_cast<Directory*>(p)->reading_ = true;
}
void Directory::del_read(void* p) {
  static_cast<Directory*>(p)->reading_ = false;
}
void Directory::add_write(void* p) {
  static_cast<Directory*>(p)->writing_ = true;
}
void Directory::del_write(void* p) {
  static_cast<Directory*>(p)->writing_ = false;
}
void Directory::cleanup(void* p) {
  auto* d = static_cast<Directory*>(p);
  if (d->watched_) d->pe()->unwatch_fd(d->fd_, &d->watch_);
  d->watched_ = d->reading_ = d->writing_ = false;
  d->watched_events_ = 0;
}

void Directory::Watch::on_fd_ready(uint32_t events) {
  redisAsyncContext* c = owner->ctx_;
  if (c == nullptr) return;
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) redisAsyncHandleRead(c);
  if (owner->ctx_ == c && (events & EPOLLOUT)) redisAsyncHandleWrite(c);
}

// ---- connection ------------------------------------------------------------------

void Directory::connect() {
  redisAsyncContext* c = redisAsyncConnect(opts_.host.c_str(), opts_.port);
  if (c == nullptr || c->err) {
    if (c != nullptr) redisAsyncFree(c);
    lost("cannot connect");
    return;
  }
  ctx_ = c;
  ready_ = false;
  c->data = this;
  c->ev.data = this;
  c->ev.addRead = &Directory::add_read;
  c->ev.delRead = &Directory::del_read;
  c->ev.addWrite = &Directory::add_write;
  c->ev.delWrite = &Directory::del_write;
  c->ev.cleanup = &Directory::cleanup;
  redisAsyncSetConnectCallback(c, &Directory::on_connect);
  redisAsyncSetDisconnectCallback(c, &Directory::on_disconnect);
  add_write(this);  // the connection completes when the socket becomes writable
  update_watch();
}

void Directory::lost(const char* why) {
  ++counters_.unreachable;
  ready_ = false;
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

void Directory::on_connect(const redisAsyncContext* c, int status) {
  auto* d = static_cast<Directory*>(c->data);
  if (status != REDIS_OK) {  // hiredis frees the context after this
    d->ctx_ = nullptr;
    d->cleanup(d);
    d->lost(c->errstr);
    return;
  }
  d->ready_ = true;
  d->leased_ = false;  // everything is published now anyway
  if (d->down_since_ms_ != 0) {
    LOG_WARN("cluster directory: Redis at %s:%u reachable again after %llu s; publishing again",
             d->opts_.host.c_str(), d->opts_.port,
             static_cast<unsigned long long>((monotonic_ms() - d->down_since_ms_) / 1000));
    d->down_since_ms_ = 0;
  }
  ++d->counters_.connects;
  d->adds_.assign(d->held_.begin(), d->held_.end());
  d->renew_lease();
}

void Directory::on_disconnect(const redisAsyncContext* c, int status) {
  auto* d = static_cast<Directory*>(c->data);
  d->ctx_ = nullptr;
  if (status != REDIS_OK || d->state() == CtxState::kRunning) d->lost(c->errstr);
}

void Directory::command(redisCallbackFn* cb, void* priv, std::vector<std::string> argv) {
  argv_.clear();
  lens_.clear();
  for (const std::string& s : argv) {
    argv_.push_back(s.data());
    lens_.push_back(s.size());
  }
  (void)send_argv(cb, priv);
}

bool Directory::send_argv(redisCallbackFn* cb, void* priv) {
  if (redisAsyncCommandArgv(ctx_, cb, priv, static_cast<int>(argv_.size()), argv_.data(),
                            lens_.data()) != REDIS_OK) {
    ++counters_.errors;
    return false;
  }
  ++pending_replies_;
  return true;
}

void Directory::on_reply(redisAsyncContext* c, void* r, void* priv) {
  auto* d = static_cast<Directory*>(c->data);
  --d->pending_replies_;
  auto* reply = static_cast<redisReply*>(r);
  if (priv == nullptr) {  // fire and forget: count failures
    if (reply == nullptr || reply->type == REDIS_REPLY_ERROR) ++d->counters_.errors;
    return;
  }
  auto* op = static_cast<LookupOp*>(priv);
  const LookupCb cb = op->cb;
  void* const arg = op->arg;
  d->free_ops_.push_back(op);  // reusable by a lookup the callback makes, not before
  const size_t n = op->keys.size();
  // Reused: the callback may not keep it, and a nested lookup does not touch it.
  std::vector<std::vector<uint64_t>>& holders = d->holders_;
  if (holders.size() < n) holders.resize(n);
  for (size_t k = 0; k < n; ++k) holders[k].clear();
  holders.resize(n);
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY || reply->elements != n) {
    ++d->counters_.errors;
    cb(arg, Code::kConnectionReset, holders);
    return;
  }
  // Only live holders are answered; entries of dead nodes are removed.
  for (size_t k = 0; k < n; ++k) {
    const redisReply* e = reply->element[k];
    if (e->type != REDIS_REPLY_STRING) continue;
    auto& h = holders[k];
    for (size_t i = 1; i + 17 <= e->len; i += 17) {  // ",ID,ID,": 16 hex and a comma each
      uint64_t node;
      if (!parse_hex16(e->str + i, 16, &node)) break;
      if (std::binary_search(d->live_.begin(), d->live_.end(), node)) {
        h.push_back(node);
        continue;
      }
      if (d->ctx_ != nullptr)
        d->command(&Directory::on_reply, nullptr,
                   {"EVAL", kDropDeadScript, "2", d->chunk_key(op->keys[k]),
                    d->opts_.prefix + ":nodes", hex16(node), std::to_string(wall_ms())});
      ++d->counters_.stale_dropped;
    }
    if (!h.empty()) ++d->counters_.lookup_hits;
  }
  cb(arg, Code::kSuccess, holders);
}

void Directory::on_live_nodes(redisAsyncContext* c, void* r, void*) {
  auto* d = static_cast<Directory*>(c->data);
  --d->pending_replies_;
  auto* reply = static_cast<redisReply*>(r);
  if (reply == nullptr || reply->type != REDIS_REPLY_ARRAY) {
    ++d->counters_.errors;
    return;
  }
  d->live_.clear();
  for (size_t i = 0; i < reply->elements; ++i) {
    uint64_t node;
    const redisReply* e = reply->element[i];
    if (e->type == REDIS_REPLY_STRING && parse_hex16(e->str, e->len, &node))
      d->live_.push_back(node);
  }
  std::sort(d->live_.begin(), d->live_.end());
}

// The lease script answers 1 when the node's lease had run out (a long pause, Redis
// restarted): others may have dropped its entries, so it publishes them again.
void Directory::on_lease(redisAsyncContext* c, void* r, void*) {
  auto* d = static_cast<Directory*>(c->data);
  --d->pending_replies_;
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
  const std::string id = hex16(opts_.node_id);
  const uint64_t now = wall_ms();
  command(&Directory::on_lease, nullptr,
          {"EVAL", kLeaseScript, "1", opts_.prefix + ":nodes", id, std::to_string(now),
           std::to_string(now + opts_.lease_ms)});
  command(&Directory::on_reply, nullptr,
          {"SET", node_key(opts_.node_id), opts_.description, "PX",
           std::to_string(2ull * opts_.lease_ms)});
  renew_at_ms_ = monotonic_ms() + opts_.lease_ms / 3;
  refresh_live();
}

// The live nodes, read apart from lookups so that a lookup is one MGET.
void Directory::refresh_live() {
  command(&Directory::on_live_nodes, nullptr,
          {"ZRANGEBYSCORE", opts_.prefix + ":nodes", std::to_string(wall_ms()), "+inf"});
  live_at_ms_ = monotonic_ms() + opts_.live_refresh_ms;
}

void Directory::flush() {
  const std::string id = hex16(opts_.node_id);
  const std::string expiry = std::to_string(kChunkExpiryMs);
  for (const ChunkKey& k : adds_)
    command(&Directory::on_reply, nullptr, {"EVAL", kAddScript, "1", chunk_key(k), id, expiry});
  counters_.published += adds_.size();
  adds_.clear();
  for (const ChunkKey& k : removes_)
    command(&Directory::on_reply, nullptr, {"EVAL", kRemoveScript, "1", chunk_key(k), id});
  counters_.unpublished += removes_.size();
  removes_.clear();
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
  LookupOp* op;
  if (free_ops_.empty()) {
    op = new LookupOp;
  } else {
    op = free_ops_.back();
    free_ops_.pop_back();
  }
  op->cb = cb;
  op->arg = arg;
  op->keys.assign(keys, keys + n);
  // The MGET in RESP, written here: every argument but the first has the same
  // length, and hiredis' general formatter cost more than Redis' work.
  const size_t klen = key_size();
  char head[32], each[32];
  const int hn = std::snprintf(head, sizeof(head), "*%u\r\n$4\r\nMGET\r\n", n + 1);
  const int an = std::snprintf(each, sizeof(each), "$%zu\r\n", klen);
  key_buf_.resize(static_cast<size_t>(hn) + n * (an + klen + 2));
  char* p = key_buf_.data();
  std::memcpy(p, head, static_cast<size_t>(hn));
  p += hn;
  for (uint32_t i = 0; i < n; ++i) {
    std::memcpy(p, each, static_cast<size_t>(an));
    format_key(p + an, 'c', keys[i]);
    p += an + klen;
    *p++ = '\r';
    *p++ = '\n';
  }
  ++counters_.lookups;
  counters_.lookup_keys += n;
  if (redisAsyncFormattedCommand(ctx_, &Directory::on_reply, op, key_buf_.data(),
                                 key_buf_.size()) != REDIS_OK) {
    ++counters_.errors;
    free_ops_.push_back(op);  // else back to the pool by the reply
    return Code::kConnectionReset;
  }
  ++pending_replies_;
  return Code::kSuccess;
}

void Directory::put_value(const ChunkKey& k, std::string value) {
  if (!connected()) return;
  ++counters_.values_put;
  counters_.value_bytes_put += value.size();
  command(&Directory::on_reply, nullptr,
          {"SET", value_key(k), std::move(value), "PX", std::to_string(kChunkExpiryMs)});
}

namespace {
struct ValuesOp {
  Directory::ValuesCb cb;
  void* arg;
  size_t n;
};
}  // namespace

Status Directory::get_values(const ChunkKey* keys, uint32_t n, ValuesCb cb, void* arg) {
  if (state() != CtxState::kRunning) return Code::kBadState;
  if (n == 0 || keys == nullptr || cb == nullptr) return Code::kInvalidValue;
  if (!connected()) {
    ++counters_.unreachable;
    return Code::kConnectionReset;
  }
  std::vector<std::string> argv = {"MGET"};
  for (uint32_t i = 0; i < n; ++i) argv.push_back(value_key(keys[i]));
  auto reply_cb = [](redisAsyncContext* c, void* r, void* priv) {
    auto* d = static_cast<Directory*>(c->data);
    --d->pending_replies_;
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

namespace {
struct NodeOp {
  Directory::NodeCb cb;
  void* arg;
};
}  // namespace

Status Directory::find_node(uint64_t node_id, NodeCb cb, void* arg) {
  if (state() != CtxState::kRunning) return Code::kBadState;
  if (!connected()) return Code::kConnectionReset;
  auto* op = new NodeOp{cb, arg};
  std::string key = node_key(node_id);
  const char* argv[] = {"GET", key.c_str()};
  const size_t len[] = {3, key.size()};
  auto reply_cb = [](redisAsyncContext* c, void* r, void* priv) {
    auto* d = static_cast<Directory*>(c->data);
    --d->pending_replies_;
    std::unique_ptr<NodeOp> o(static_cast<NodeOp*>(priv));
    auto* reply = static_cast<redisReply*>(r);
    if (reply == nullptr)
      o->cb(o->arg, Code::kConnectionReset, std::string());
    else if (reply->type != REDIS_REPLY_STRING)
      o->cb(o->arg, Code::kNotFound, std::string());
    else
      o->cb(o->arg, Code::kSuccess, std::string(reply->str, reply->len));
  };
  if (redisAsyncCommandArgv(ctx_, reply_cb, op, 2, argv, len) != REDIS_OK) {
    delete op;
    return Code::kConnectionReset;
  }
  ++pending_replies_;
  return Code::kSuccess;
}

// ---- the context -------------------------------------------------------------------

Status Directory::do_start() {
  connect();  // an unreachable Redis is retried; the agent runs meanwhile
  return Code::kSuccess;
}

void Directory::do_stop() {
  if (!connected()) return;
  // Leave at once: peers stop asking this node; its chunk fields age out with it.
  const std::string id = hex16(opts_.node_id);
  command(&Directory::on_reply, nullptr, {"ZREM", opts_.prefix + ":nodes", id});
  command(&Directory::on_reply, nullptr, {"DEL", node_key(opts_.node_id)});
  redisAsyncDisconnect(ctx_);  // after the replies
}

bool Directory::drained() {
  if (ctx_ != nullptr && !connected()) {  // still connecting: give up
    redisAsyncContext* c = ctx_;
    ctx_ = nullptr;
    c->onDisconnect = nullptr;
    redisAsyncFree(c);
  }
  return ctx_ == nullptr;
}

size_t Directory::poll() {
  if (state() != CtxState::kRunning) {  // stopping: the leave commands still go out
    write_through();
    update_watch();
    return 0;
  }
  const uint64_t now = monotonic_ms();
  if (ctx_ == nullptr) {
    if (now >= retry_at_ms_) connect();
    return 0;
  }
  if (!ready_) return 0;
  size_t n = adds_.size() + removes_.size();
  if (now >= renew_at_ms_) {
    renew_lease();
    ++n;
  } else if (now >= live_at_ms_) {
    refresh_live();
    ++n;
  }
  if (!adds_.empty() || !removes_.empty()) flush();
  write_through();
  update_watch();
  return n;
}

}  // namespace dpukv
