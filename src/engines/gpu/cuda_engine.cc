#include "engines/gpu/cuda_engine.h"

#include <cstring>
#include <vector>

#include "engines/gpu/verify_kernel_abi.h"
#include "runtime/chunk_checksum.h"
#include "runtime/log.h"

namespace dpukv {

using namespace cuda;  // NOLINT(google-build-using-namespace): the driver's names

namespace {
// verify_kernel.cu as PTX (scripts/gen_verify_ptx.py): the driver compiles it for
// its GPU at start, so a first request does not wait for the JIT.
constexpr char kHashKernelPtx[] =
#include "engines/gpu/verify_kernel_ptx.inc"
    ;
constexpr unsigned kHashKernelThreads = 256;  // verify_kernel.cu's kThreads
}  // namespace

CudaEngine::CudaEngine(ProgressEngine* pe, const CudaEngineOptions& o) : Context(pe), opts_(o) {}

Status CudaEngine::create(ProgressEngine* pe, const CudaEngineOptions& o,
                          std::unique_ptr<CudaEngine>* out, std::string* why) {
  if (pe == nullptr || out == nullptr || o.streams == 0 || o.max_inflight == 0 ||
      o.hash_threads == 0 || o.hash_threads > 64)
    return Code::kInvalidValue;
  std::unique_ptr<CudaEngine> e(new CudaEngine(pe, o));
  DPUKV_RETURN_IF_ERROR(o.driver_library.empty()
                            ? Driver::open(&e->drv_, why)
                            : Driver::open_library(o.driver_library, &e->drv_, why));
  Driver& d = *e->drv_;
  int count = 0;
  CUresult r = d.device_get_count(&count);
  if (r == kCudaSuccess && count == 0) r = kCudaErrorNoDevice;
  // One GPU per agent for now: device 0 (multi-GPU hosts: one agent per GPU, or
  // CUDA_VISIBLE_DEVICES).
  if (r == kCudaSuccess) r = d.device_get(&e->dev_, 0);
  CUuuid u;
  if (r == kCudaSuccess) r = d.device_get_uuid(&u, e->dev_);
  if (r == kCudaSuccess) r = d.primary_ctx_retain(&e->ctx_, e->dev_);
  if (r != kCudaSuccess) {
    *why = "CUDA device 0: " + d.error_name(r);
    e->ctx_ = nullptr;
    return Code::kNotSupported;
  }
  std::memcpy(e->uuid_, u.bytes, 16);
  *out = std::move(e);
  return Code::kSuccess;
}

CudaEngine::~CudaEngine() {
  hashers_.stop();
  if (!drv_) return;
  (void)drv_->ctx_set_current(ctx_);
  for (Stream& s : streams_)
    if (s.s != nullptr) {
      (void)drv_->stream_synchronize(s.s);
      (void)drv_->stream_destroy(s.s);
    }
  for (Copy& c : copies_)
    if (c.event != nullptr) (void)drv_->event_destroy(c.event);
  for (const Region& r : regions_)
    if (r.id != 0) (void)drv_->ipc_close_mem_handle(r.base);
  if (module_ != nullptr) (void)drv_->module_unload(module_);
  if (results_ != nullptr) (void)drv_->mem_free_host(results_);
  if (host_ != nullptr) (void)drv_->mem_host_unregister(host_);
  if (ctx_ != nullptr) (void)drv_->primary_ctx_release(dev_);
}

Status CudaEngine::do_start() {
  if (drv_->ctx_set_current(ctx_) != kCudaSuccess) return Code::kDriver;
  streams_.resize(opts_.streams);
  for (Stream& s : streams_)
    if (drv_->stream_create(&s.s, kStreamNonBlocking) != kCudaSuccess) return Code::kDriver;
  copies_.resize(opts_.max_inflight);
  free_copies_.reserve(opts_.max_inflight);
  pending_.reserve(opts_.max_inflight);
  for (Copy& c : copies_) {
    if (drv_->event_create(&c.event, kEventDisableTiming) != kCudaSuccess) return Code::kDriver;
    free_copies_.push_back(&c);
  }
  if (opts_.checksum != CudaEngineOptions::Checksum::kHost && !load_hash_kernel(&checksum_why_)) {
    if (opts_.checksum == CudaEngineOptions::Checksum::kGpu) {
      LOG_ERR("cuda engine: checksums on the GPU were asked for: %s", checksum_why_.c_str());
      return Code::kNotSupported;
    }
    LOG_WARN("cuda engine: checksums on host threads: %s", checksum_why_.c_str());
  }
  EngineWorkersOptions wo;
  wo.num_threads = opts_.hash_threads;
  wo.sq_depth = opts_.max_inflight;  // every copy may wait for its hash at once
  wo.cq_depth = opts_.max_inflight;
  return hashers_.start(wo, &CudaEngine::hash, this, pe());
}

// One block per job; the jobs travel as the launch's parameter (the driver copies it).
CUresult CudaEngine::launch_hash(dpukv_xxh3::HashJobs* jobs, CUstream s) {
  void* params[] = {jobs};
  return drv_->launch_kernel(hash_fn_, jobs->n, 1, 1, kHashKernelThreads, 1, 1, 0, s, params,
                             nullptr);
}

// At start, not at a first request: the JIT, the results' pinned memory, and one
// hash of known bytes that must equal the host's xxh3 (a driver that compiled the
// kernel differently, or a kernel that does not run, leaves checksums on the host).
bool CudaEngine::load_hash_kernel(std::string* why) {
  auto unusable = [&](std::string text) {
    *why = std::move(text);
    if (module_ != nullptr) (void)drv_->module_unload(module_);
    module_ = nullptr;
    hash_fn_ = nullptr;
    return false;
  };
  auto failed = [&](const char* what, CUresult r) {
    return unusable(std::string(what) + ": " + drv_->error_name(r));
  };
  CUresult r = drv_->module_load_data(&module_, kHashKernelPtx);
  if (r != kCudaSuccess) {
    module_ = nullptr;
    return failed("the driver does not load the checksum kernel's PTX", r);
  }
  r = drv_->module_get_function(&hash_fn_, module_, "dpukv_xxh3_64_batch");
  if (r != kCudaSuccess) return failed("the checksum kernel has no dpukv_xxh3_64_batch", r);
  if (results_ == nullptr) {
    void* p = nullptr;
    r = drv_->mem_host_alloc(&p, sizeof(uint64_t) * (opts_.max_inflight + 1),
                             kMemHostAllocPortable | kMemHostAllocDeviceMap);
    if (r != kCudaSuccess) return failed("no mapped host memory for the kernel's results", r);
    results_ = static_cast<uint64_t*>(p);
    r = drv_->mem_host_get_device_pointer(&results_dev_, results_, 0);
    if (r != kCudaSuccess) return failed("the results' memory is not mapped for the GPU", r);
  }
  // Known bytes: not a whole number of blocks, so the tail's path runs too.
  std::vector<uint8_t> probe(64 * 1024 + 40);
  for (size_t i = 0; i < probe.size(); ++i) probe[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
  CUdeviceptr dev = 0;
  r = drv_->mem_alloc(&dev, probe.size());
  if (r != kCudaSuccess) return failed("no GPU memory for the checksum kernel's check", r);
  uint64_t& got = results_[opts_.max_inflight];
  got = 0;
  for (Stream& s : streams_) {  // every stream's first copy, here
    r = drv_->memcpy_htod_async(dev, probe.data(), probe.size(), s.s);
    if (r == kCudaSuccess) r = drv_->stream_synchronize(s.s);
    if (r != kCudaSuccess) break;
  }
  dpukv_xxh3::HashJobs check{};
  check.n = 1;
  check.job[0] = {dev, probe.size(), results_dev_ + sizeof(uint64_t) * opts_.max_inflight};
  if (r == kCudaSuccess) r = launch_hash(&check, streams_[0].s);
  if (r == kCudaSuccess) r = drv_->stream_synchronize(streams_[0].s);
  (void)drv_->mem_free(dev);
  if (r != kCudaSuccess) return failed("the checksum kernel's check did not run", r);
  const uint64_t want = chunk_checksum(probe.data(), probe.size());
  if (got != want) {
    char msg[160];
    std::snprintf(msg, sizeof(msg),
                  "the checksum kernel gave %016llx for bytes whose xxh3 is %016llx",
                  static_cast<unsigned long long>(got), static_cast<unsigned long long>(want));
    return unusable(msg);
  }
  return true;
}

void CudaEngine::do_stop() {}

bool CudaEngine::drained() {
  poll();
  if (inflight_ != 0) return false;
  hashers_.stop();
  return true;
}

bool CudaEngine::arm_notification() {
  return inflight_ != 0;  // events are polled: keep the engine turning while copies run
}

// On a hash thread. flushing (the engine stops): the copy ends without its sum.
void CudaEngine::hash(Copy* c, bool flushing, void* /*self*/, uint32_t /*worker*/) {
  if (flushing) {
    c->status = Code::kShutdown;
    return;
  }
  c->hash = chunk_checksum(c->host, c->bytes);
}

// The copy owes a hash: to a hash thread (whose ring holds every copy in flight).
void CudaEngine::start_hash(Copy* c) {
  if (!hashers_.submit(c)) {  // cannot happen with the rings sized as above; still correct
    c->hash = chunk_checksum(c->host, c->bytes);
    arrive(c);
  }
}

void CudaEngine::arrive(Copy* c) {
  if (--c->owed == 0) finish(c);
}

Status CudaEngine::register_host(void* p, uint64_t bytes, std::string* why) {
  if (p == nullptr || bytes == 0 || host_ != nullptr) return Code::kInvalidValue;
  (void)drv_->ctx_set_current(ctx_);
  const CUresult r = drv_->mem_host_register(p, bytes, kMemHostRegisterPortable);
  if (r != kCudaSuccess) {
    *why = "cannot pin " + std::to_string(bytes) +
           " bytes of host memory for GPU copies: " + drv_->error_name(r) +
           (r == kCudaErrorOutOfMemory ? " (the locked-memory limit? LimitMEMLOCK=infinity)" : "");
    return Driver::to_status(r);
  }
  host_ = p;
  host_bytes_ = bytes;
  return Code::kSuccess;
}

Status CudaEngine::import(const GpuRegionDesc& d, const uint8_t* proof, uint32_t proof_len,
                          uint64_t* id, std::string* why) {
  if (id == nullptr || proof == nullptr || proof_len == 0 || proof_len > 64)
    return Code::kInvalidValue;
  if (std::memcmp(d.device_uuid, uuid_, 16) != 0) {
    ++counters_.refused;
    *why = "the region is on a GPU this agent's driver does not see (another device UUID)";
    return Code::kNotPermitted;
  }
  if (d.bytes < proof_len || d.offset + d.bytes < d.offset) {
    ++counters_.refused;
    *why = "a range shorter than its proof, or wrapping";
    return Code::kInvalidValue;
  }
  (void)drv_->ctx_set_current(ctx_);
  CUdeviceptr base = 0;
  CUresult r = drv_->ipc_open_mem_handle(&base, d.handle, kIpcMemLazyEnablePeerAccess);
  if (r != kCudaSuccess) {
    ++counters_.refused;
    *why = "the IPC handle does not open: " + drv_->error_name(r);
    return r == kCudaErrorInvalidDevice ? Status(Code::kNotPermitted) : Status(Code::kInvalidValue);
  }
  CUdeviceptr alloc = 0;
  size_t alloc_bytes = 0;
  r = drv_->mem_get_address_range(&alloc, &alloc_bytes, base);
  if (r != kCudaSuccess || alloc != base || d.offset > alloc_bytes ||
      d.bytes > alloc_bytes - d.offset) {
    (void)drv_->ipc_close_mem_handle(base);
    ++counters_.refused;
    *why = "the range [" + std::to_string(d.offset) + ", +" + std::to_string(d.bytes) +
           ") is outside its allocation of " + std::to_string(alloc_bytes) + " bytes";
    return Code::kInvalidValue;
  }
  if (!holds_proof(base + d.offset, proof, proof_len)) {
    (void)drv_->ipc_close_mem_handle(base);
    ++counters_.refused;
    *why =
        "the exported memory does not hold this session's proof: not the sender's memory "
        "(a handle of another process's allocation), or the proof was not written there";
    return Code::kNotPermitted;
  }
  uint32_t slot;
  if (!free_region_slots_.empty()) {
    slot = free_region_slots_.back();
    free_region_slots_.pop_back();
  } else if (regions_.size() < (1u << 20)) {
    slot = static_cast<uint32_t>(regions_.size());
    regions_.emplace_back();
  } else {
    (void)drv_->ipc_close_mem_handle(base);
    *why = "the agent holds 1048576 GPU regions already";
    return Code::kNoMemory;
  }
  *id = (next_region_++ << 20) | slot;
  regions_[slot] = Region{*id, base, d.offset, d.bytes, 0, false};
  ++open_regions_;
  ++counters_.imports;
  return Code::kSuccess;
}

bool CudaEngine::holds_proof(CUdeviceptr at, const uint8_t* proof, uint32_t len) {
  uint8_t got[64];
  CUstream s = nullptr;
  if (drv_->stream_create(&s, kStreamNonBlocking) != kCudaSuccess) return false;
  CUresult r = drv_->memcpy_dtoh_async(got, at, len, s);
  const CUresult sync = drv_->stream_synchronize(s);
  (void)drv_->stream_destroy(s);
  if (r != kCudaSuccess || sync != kCudaSuccess) return false;
  uint8_t diff = 0;  // every byte compared: the time says nothing of where they differ
  for (uint32_t i = 0; i < len; ++i) diff |= static_cast<uint8_t>(got[i] ^ proof[i]);
  return diff == 0;
}

void CudaEngine::close_region(uint64_t id) {
  Region* r = find_region(id);
  if (r == nullptr) return;
  (void)drv_->ctx_set_current(ctx_);
  (void)drv_->ipc_close_mem_handle(r->base);
  *r = Region{};
  free_region_slots_.push_back(static_cast<uint32_t>(id & ((1u << 20) - 1)));
  --open_regions_;
}

uint64_t CudaEngine::region_bytes(uint64_t id) const {
  const Region* r = const_cast<CudaEngine*>(this)->find_region(id);
  return r == nullptr || r->closing ? 0 : r->bytes;
}

Status CudaEngine::release(uint64_t id) {
  Region* r = find_region(id);
  if (r == nullptr || r->closing) return Code::kNotFound;
  if (r->inflight == 0)
    close_region(id);
  else
    r->closing = true;  // closed when its last copy finishes
  return Code::kSuccess;
}

Status CudaEngine::copy(uint64_t region, uint64_t offset, void* host, uint64_t bytes, bool to_gpu,
                        uint64_t* checksum, CopyCb cb, void* arg) {
  if (state() != CtxState::kRunning) return Code::kBadState;
  if (!broken_.empty()) return Code::kNotSupported;
  Region* const found = find_region(region);
  if (found == nullptr || found->closing || cb == nullptr) return Code::kInvalidValue;
  Region& r = *found;
  const auto h = reinterpret_cast<uintptr_t>(host), h0 = reinterpret_cast<uintptr_t>(host_);
  if (bytes == 0 || offset > r.bytes || bytes > r.bytes - offset || host_ == nullptr || h < h0 ||
      h - h0 > host_bytes_ || bytes > host_bytes_ - (h - h0))
    return Code::kInvalidValue;
  if (free_copies_.empty()) return Code::kAgain;
  Copy* c = free_copies_.back();
  c->region = region;
  c->cb = cb;
  c->arg = arg;
  c->dev = r.base + r.offset + offset;
  c->host = static_cast<uint8_t*>(host);
  c->bytes = bytes;
  c->checksum = checksum;
  c->status = Code::kSuccess;
  c->to_gpu = to_gpu;
  c->owed = 1;
  c->gpu_hash = checksum != nullptr && hash_fn_ != nullptr && bytes >= dpukv_xxh3::kMinLength &&
                c->dev % 8 == 0;
  c->member_next = c->queue_next = nullptr;
  free_copies_.pop_back();
  pending_.push_back(c);  // issued at the next poll, with the copies taken beside it
  ++r.inflight;
  ++inflight_;
  ++counters_.copies;
  counters_.bytes += bytes;
  if (c->gpu_hash) {
    ++counters_.gpu_hashed;
  } else if (checksum != nullptr) {
    ++counters_.host_hashed;
    if (to_gpu) {  // the source cannot change while it is read
      ++c->owed;
      start_hash(c);
    }
  }
  return Code::kSuccess;
}

// The copies taken since the last poll, in groups: copies of one direction taken
// one after another (a layer's chunks, a batch's keys) go on one stream as few
// driver copies as their ranges allow (adjacent in the arena and in the GPU
// region: one copy), one launch of the checksum kernel for those it hashes, and
// one event. Driver calls per chunk fall with the group's size, on the progress
// thread and in the driver.
void CudaEngine::flush() {
  (void)drv_->ctx_set_current(ctx_);
  const size_t n = pending_.size();
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && j - i < dpukv_xxh3::kMaxHashJobs && pending_[j]->to_gpu == pending_[i]->to_gpu)
      ++j;
    issue_group(streams_[next_stream_++ % streams_.size()], &pending_[i], j - i);
    i = j;
  }
  pending_.clear();
}

