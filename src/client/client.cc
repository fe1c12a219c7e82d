#include "client/client.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "protocol/socket_path.h"
#include "runtime/log.h"

namespace dpukv {

using agent::AgentHeader;
using agent::IoEntry;
using agent::Op;

namespace {
// Pages shared in place by the live clients of this process: sharing them again
// would move them from under the first client's export, whose loads would then land
// in pages nobody maps any more. A claim whose pages were unmapped since (the
// memory freed, its addresses reused) is stale and gives way.
struct SharedClaim {
  uintptr_t first, end;
  uint64_t dev, ino;  // the memfd that backs them
};
std::mutex g_shared_mu;
std::vector<SharedClaim> g_shared;

// True while `addr` is still mapped from the file (dev, ino) in this process
// (/proc/self/maps: unprivileged, read only when a new share overlaps a claim).
bool still_mapped(uintptr_t addr, uint64_t dev, uint64_t ino) {
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return true;  // cannot tell: keep the claim
  char line[512];
  bool mapped = false;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    unsigned long lo, hi, off, inode;  // NOLINT(google-runtime-int): the format's types
    unsigned maj, min;
    char perms[8];
    if (std::sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &lo, &hi, perms, &off, &maj, &min, &inode) !=
        7)
      continue;
    if (addr < lo || addr >= hi) continue;
    mapped = inode == ino && makedev(maj, min) == dev;
    break;
  }
  std::fclose(f);
  return mapped;
}

thread_local std::string t_connect_error;
}  // namespace

const char* Client::last_connect_error() {
  return t_connect_error.c_str();
}

Status Client::connect(const ClientOptions& o, std::unique_ptr<Client>* out) {
  t_connect_error.clear();
  std::unique_ptr<Client> c(new Client());
  c->opts_ = o;
  if (c->opts_.socket_path.empty()) {
    std::vector<std::string> skipped;
    c->opts_.socket_path = find_agent_socket(&skipped);
    for (const std::string& s : skipped)
      LOG_WARN(
          "client: agent socket %s is not used; name the agent with DPUKV_SOCKET or a "
          "socket setting to use it",
          s.c_str());
    if (c->opts_.socket_path.empty()) {
      t_connect_error = "no agent socket this user may use (DPUKV_SOCKET names one)";
      return Code::kNotPermitted;
    }
  }
  DPUKV_RETURN_IF_ERROR(ProgressEngine::create(&c->pe_));
  const Status st = c->open_channel(o.connect_timeout_ms);
  if (!st.ok()) {
    const char* refusal = c->ch_ ? c->ch_->refusal() : nullptr;
    if (refusal != nullptr)
      t_connect_error = "the agent at " + c->opts_.socket_path + " refused: " + refusal;
    else if (st == Code::kNotFound)
      t_connect_error = "no agent answered at " + c->opts_.socket_path;
    else
      t_connect_error = "connecting to " + c->opts_.socket_path + ": " + std::string(st.name());
    if (!o.absent_ok || (st != Code::kNotFound && st != Code::kFull)) return st;
    c->lost_ = true;  // ensure_connected tries again, at most once a reconnect interval
  }
  Client* raw = c.get();
  c->keepalive_ = std::thread([raw] { raw->keepalive_loop(); });
  *out = std::move(c);
  return Code::kSuccess;
}

void Client::keepalive_loop() {
  const auto period = std::chrono::milliseconds(std::max<uint32_t>(opts_.heartbeat_ms / 4, 10));
  std::unique_lock<std::mutex> lk(ka_mu_);
  while (!ka_cv_.wait_for(lk, period, [&] { return ka_stop_; })) {
    // Skip a turn when a call holds the lock: the call is running the channel.
    std::unique_lock<std::mutex> g(mu_, std::try_to_lock);
    if (g.owns_lock()) pe_->progress();
  }
}

