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

Status Client::send_gpu_export(const GpuExport& x, std::string* why) {
  std::vector<uint8_t> resp;
  DPUKV_RETURN_IF_ERROR(call(Op::kGpuProof, 0, nullptr, 0, 0, &resp));
  if (resp.size() != sizeof(AgentHeader) + agent::kGpuProofBytes) {
    *why = "the agent's proof has the wrong size";
    return Code::kCorrupted;
  }
  uint8_t old[agent::kGpuProofBytes];
  DPUKV_RETURN_IF_ERROR(write_device(x.device_ptr, x.device, resp.data() + sizeof(AgentHeader), old,
                                     sizeof(old), why));
  resp.clear();
  Status st = call(Op::kGpuExport, 0, &x.e, sizeof(x.e), 1, &resp);
  if (!st.ok() && resp.size() > sizeof(AgentHeader))
    why->assign(reinterpret_cast<const char*>(resp.data()) + sizeof(AgentHeader),
                resp.size() - sizeof(AgentHeader));
  std::string restore_why;
  const Status restored =
      write_device(x.device_ptr, x.device, old, nullptr, sizeof(old), &restore_why);
  if (!restored.ok() && st.ok()) {
    // The caller is told the export failed: the agent must not keep it either.
    std::vector<uint8_t> r;
    (void)call(Op::kGpuRelease, 0, &x.e.map_id, sizeof(x.e.map_id), 1, &r);
    *why = restore_why;
    return restored;
  }
  return st;
}