// A group on stream s: its copies (merged where adjacent), its hash kernel, its
// event on the first copy. Once a copy is queued it ends through the event, even
// if a later call fails: its arena slot is not reused while the GPU may write it.
void CudaEngine::issue_group(Stream& s, Copy* const* g, size_t n) {
  CUresult res = kCudaSuccess;
  for (size_t k = 0; k < n;) {
    size_t m = k + 1;
    uint64_t bytes = g[k]->bytes;
    while (m < n && g[m]->host == g[m - 1]->host + g[m - 1]->bytes &&
           g[m]->dev == g[m - 1]->dev + g[m - 1]->bytes) {
      bytes += g[m]->bytes;
      ++m;
    }
    if (res == kCudaSuccess) {
      res = g[k]->to_gpu ? drv_->memcpy_htod_async(g[k]->dev, g[k]->host, bytes, s.s)
                         : drv_->memcpy_dtoh_async(g[k]->host, g[k]->dev, bytes, s.s);
      ++counters_.driver_copies;
    }
    for (size_t x = k; x < m && res != kCudaSuccess; ++x) g[x]->status = Driver::to_status(res);
    k = m;
  }
  dpukv_xxh3::HashJobs jobs;
  jobs.n = 0;
  jobs.reserved = 0;
  for (size_t k = 0; k < n; ++k)
    if (g[k]->gpu_hash && g[k]->status.ok())
      jobs.job[jobs.n++] = {
          g[k]->dev, g[k]->bytes,
          results_dev_ + sizeof(uint64_t) * static_cast<uint64_t>(g[k] - copies_.data())};
  if (jobs.n != 0) {
    const CUresult k = launch_hash(&jobs, s.s);
    if (k != kCudaSuccess)  // fails the copies it was to hash, not the group's others
      for (size_t x = 0; x < n; ++x)
        if (g[x]->gpu_hash) g[x]->status = Driver::to_status(k);
  }
  for (size_t k = 0; k + 1 < n; ++k) g[k]->member_next = g[k + 1];
  ++counters_.groups;
  Copy* const first = g[0];
  const CUresult ev = drv_->event_record(first->event, s.s);
  if (ev != kCudaSuccess) {
    (void)drv_->stream_synchronize(s.s);  // nothing of this group still runs
    group_done(first, ev);
    return;
  }
  if (s.tail != nullptr)
    s.tail->queue_next = first;
  else
    s.head = first;
  s.tail = first;
}

