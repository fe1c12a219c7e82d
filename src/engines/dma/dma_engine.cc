#include "engines/dma/dma_engine.h"

#include <immintrin.h>
#include <sched.h>

#include <chrono>

#include "runtime/log.h"
#include "runtime/mmap.h"

namespace dpukv {

// One software engine thread: the stand-in for a hardware DMA queue.
struct DmaWorker {
  DmaWorker(size_t sq_slots, size_t cq_slots) : sq(sq_slots), cq(cq_slots) {}

  SpscRing<DmaMemcpyTask*> sq;  // progress thread → worker
  SpscRing<DmaMemcpyTask*> cq;  // worker → progress thread
  // Doorbell: 1 while the worker sleeps (or is about to). The producer publishes its
  // ring entry, then reads this; the worker sets it, then re-reads the ring. With a
  // seq_cst fence on both sides one of them always sees the other (Dekker).
  std::atomic<uint32_t> sleeping{0};
  std::atomic<bool> quit{false};
  std::thread thread;

  void ring_doorbell() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleeping.load(std::memory_order_relaxed) != 0) {
      sleeping.store(0, std::memory_order_relaxed);
      sleeping.notify_one();
    }
  }

  void run(const DmaOptions& opts, int cpu, std::atomic<bool>* flushing, std::atomic<bool>* armed,
           ProgressEngine* pe);
  static Status execute(const DmaMemcpyTask* t, const CopyPolicy& copy);
};

namespace {

// A range in the address space of its backing pages, so aliases compare equal.
struct Extent {
  uint64_t dev, ino, begin, end;
};

Extent extent_of(const Mmap* m, const uint8_t* p, size_t n) {
  const Mmap::Backing& b = m->backing();
  if (b.ino == 0) {
    auto a = reinterpret_cast<uint64_t>(p);
    return {0, 0, a, a + n};
  }
  uint64_t off = b.offset + static_cast<uint64_t>(p - m->addr());
  return {b.dev, b.ino, off, off + n};
}

bool overlaps(const Extent& a, const Extent& b) {
  return a.dev == b.dev && a.ino == b.ino && a.begin < b.end && b.begin < a.end;
}

}  // namespace

Status DmaWorker::execute(const DmaMemcpyTask* t, const CopyPolicy& copy) {
  const Buf* s = t->src();
  Buf* d = t->dst();
  size_t s_off = 0;
  while (s != nullptr) {
    size_t s_left = s->data_len() - s_off;
    if (s_left == 0) {
      s = s->next(), s_off = 0;
      continue;
    }
    // validate() proved the destination list has room for every source byte.
    while (d->tail_room() == 0) d = d->next();
    size_t n = s_left < d->tail_room() ? s_left : d->tail_room();
    copy.pick(n)(d->data() + d->data_len(), s->data() + s_off, n);
    (void)d->set_data_len(d->data_len() + n);
    s_off += n;
  }
  return Code::kSuccess;
}