Client::~Client() {
  {
    std::lock_guard<std::mutex> lk(ka_mu_);
    ka_stop_ = true;
  }
  ka_cv_.notify_all();
  if (keepalive_.joinable()) keepalive_.join();
  if (ch_ && ch_->state() != CtxState::kIdle) {
    (void)ch_->stop();
    while (ch_->state() != CtxState::kIdle) pe_->progress();
  }
  ch_.reset();
  for (auto& s : staging_) (void)s.map->stop();
  {
    std::lock_guard<std::mutex> g(g_shared_mu);
    for (const auto& s : staging_) {
      if (!s.in_place) continue;
      const auto first = reinterpret_cast<uintptr_t>(s.mem->data());
      std::erase_if(g_shared, [&](const SharedClaim& c) {
        return c.first == first && c.end == first + s.mem->size();
      });
    }
  }
}

Status Client::open_channel(uint32_t timeout_ms) {
  last_attempt_ns_ = monotonic_ns();
  if (!ch_) {
    ComchClientOptions co;
    co.path = opts_.socket_path;
    co.max_msg_size = comch::kMaxMsgLimit;
    co.heartbeat_interval_ms = opts_.heartbeat_ms;
    co.connect_timeout_ms = timeout_ms;
    co.send_queue_depth = 256;
    DPUKV_RETURN_IF_ERROR(ComchClient::create(pe_.get(), co, &ch_));
    UserData ud;
    ud.ptr = this;
    DPUKV_RETURN_IF_ERROR(ch_->set_user_data(ud));
    ComchCallbacks cb;
    cb.on_recv = [](ComchConnection*, const uint8_t* d, uint32_t n, UserData u) {
      auto* self = static_cast<Client*>(u.ptr);
      if (n < sizeof(AgentHeader)) return;
      AgentHeader h;
      std::memcpy(&h, d, sizeof(h));
      if (h.request_id == 0 && h.op == (static_cast<uint16_t>(Op::kEvents) | agent::kResponse)) {
        self->take_event_message(h, d + sizeof(h), n - static_cast<uint32_t>(sizeof(h)));
        return;
      }
      self->responses_.emplace_back(h.request_id, std::vector<uint8_t>(d, d + n));
    };
    cb.on_disconnect = [](ComchConnection*, Status, UserData u) {
      auto* self = static_cast<Client*>(u.ptr);
      self->lost_ = true;
      if (self->subscribed_) self->events_lost_ = true;  // events go unseen until back
    };
    cb.on_send_done = [](ComchSendTask* t, UserData, UserData u) {
      (void)static_cast<Client*>(u.ptr)->ch_->free(t);
    };
    cb.on_send_error = cb.on_send_done;
    DPUKV_RETURN_IF_ERROR(ch_->set_callbacks(cb));
    DPUKV_RETURN_IF_ERROR(ch_->set_send_conf(64));
  }
  if (ch_->state() == CtxState::kIdle) {
    Status st = ch_->start();
    if (!st.ok() && st != Code::kInProgress) return st;
  }
  const uint64_t deadline = monotonic_ns() + static_cast<uint64_t>(timeout_ms) * 1000000ull;
  while (ch_->state() == CtxState::kStarting && monotonic_ns() < deadline) pe_->wait(20000, 5);
  if (ch_->state() != CtxState::kRunning) {
    if (ch_->state() == CtxState::kStarting) (void)ch_->stop();
    while (ch_->state() != CtxState::kIdle) pe_->progress();
    const Status why = ch_->last_error();
    if (ch_->refusal() != nullptr || why == Code::kNotPermitted) return why;
    return Code::kNotFound;
  }
  lost_ = false;
  responses_.clear();
  // A new session: announce the model and export every staging buffer again.
  agent::HelloEntry hello{opts_.model, 0};
  std::vector<uint8_t> resp;
  DPUKV_RETURN_IF_ERROR(call(Op::kHello, 0, &hello, sizeof(hello), 1, &resp));
  agent::HelloReply hr{};
  if (resp.size() >= sizeof(AgentHeader) + sizeof(hr)) {
    std::memcpy(&hr, resp.data() + sizeof(AgentHeader), sizeof(hr));
    max_staging_ = hr.max_staging_bytes;
  }
  agent_gpu_ = (hr.flags & agent::kHelloGpu) != 0;
  agent_rows_ = (hr.flags & agent::kHelloRows) != 0;
  for (auto& s : staging_) {
    ComchSendTask* t;
    DPUKV_RETURN_IF_ERROR(
        ch_->export_alloc_init(ch_->connection(), *s.map, s.map->id(), UserData{}, &t));
    DPUKV_RETURN_IF_ERROR(ch_->submit(t));
  }
  if (subscribed_) {  // the event feed again (what happened meanwhile is lost)
    std::vector<uint8_t> r;
    DPUKV_RETURN_IF_ERROR(call(Op::kSubscribe, subscribe_flags_, nullptr, 0, 0, &r));
    events_lost_ = true;
  }
  // GPU exports too. One the new agent refuses (no GPU path there) is logged and
  // its requests are refused by the agent: the session itself goes on.
  for (const GpuExport& x : gpu_exports_) {
    const agent::GpuExportEntry& e = x.e;
    std::string why;
    Status st = send_gpu_export(x, &why);
    if (st == Code::kConnectionReset || st == Code::kTimeout) return st;
    if (!st.ok())
      LOG_WARN("client: GPU staging of %llu bytes not exported again: %s (%s)",
               static_cast<unsigned long long>(e.bytes), std::string(st.name()).c_str(),
               why.c_str());
  }
  return Code::kSuccess;
}