// A group's event finished with r: each copy goes on to its hash (from the GPU on
// host threads) or ends. Callbacks may take new copies (pending until the next
// flush) and reuse these slots: each next is read before its copy ends.
void CudaEngine::group_done(Copy* first, CUresult r) {
  for (Copy* c = first; c != nullptr;) {
    Copy* const next = c->member_next;
    c->member_next = c->queue_next = nullptr;
    if (r != kCudaSuccess) {
      c->status = Driver::to_status(r);
    } else if (c->gpu_hash) {
      if (c->status.ok()) c->hash = results_[c - copies_.data()];
    } else if (c->checksum != nullptr && !c->to_gpu && c->status.ok()) {
      start_hash(c);  // the bytes landed: the hash is what it owes now
      c = next;
      continue;
    }
    arrive(c);
    c = next;
  }
}

// A copy is done (its event and, if asked, its hash): its slot, its region, its
// callback (which may issue new copies).
void CudaEngine::finish(Copy* c) {
  const Status st = c->status;
  if (st.ok() && c->checksum != nullptr) *c->checksum = c->hash;
  const CopyCb cb = c->cb;
  void* const arg = c->arg;
  const uint64_t region = c->region;
  free_copies_.push_back(c);
  --inflight_;
  Region* r = find_region(region);
  if (r != nullptr && --r->inflight == 0 && r->closing) close_region(region);
  if (!st.ok()) ++counters_.failed;
  cb(arg, st);
}