void DmaWorker::run(const DmaOptions& opts, int cpu, std::atomic<bool>* flushing,
                    std::atomic<bool>* armed, ProgressEngine* pe) {
  constexpr size_t kBatch = 32;
  DmaMemcpyTask* batch[kBatch];
  if (cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
      LOG_WARN("cannot pin DMA thread to CPU %d", cpu);
  }
  const auto spin = std::chrono::microseconds(opts.spin_us);
  auto idle_since = std::chrono::steady_clock::now();
  bool idle = false;
  while (!quit.load(std::memory_order_acquire)) {
    size_t n = sq.pop_bulk(batch, kBatch);
    if (n == 0) {
      if (!idle) {
        idle = true;
        idle_since = std::chrono::steady_clock::now();
      }
      _mm_pause();
      if (std::chrono::steady_clock::now() - idle_since < spin) continue;
      sleeping.store(1, std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (!sq.empty() || quit.load(std::memory_order_acquire)) {
        sleeping.store(0, std::memory_order_relaxed);
        continue;
      }
      sleeping.wait(1, std::memory_order_acquire);
      idle = false;
      continue;
    }
    idle = false;
    const bool flush = flushing->load(std::memory_order_acquire);
    for (size_t i = 0; i < n; ++i) {
      DmaMemcpyTask* t = batch[i];
      t->status_ = flush ? Status(Code::kShutdown) : execute(t, opts.copy);
      // cq holds as many slots as the pool has tasks, so the push cannot fail.
      (void)cq.push(t);
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (armed->load(std::memory_order_relaxed) && armed->exchange(false)) pe->notify();
  }
}

DmaEngine::DmaEngine(ProgressEngine* pe, const DmaOptions& opts) : Context(pe), opts_(opts) {
  opts_.copy.resolve();
}

Status DmaEngine::create(ProgressEngine* pe, const DmaOptions& opts,
                         std::unique_ptr<DmaEngine>* out) {
  if (pe == nullptr || out == nullptr) return Code::kInvalidValue;
  if (opts.num_threads == 0 || opts.num_threads > 64 || opts.queue_depth == 0 ||
      opts.queue_depth > (1u << 20) || opts.max_list_len == 0 ||
      opts.max_list_len > BufInventory::kMaxListLen || opts.max_buf_size == 0)
    return Code::kInvalidValue;
  out->reset(new DmaEngine(pe, opts));
  return Code::kSuccess;
}

DmaEngine::~DmaEngine() {
  stop_workers();
}

DmaCaps DmaEngine::caps() const {
  return {opts_.max_buf_size, opts_.max_list_len, opts_.queue_depth * opts_.num_threads};
}

Status DmaEngine::set_memcpy_conf(DmaMemcpyCb on_done, DmaMemcpyCb on_error, uint32_t num_tasks) {
  DPUKV_RETURN_IF_ERROR(require_idle());
  if (on_done == nullptr || on_error == nullptr || num_tasks == 0) return Code::kInvalidValue;
  DPUKV_RETURN_IF_ERROR(pool_.reset(num_tasks));
  on_done_ = on_done;
  on_error_ = on_error;
  return Code::kSuccess;
}

Status DmaEngine::do_start() {
  if (pool_.size() == 0) return Code::kBadState;  // not configured
  flushing_.store(false);
  rejected_ = std::make_unique<SpscRing<DmaMemcpyTask*>>(pool_.size());
  for (uint32_t i = 0; i < opts_.num_threads; ++i) {
    workers_.push_back(std::make_unique<DmaWorker>(opts_.queue_depth, pool_.size()));
    DmaWorker* w = workers_.back().get();
    int cpu = opts_.first_cpu < 0 ? -1 : opts_.first_cpu + static_cast<int>(i);
    w->thread = std::thread([this, w, cpu] { w->run(opts_, cpu, &flushing_, &armed_, pe()); });
  }
  return Code::kSuccess;
}

void DmaEngine::do_stop() {
  flushing_.store(true, std::memory_order_release);
  for (auto& w : workers_) w->ring_doorbell();
}

void DmaEngine::stop_workers() {
  for (auto& w : workers_) {
    w->quit.store(true, std::memory_order_release);
    w->sleeping.store(0);
    w->sleeping.notify_one();
  }
  for (auto& w : workers_)
    if (w->thread.joinable()) w->thread.join();
  workers_.clear();
}

bool DmaEngine::drained() {
  if (inflight_ != 0 || pool_.outstanding() != 0) return false;
  stop_workers();
  rejected_.reset();
  return true;
}

Status DmaEngine::memcpy_alloc_init(Buf* src, Buf* dst, UserData ud, DmaMemcpyTask** out) {
  if (out == nullptr) return Code::kInvalidValue;
  DmaMemcpyTask* t = pool_.alloc();
  if (t == nullptr) return Code::kNoMemory;
  t->src_ = src;
  t->dst_ = dst;
  t->ud_ = ud;
  t->status_ = Code::kSuccess;
  t->state_ = DmaMemcpyTask::State::kAllocated;
  *out = t;
  return Code::kSuccess;
}

Status DmaEngine::free(DmaMemcpyTask* t) {
  if (!pool_.owns(t) || t->state_ != DmaMemcpyTask::State::kAllocated) return Code::kInvalidValue;
  t->state_ = DmaMemcpyTask::State::kFree;
  pool_.free(t);
  return Code::kSuccess;
}

Status DmaEngine::validate(const Buf* src, const Buf* dst) const {
  if (src == nullptr || dst == nullptr || src->refcount() == 0 || dst->refcount() == 0)
    return Code::kInvalidValue;
  if (src->list_len() > opts_.max_list_len || dst->list_len() > opts_.max_list_len)
    return Code::kTooBig;
  uint64_t src_total = 0;
  for (const Buf* s = src; s != nullptr; s = s->next()) {
    const Mmap* m = s->mmap();
    if (m == nullptr || !m->started()) return Code::kBadState;
    if (!m->readable()) return Code::kNotPermitted;
    if (!m->contains(s->data(), s->data_len())) return Code::kInvalidValue;
    src_total += s->data_len();
  }
  if (src_total > opts_.max_buf_size) return Code::kTooBig;
  uint64_t room = 0;
  for (const Buf* d = dst; d != nullptr; d = d->next()) {
    const Mmap* m = d->mmap();
    if (m == nullptr || !m->started()) return Code::kBadState;
    if (!m->writable()) return Code::kNotPermitted;
    if (!m->contains(d->data(), d->data_len() + d->tail_room())) return Code::kInvalidValue;
    room += d->tail_room();
  }
  if (room < src_total) return Code::kTooBig;
  // Overlap: compare each source segment with the bytes each destination segment
  // will actually receive. Lists are bounded by max_list_len.
  uint64_t left = src_total;
  for (const Buf* d = dst; d != nullptr && left != 0; d = d->next()) {
    size_t n = d->tail_room() < left ? d->tail_room() : static_cast<size_t>(left);
    if (n == 0) continue;
    left -= n;
    Extent de = extent_of(d->mmap(), d->data() + d->data_len(), n);
    for (const Buf* s = src; s != nullptr; s = s->next()) {
      if (s->data_len() != 0 && overlaps(de, extent_of(s->mmap(), s->data(), s->data_len())))
        return Code::kInvalidValue;
    }
  }
  return Code::kSuccess;
}

Status DmaEngine::submit(DmaMemcpyTask* t) {
  if (!pool_.owns(t) || t->state_ != DmaMemcpyTask::State::kAllocated) return Code::kInvalidValue;
  if (state() != CtxState::kRunning) return Code::kBadState;
  Status v = validate(t->src_, t->dst_);
  if (!v.ok()) {
    t->status_ = v;
    t->state_ = DmaMemcpyTask::State::kInFlight;
    (void)rejected_->push(t);  // sized to the pool: cannot fail
    ++inflight_;
    return Code::kSuccess;
  }
  const uint32_t nw = static_cast<uint32_t>(workers_.size());
  for (uint32_t i = 0; i < nw; ++i) {
    DmaWorker* w = workers_[next_worker_].get();
    next_worker_ = next_worker_ + 1 == nw ? 0 : next_worker_ + 1;
    t->state_ = DmaMemcpyTask::State::kInFlight;
    if (w->sq.push(t)) {
      ++inflight_;
      w->ring_doorbell();
      return Code::kSuccess;
    }
  }
  t->state_ = DmaMemcpyTask::State::kAllocated;
  return Code::kAgain;
}

void DmaEngine::complete(DmaMemcpyTask* t) {
  --inflight_;
  t->state_ = DmaMemcpyTask::State::kAllocated;
  if (state() == CtxState::kStopping && t->status_.ok()) t->status_ = Code::kShutdown;
  // The callback may free or resubmit the task.
  if (t->status_.ok())
    on_done_(t, t->ud_, user_data());
  else
    on_error_(t, t->ud_, user_data());
}

size_t DmaEngine::poll() {
  constexpr size_t kBatch = 64;
  DmaMemcpyTask* batch[kBatch];
  size_t events = 0;
  if (rejected_) {
    size_t n;
    while ((n = rejected_->pop_bulk(batch, kBatch)) != 0) {
      for (size_t i = 0; i < n; ++i) complete(batch[i]);
      events += n;
    }
  }
  for (size_t w = 0; w < workers_.size(); ++w) {
    size_t n = workers_[w]->cq.pop_bulk(batch, kBatch);
    for (size_t i = 0; i < n; ++i) complete(batch[i]);
    events += n;
  }
  return events;
}

bool DmaEngine::arm_notification() {
  armed_.store(true, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (rejected_ && !rejected_->empty()) return true;
  for (auto& w : workers_)
    if (!w->cq.empty()) return true;
  return false;
}

}  // namespace dpukv