void Client::take_event_message(const AgentHeader& h, const uint8_t* body, uint32_t len) {
  if ((h.flags & agent::kEventsLost) != 0) events_lost_ = true;
  if (h.count > len / sizeof(agent::ChunkEvent)) {
    events_lost_ = true;  // malformed: what it said is not to be trusted
    return;
  }
  for (uint32_t i = 0; i < h.count; ++i) {
    if (events_.size() >= kMaxEvents) {  // nobody takes them: the newest are lost
      events_lost_ = true;
      return;
    }
    agent::ChunkEvent e;
    std::memcpy(&e, body + i * sizeof(e), sizeof(e));
    events_.push_back(e);
  }
}

Status Client::subscribe_events(bool every_tenant) {
  std::lock_guard<std::mutex> g(mu_);
  DPUKV_RETURN_IF_ERROR(ensure_connected());
  std::vector<uint8_t> resp;
  const uint16_t flags = every_tenant ? agent::kAllTenants : 0;
  DPUKV_RETURN_IF_ERROR(call(Op::kSubscribe, flags, nullptr, 0, 0, &resp));
  subscribe_flags_ = flags;
  subscribed_ = true;
  return Code::kSuccess;
}

Status Client::take_events(std::vector<agent::ChunkEvent>* out, bool* lost) {
  if (out == nullptr) return Code::kInvalidValue;
  std::lock_guard<std::mutex> g(mu_);
  if (!subscribed_) return Code::kBadState;
  Status st = ensure_connected();
  if (st.ok()) pe_->progress();
  out->clear();
  out->swap(events_);
  if (lost != nullptr) *lost = events_lost_;
  events_lost_ = false;
  return st;
}

bool Client::agent_rows() {
  std::lock_guard<std::mutex> g(mu_);
  return ensure_connected().ok() && agent_rows_;
}

Status Client::ensure_connected() {
  if (ch_ && ch_->state() == CtxState::kRunning && !lost_) return Code::kSuccess;
  // Let a dying channel reach IDLE without waiting on it.
  for (int i = 0; i < 4 && ch_ && ch_->state() == CtxState::kStopping; ++i) pe_->progress();
  if (monotonic_ns() - last_attempt_ns_ <
      static_cast<uint64_t>(opts_.reconnect_interval_ms) * 1000000ull)
    return Code::kConnectionReset;  // fail fast; try again later
  if (ch_ && ch_->state() != CtxState::kIdle) return Code::kConnectionReset;
  Status st = open_channel(50);
  return st.ok() ? st : Status(Code::kConnectionReset);
}