size_t CudaEngine::poll() {
  if (inflight_ == 0) return 0;
  size_t n = pending_.size();
  if (n != 0) flush();
  Copy* hashed[64];
  for (size_t k; (k = hashers_.poll(hashed, 64)) != 0; n += k)
    for (size_t i = 0; i < k; ++i) arrive(hashed[i]);
  (void)drv_->ctx_set_current(ctx_);
  for (Stream& s : streams_) {
    while (s.head != nullptr) {
      Copy* const first = s.head;
      const CUresult r = drv_->event_query(first->event);
      if (r == kCudaErrorNotReady) break;
      ++n;
      s.head = first->queue_next;
      if (s.head == nullptr) s.tail = nullptr;
      if (r == kCudaSuccess) {
        group_done(first, r);
        continue;
      }
      // The GPU failed a copy or a kernel: its group and every group after it on
      // this stream fail; the stream is replaced (CUDA's errors stick to it), or
      // the engine stops. The callbacks run after the replacement: a copy they
      // take goes on a live stream.
      LOG_ERR("cuda engine: a copy failed: %s", drv_->error_name(r).c_str());
      Copy* failed = first;
      first->queue_next = s.head;
      s.head = s.tail = nullptr;
      (void)drv_->stream_destroy(s.s);
      s.s = nullptr;
      const CUresult again = drv_->stream_create(&s.s, kStreamNonBlocking);
      ++counters_.streams_replaced;
      if (again != kCudaSuccess && broken_.empty()) {
        broken_ = "the GPU failed a copy (" + drv_->error_name(r) +
                  ") and the driver refuses new streams (" + drv_->error_name(again) +
                  "): GPU copies are off until the agent restarts";
        LOG_ERR("cuda engine: %s", broken_.c_str());
      }
      // A copy to the GPU whose hash still runs finishes when the hash comes back.
      while (failed != nullptr) {
        Copy* const next_group = failed->queue_next;
        group_done(failed, r);
        failed = next_group;
      }
      break;
    }
  }
  return n;
}

}  // namespace dpukv