// Copies n bytes to device memory (first saving what was there into old, when not
// null), with every earlier piece of work of the context finished first: the
// range may be staging a stream of the caller's still reads (after a reconnect).
Status Client::write_device(uint64_t device_ptr, int device, const void* src, void* old, size_t n,
                            std::string* why) {
  if (!cuda_) DPUKV_RETURN_IF_ERROR(cuda::Driver::open(&cuda_, why));
  using namespace cuda;  // NOLINT(google-build-using-namespace): the driver's names
  const Driver& d = *cuda_;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUresult r = d.device_get(&dev, device);
  if (r == kCudaSuccess) r = d.primary_ctx_retain(&ctx, dev);
  if (r != kCudaSuccess) {
    *why = "CUDA device " + std::to_string(device) + ": " + d.error_name(r);
    return Driver::to_status(r);
  }
  r = d.ctx_set_current(ctx);
  if (r == kCudaSuccess) r = d.ctx_synchronize();
  if (r == kCudaSuccess && old != nullptr) r = d.memcpy_dtoh_async(old, device_ptr, n, nullptr);
  if (r == kCudaSuccess) r = d.stream_synchronize(nullptr);
  if (r == kCudaSuccess) r = d.memcpy_htod_async(device_ptr, src, n, nullptr);
  if (r == kCudaSuccess) r = d.stream_synchronize(nullptr);
  (void)d.primary_ctx_release(dev);
  if (r != kCudaSuccess) {
    *why = "writing the export's proof into GPU memory: " + d.error_name(r);
    return Driver::to_status(r);
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

bool Client::agent_gpu() {
  std::lock_guard<std::mutex> g(mu_);
  return ensure_connected().ok() && agent_gpu_;
}

Status Client::export_gpu(uint64_t device_ptr, size_t bytes, int device, GpuStaging* out,
                          std::string* why) {
  std::string scratch;
  if (why == nullptr) why = &scratch;
  if (out == nullptr || bytes == 0 || device_ptr == 0 || device < 0) {
    *why = "no memory named";
    return Code::kInvalidValue;
  }
  if (bytes < agent::kGpuProofBytes) {
    *why = "a GPU export is at least " + std::to_string(agent::kGpuProofBytes) +
           " bytes (it carries the proof the sender holds it)";
    return Code::kInvalidValue;
  }
  std::lock_guard<std::mutex> g(mu_);
  DPUKV_RETURN_IF_ERROR(ensure_connected());
  if (!agent_gpu_) {
    *why = "the agent has no GPU path (`dpukv stat` says why)";
    return Code::kNotSupported;
  }
  if (!cuda_) DPUKV_RETURN_IF_ERROR(cuda::Driver::open(&cuda_, why));
  using namespace cuda;  // NOLINT(google-build-using-namespace): the driver's names
  const Driver& d = *cuda_;
  CUdevice dev = 0;
  CUuuid uuid;
  CUcontext ctx = nullptr;
  CUresult r = d.device_get(&dev, device);
  if (r == kCudaSuccess) r = d.device_get_uuid(&uuid, dev);
  if (r == kCudaSuccess) r = d.primary_ctx_retain(&ctx, dev);
  if (r != kCudaSuccess) {
    *why = "CUDA device " + std::to_string(device) + ": " + d.error_name(r);
    return Driver::to_status(r);
  }
  // The primary context is the one torch and the runtime API use: making it
  // current on this thread changes nothing for them.
  r = d.ctx_set_current(ctx);
  CUdeviceptr base = 0;
  size_t alloc = 0;
  if (r == kCudaSuccess) r = d.mem_get_address_range(&base, &alloc, device_ptr);
  agent::GpuExportEntry e{};
  CUipcMemHandle h;
  if (r == kCudaSuccess && (device_ptr - base > alloc || bytes > alloc - (device_ptr - base))) {
    (void)d.primary_ctx_release(dev);
    *why = "the range leaves its allocation of " + std::to_string(alloc) + " bytes";
    return Code::kInvalidValue;
  }
  if (r == kCudaSuccess) r = d.ipc_get_mem_handle(&h, base);
  (void)d.primary_ctx_release(dev);
  if (r != kCudaSuccess) {
    *why = "not exportable device memory: " + d.error_name(r);
    return Code::kInvalidValue;
  }
  e.map_id = agent::kGpuMapBit | next_gpu_id_++;
  e.offset = device_ptr - base;
  e.bytes = bytes;
  std::memcpy(e.device_uuid, uuid.bytes, sizeof(e.device_uuid));
  std::memcpy(e.handle, h.reserved, sizeof(e.handle));
  const GpuExport x{e, device_ptr, device};
  DPUKV_RETURN_IF_ERROR(send_gpu_export(x, why));
  gpu_exports_.push_back(x);
  *out = GpuStaging{device_ptr, bytes, device, e.map_id};
  return Code::kSuccess;
}

Status Client::release_gpu(const GpuStaging& gs) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = std::find_if(gpu_exports_.begin(), gpu_exports_.end(),
                         [&](const GpuExport& x) { return x.e.map_id == gs.id; });
  // Not NOT_FOUND: bindings read that as "no agent", and the agent is not the issue.
  if (it == gpu_exports_.end()) return Code::kInvalidValue;
  gpu_exports_.erase(it);
  DPUKV_RETURN_IF_ERROR(ensure_connected());
  std::vector<uint8_t> resp;
  return call(Op::kGpuRelease, 0, &gs.id, sizeof(gs.id), 1, &resp);
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

namespace {
// The one batch splitter: cuts n IoEntries into messages of at most per_msg and
// calls send(base, entries, count) for each, in order, until it returns false.
template <typename Send>
void for_each_message(const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                      const uint64_t* lengths, uint32_t n, uint32_t per_msg,
                      std::vector<IoEntry>* scratch, Send send) {
  for (uint32_t base = 0; base < n; base += per_msg) {
    const uint32_t k = std::min(per_msg, n - base);
    scratch->resize(k);
    for (uint32_t i = 0; i < k; ++i)
      (*scratch)[i] = IoEntry{keys[base + i], s.id, offsets[base + i], lengths[base + i]};
    if (!send(base, scratch->data(), k)) return;
  }
}
}  // namespace

Status Client::submit_io(Op op, const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                         const uint64_t* lengths, uint32_t n, Status* per_entry, Ticket* out) {
  std::lock_guard<std::mutex> g(mu_);
  if (per_entry == nullptr || out == nullptr || n == 0) return Code::kInvalidValue;
  // Not answered yet: an entry never reads SUCCESS unless the agent said so.
  for (uint32_t i = 0; i < n; ++i) per_entry[i] = Code::kInProgress;
  DPUKV_RETURN_IF_ERROR(ensure_connected());
  Pending p;
  p.ticket = next_ticket_++;
  p.per_entry = per_entry;
  const uint32_t per_msg = (ch_->connection()->max_msg() - sizeof(AgentHeader)) / sizeof(IoEntry);
  std::vector<IoEntry> es;
  for_each_message(s, keys, offsets, lengths, n, per_msg, &es,
                   [&](uint32_t base, const IoEntry* e, uint32_t k) {
                     uint64_t id;
                     Status st = send_request(op, 0, e, sizeof(IoEntry), k, &id);
                     if (!st.ok()) {
                       for (uint32_t i = base; i < n; ++i) per_entry[i] = st;
                       if (p.first.ok()) p.first = st;
                       return false;
                     }
                     p.ids.push_back(id);
                     p.bases.push_back(base);
                     p.counts.push_back(k);
                     return true;
                   });
  *out = p.ticket;
  pending_.push_back(std::move(p));
  return Code::kSuccess;
}

bool Client::collect(Ticket t) {
  auto it = std::find_if(pending_.begin(), pending_.end(),
                         [&](const Pending& p) { return p.ticket == t; });
  if (it == pending_.end()) return true;
  Pending& p = *it;
  for (size_t m = 0; m < p.ids.size(); ++m) {
    if (p.ids[m] == 0) continue;  // answered already
    auto r = std::find_if(responses_.begin(), responses_.end(),
                          [&](const auto& x) { return x.first == p.ids[m]; });
    if (r == responses_.end()) {
      if (lost_) {  // the answer will never come
        for (uint32_t i = 0; i < p.counts[m]; ++i)
          p.per_entry[p.bases[m] + i] = Code::kConnectionReset;
        if (p.first.ok()) p.first = Code::kConnectionReset;
        p.ids[m] = 0;
        ++p.answered;
      }
      continue;
    }
    const std::vector<uint8_t>& resp = r->second;
    for (uint32_t i = 0; i < p.counts[m]; ++i) {
      Status e = resp.size() >= sizeof(AgentHeader) + p.counts[m]
                     ? Status(static_cast<Code>(resp[sizeof(AgentHeader) + i]))
                     : Status(Code::kCorrupted);
      p.per_entry[p.bases[m] + i] = e;
      if (!e.ok() && p.first.ok()) p.first = e;
    }
    responses_.erase(r);
    p.ids[m] = 0;
    ++p.answered;
  }
  return p.answered == p.ids.size();
}

Status Client::submit_store(const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                            const uint64_t* lengths, uint32_t n, Status* per_entry, Ticket* out) {
  return submit_io(Op::kStore, s, keys, offsets, lengths, n, per_entry, out);
}

Status Client::submit_retrieve(const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                               const uint64_t* lengths, uint32_t n, Status* per_entry,
                               Ticket* out) {
  return submit_io(Op::kRetrieve, s, keys, offsets, lengths, n, per_entry, out);
}

Status Client::submit_retrieve_rows(const Staging& s, const ChunkKey* keys, uint32_t n,
                                    const uint64_t* row_offsets, uint32_t row_bytes,
                                    uint32_t rows_per_chunk, uint32_t last_rows, Status* per_entry,
                                    Ticket* out) {
  std::lock_guard<std::mutex> g(mu_);
  if (per_entry == nullptr || out == nullptr || keys == nullptr || row_offsets == nullptr ||
      n == 0 || row_bytes == 0 || rows_per_chunk == 0 || rows_per_chunk > agent::kMaxRowsPerChunk ||
      last_rows == 0 || last_rows > rows_per_chunk)
    return Code::kInvalidValue;
  const uint64_t rows = static_cast<uint64_t>(n - 1) * rows_per_chunk + last_rows;
  for (uint64_t r = 0; r < rows; ++r)
    if (row_offsets[r] > s.size || row_bytes > s.size - row_offsets[r]) return Code::kInvalidValue;
  for (uint32_t i = 0; i < n; ++i) per_entry[i] = Code::kInProgress;
  DPUKV_RETURN_IF_ERROR(ensure_connected());
  if (!agent_rows_) return Code::kNotSupported;
  Pending p;
  p.ticket = next_ticket_++;
  p.per_entry = per_entry;
  // Whole chunks per message: the header, then each chunk's key and row offsets.
  const uint32_t room =
      ch_->connection()->max_msg() - sizeof(AgentHeader) - sizeof(agent::RowsHeader);
  const uint32_t per_msg = room / (sizeof(ChunkKey) + rows_per_chunk * sizeof(uint64_t));
  std::vector<uint8_t> body;
  for (uint32_t base = 0; base < n; base += per_msg) {
    const uint32_t k = std::min(per_msg, n - base);
    const bool last = base + k == n;
    const agent::RowsHeader h{s.id, row_bytes, static_cast<uint16_t>(rows_per_chunk),
                              static_cast<uint16_t>(last ? last_rows : rows_per_chunk), 0};
    const uint64_t msg_rows = static_cast<uint64_t>(k - 1) * rows_per_chunk + h.last_rows;
    body.resize(sizeof(h) + k * sizeof(ChunkKey) + msg_rows * sizeof(uint64_t));
    std::memcpy(body.data(), &h, sizeof(h));
    std::memcpy(body.data() + sizeof(h), keys + base, k * sizeof(ChunkKey));
    std::memcpy(body.data() + sizeof(h) + k * sizeof(ChunkKey),
                row_offsets + static_cast<uint64_t>(base) * rows_per_chunk,
                msg_rows * sizeof(uint64_t));
    uint64_t id;
    const Status st = send_request(Op::kRetrieveRows, 0, body.data(), 1,
                                   static_cast<uint32_t>(body.size()), &id, k);
    if (!st.ok()) {
      for (uint32_t i = base; i < n; ++i) per_entry[i] = st;
      if (p.first.ok()) p.first = st;
      break;
    }
    p.ids.push_back(id);
    p.bases.push_back(base);
    p.counts.push_back(k);
  }
  *out = p.ticket;
  pending_.push_back(std::move(p));
  return Code::kSuccess;
}

Status Client::poll(Ticket t, bool* done) {
  std::lock_guard<std::mutex> g(mu_);
  pe_->progress();
  *done = collect(t);
  if (!*done) return Code::kInProgress;
  auto it = std::find_if(pending_.begin(), pending_.end(),
                         [&](const Pending& p) { return p.ticket == t; });
  if (it == pending_.end()) return Code::kNotFound;
  Status st = it->first;
  pending_.erase(it);
  return st;
}

Status Client::wait(Ticket t) {
  const uint64_t deadline =
      monotonic_ns() + static_cast<uint64_t>(opts_.op_timeout_ms) * 1000000ull;
  for (;;) {
    bool done = false;
    Status st = poll(t, &done);
    if (done) return st;
    if (monotonic_ns() > deadline) return Code::kTimeout;
    // Short sleeps: other threads need the lock too.
    std::lock_guard<std::mutex> g(mu_);
    pe_->wait(20000, 1);
  }
}

Status Client::batch_io(Op op, const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                        const uint64_t* lengths, uint32_t n, Status* per_entry, Status* call) {
  std::lock_guard<std::mutex> g(mu_);
  Status first;
  Status failed;  // the first message the agent did not answer entry by entry
  Status conn = ensure_connected();
  if (!conn.ok()) {
    for (uint32_t i = 0; i < n; ++i)
      if (per_entry) per_entry[i] = conn;
    if (call) *call = conn;
    return conn;
  }
  const uint32_t per_msg = (ch_->connection()->max_msg() - sizeof(AgentHeader)) / sizeof(IoEntry);
  std::vector<IoEntry> es;
  std::vector<uint8_t> resp;
  for_each_message(
      s, keys, offsets, lengths, n, per_msg, &es, [&](uint32_t base, const IoEntry* e, uint32_t k) {
        resp.clear();
        Status st = this->call(op, 0, e, sizeof(IoEntry), k, &resp);
        const uint8_t* codes =
            resp.size() >= sizeof(AgentHeader) + k ? resp.data() + sizeof(AgentHeader) : nullptr;
        // No entry-by-entry answer: every entry of the message failed with the call.
        const Status whole = st.ok() ? Status(Code::kCorrupted) : st;
        if (codes == nullptr && failed.ok()) failed = whole;
        for (uint32_t i = 0; i < k; ++i) {
          Status x = codes ? Status(static_cast<Code>(codes[i])) : whole;
          if (per_entry) per_entry[base + i] = x;
          if (!x.ok() && first.ok()) first = x;
        }
        return true;
      });
  if (call) *call = failed;
  return first;
}

Status Client::store(const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                     const uint64_t* lengths, uint32_t n, Status* per_entry, Status* call) {
  return batch_io(Op::kStore, s, keys, offsets, lengths, n, per_entry, call);
}

Status Client::retrieve(const Staging& s, const ChunkKey* keys, const uint64_t* offsets,
                        const uint64_t* lengths, uint32_t n, Status* per_entry, Status* call) {
  return batch_io(Op::kRetrieve, s, keys, offsets, lengths, n, per_entry, call);
}

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