bool Client::connected() {
  std::lock_guard<std::mutex> g(mu_);
  pe_->progress();
  return ch_ && ch_->state() == CtxState::kRunning && !lost_;
}

Status Client::staging_fits(size_t bytes) {
  uint64_t have = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& m : staging_) have += m.map->length();
    for (const GpuExport& x : gpu_exports_) have += x.e.bytes;  // one cap for both
  }
  if (max_staging_ != 0 && (bytes > max_staging_ || have + bytes > max_staging_)) {
    LOG_ERR(
        "client: staging of %zu bytes refused: this client has %llu, and the agent allows "
        "%llu per client (its max_staging_size)",
        bytes, static_cast<unsigned long long>(have),
        static_cast<unsigned long long>(max_staging_));
    return Code::kTooBig;
  }
  return Code::kSuccess;
}

Status Client::alloc_staging(size_t bytes, Staging* out) {
  // Allocate and pre-fault outside the lock (gigabytes take a second or more), so
  // the keepalive thread keeps the channel's heartbeats going meanwhile.
  if (bytes == 0) return Code::kInvalidValue;
  DPUKV_RETURN_IF_ERROR(staging_fits(bytes));
  StagingMem s;
  MemRegionOptions mo;
  mo.name = "dpukv-staging";
  DPUKV_RETURN_IF_ERROR(MemRegion::create(bytes, mo, &s.mem));
  return add_staging(std::move(s), out);
}

Status Client::share_memory(void* addr, size_t bytes, Staging* out) {
  const uintptr_t pg = page_size();
  const auto a = reinterpret_cast<uintptr_t>(addr);
  if (out == nullptr || addr == nullptr || a > UINTPTR_MAX - bytes) return Code::kInvalidValue;
  // The whole pages inside the range only: bytes of other objects on its first or
  // last page are not ours to move (another thread's write there, between the copy
  // and the remap, would be lost). Rows on those pages load through staging.
  if (bytes == 0 || a > UINTPTR_MAX - bytes - pg) return Code::kInvalidValue;
  const uintptr_t first = (a + pg - 1) & ~(pg - 1);
  const uintptr_t end = (a + bytes) & ~(pg - 1);
  if (end <= first) return Code::kInvalidValue;  // no whole page inside
  DPUKV_RETURN_IF_ERROR(staging_fits(end - first));
  std::lock_guard<std::mutex> g(g_shared_mu);
  for (auto it = g_shared.begin(); it != g_shared.end();) {
    if (!(first < it->end && it->first < end)) {
      ++it;
    } else if (!still_mapped(it->first, it->dev, it->ino)) {
      it = g_shared.erase(it);  // stale: that memory was freed since
    } else {
      LOG_ERR(
          "client: %p (%zu bytes) is shared with the agent already, by a client of this "
          "process that is still open",
          addr, bytes);
      return Code::kBadState;
    }
  }
  StagingMem s;
  s.in_place = true;
  DPUKV_RETURN_IF_ERROR(MemRegion::share_in_place(reinterpret_cast<void*>(first), end - first,
                                                  "dpukv-shared", &s.mem));
  struct stat st {};
  if (fstat(s.mem->fd(), &st) != 0) return Code::kDriver;
  DPUKV_RETURN_IF_ERROR(add_staging(std::move(s), out));
  g_shared.push_back(
      {first, end, static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)});
  return Code::kSuccess;
}

Status Client::add_staging(StagingMem s, Staging* out) {
  DPUKV_RETURN_IF_ERROR(Mmap::create(s.mem->data(), s.mem->size(),
                                     kAccessLocalReadWrite | kAccessExportReadWrite, s.mem->fd(), 0,
                                     &s.map));
  DPUKV_RETURN_IF_ERROR(s.map->start());
  std::lock_guard<std::mutex> g(mu_);
  const Status conn = ensure_connected();
  if (!conn.ok()) {
    if (!opts_.absent_ok) return conn;
    // Exported with the others when the agent appears (open_channel).
    *out = Staging{s.map->addr(), s.map->length(), s.map->id()};
    staging_.push_back(std::move(s));
    return Code::kSuccess;
  }
  ComchSendTask* t;
  DPUKV_RETURN_IF_ERROR(
      ch_->export_alloc_init(ch_->connection(), *s.map, s.map->id(), UserData{}, &t));
  Status st = ch_->submit(t);
  if (!st.ok()) {
    (void)ch_->free(t);
    return st;
  }
  *out = Staging{s.map->addr(), s.map->length(), s.map->id()};
  staging_.push_back(std::move(s));
  return Code::kSuccess;
}

Status Client::wait_response(uint64_t id, std::vector<uint8_t>* out) {
  const uint64_t deadline =
      monotonic_ns() + static_cast<uint64_t>(opts_.op_timeout_ms) * 1000000ull;
  for (;;) {
    for (size_t i = 0; i < responses_.size(); ++i) {
      if (responses_[i].first != id) continue;
      *out = std::move(responses_[i].second);
      responses_.erase(responses_.begin() + static_cast<long>(i));
      return Code::kSuccess;
    }
    if (lost_ || ch_->state() != CtxState::kRunning) return Code::kConnectionReset;
    if (monotonic_ns() > deadline) return Code::kTimeout;
    pe_->wait(50000, 10);
  }
}

Status Client::call(Op op, uint16_t flags, const void* entries, uint32_t entry_size, uint32_t n,
                    std::vector<uint8_t>* response) {
  uint64_t id;
  DPUKV_RETURN_IF_ERROR(send_request(op, flags, entries, entry_size, n, &id));
  DPUKV_RETURN_IF_ERROR(wait_response(id, response));
  if (response->size() < sizeof(AgentHeader)) return Code::kCorrupted;
  AgentHeader r;
  std::memcpy(&r, response->data(), sizeof(r));
  return static_cast<Code>(r.status);
}

// count: the header's entry count, when the body is not n entries of one size.
Status Client::send_request(Op op, uint16_t flags, const void* entries, uint32_t entry_size,
                            uint32_t n, uint64_t* id, uint32_t count) {
  std::vector<uint8_t> msg(sizeof(AgentHeader) + static_cast<size_t>(entry_size) * n);
  AgentHeader h{};
  h.op = static_cast<uint16_t>(op);
  h.version = agent::kProtocolVersion;
  h.flags = flags;
  h.count = count == UINT32_MAX ? n : count;
  h.request_id = next_id_++;
  std::memcpy(msg.data(), &h, sizeof(h));
  if (n) std::memcpy(msg.data() + sizeof(h), entries, static_cast<size_t>(entry_size) * n);
  ComchSendTask* t;
  DPUKV_RETURN_IF_ERROR(ch_->send_alloc_init(ch_->connection(), msg.data(),
                                             static_cast<uint32_t>(msg.size()), UserData{}, &t));
  Status st;
  while ((st = ch_->submit(t)) == Code::kAgain) pe_->progress();
  if (!st.ok()) {
    (void)ch_->free(t);
    return st;
  }
  *id = h.request_id;
  return Code::kSuccess;
}

Status Client::raw_request(const void* msg, uint32_t len, std::vector<uint8_t>* response) {
  std::lock_guard<std::mutex> g(mu_);
  DPUKV_RETURN_IF_ERROR(ensure_connected());
  AgentHeader h{};
  if (len >= sizeof(h)) std::memcpy(&h, msg, sizeof(h));
  ComchSendTask* t;
  DPUKV_RETURN_IF_ERROR(ch_->send_alloc_init(ch_->connection(), msg, len, UserData{}, &t));
  Status st = ch_->submit(t);
  if (!st.ok()) {
    (void)ch_->free(t);
    return st;
  }
  return wait_response(h.request_id, response);
}

}  // namespace dpukv
