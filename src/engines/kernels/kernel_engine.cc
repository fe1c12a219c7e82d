#include "engines/kernels/kernel_engine.h"

#include <time.h>

#include <cstring>

#include "engines/compress/checksum.h"

namespace dpukv {
namespace {

void k_quantize(const KernelArgs& a, uint32_t t, uint32_t n, KernelScratch* s) {
  for (uint32_t i = t; i < a.count; i += n)
    a.status[i] = kv_encode(a.params, a.src[i], a.src_len[i], a.dst[i], a.dst_cap[i], &s->kv,
                            &a.out_len[i], nullptr);
}

void k_dequantize(const KernelArgs& a, uint32_t t, uint32_t n, KernelScratch* s) {
  for (uint32_t i = t; i < a.count; i += n)
    a.status[i] = kv_decode(a.src[i], a.src_len[i], a.dst[i], a.dst_cap[i], &s->kv, &a.out_len[i]);
}

void k_checksum(const KernelArgs& a, uint32_t t, uint32_t n, KernelScratch*) {
  for (uint32_t i = t; i < a.count; i += n) {
    a.out_value[i] = a.crc32c ? crc32c(a.src[i], a.src_len[i]) : xxh3_64(a.src[i], a.src_len[i]);
    a.status[i] = Code::kSuccess;
  }
}

// Copies tokens [token_begin, token_end) of every slab of each chunk, slab after slab.
void k_gather(const KernelArgs& a, uint32_t t, uint32_t n, KernelScratch*) {
  const KvShape& sh = a.params.shape;
  const size_t row = static_cast<size_t>(sh.channels) * 2;
  const uint32_t tb = a.token_begin, te = a.token_end;
  for (uint32_t i = t; i < a.count; i += n) {
    if (tb >= te || te > sh.tokens || a.src_len[i] != sh.elements() * 2) {
      a.status[i] = Code::kInvalidValue;
      continue;
    }
    const size_t out = static_cast<size_t>(sh.slabs) * (te - tb) * row;
    if (a.dst_cap[i] < out) {
      a.status[i] = Code::kTooBig;
      continue;
    }
    for (uint32_t s = 0; s < sh.slabs; ++s)
      std::memcpy(a.dst[i] + static_cast<size_t>(s) * (te - tb) * row,
                  a.src[i] + (static_cast<size_t>(s) * sh.tokens + tb) * row, (te - tb) * row);
    a.out_len[i] = out;
    a.status[i] = Code::kSuccess;
  }
}

}  // namespace

Status KernelEngine::create(const KernelEngineOptions& o, std::unique_ptr<KernelEngine>* out) {
  if (o.num_threads == 0 || o.num_threads > 64 || o.max_launches == 0) return Code::kInvalidValue;
  std::unique_ptr<KernelEngine> e(new KernelEngine());
  e->max_launches_ = o.max_launches;
  e->launches_.reset(new Launch[o.max_launches]);
  uint32_t id;
  (void)e->register_kernel("quantize", k_quantize, &id);
  (void)e->register_kernel("dequantize", k_dequantize, &id);
  (void)e->register_kernel("checksum", k_checksum, &id);
  (void)e->register_kernel("gather", k_gather, &id);
  for (uint32_t i = 0; i < o.num_threads; ++i) {
    // Every launch can put at most one slice per thread index on a worker.
    e->workers_.push_back(std::make_unique<Worker>(static_cast<size_t>(o.max_launches) * 64));
    e->workers_.back()->scratch.kv.reserve(o.max_chunk_bytes);
  }
  for (auto& w : e->workers_) {
    Worker* wp = w.get();
    KernelEngine* ep = e.get();
    w->thread = std::thread([ep, wp] { ep->run(wp); });
  }
  *out = std::move(e);
  return Code::kSuccess;
}

KernelEngine::~KernelEngine() {
  quit_.store(true, std::memory_order_release);
  for (auto& w : workers_) {
    w->seq.fetch_add(1);
    futex_wake(&w->seq);
  }
  for (auto& w : workers_) w->thread.join();
}

Status KernelEngine::register_kernel(const std::string& name, KernelFn fn, uint32_t* id) {
  if (fn == nullptr || name.empty() || id == nullptr) return Code::kInvalidValue;
  uint32_t existing;
  if (find(name, &existing).ok()) return Code::kBadState;
  kernels_.emplace_back(name, fn);
  *id = static_cast<uint32_t>(kernels_.size() - 1);
  return Code::kSuccess;
}

Status KernelEngine::find(const std::string& name, uint32_t* id) const {
  for (size_t i = 0; i < kernels_.size(); ++i)
    if (kernels_[i].first == name) {
      *id = static_cast<uint32_t>(i);
      return Code::kSuccess;
    }
  return Code::kNotFound;
}

Status KernelEngine::launch(uint32_t kernel, const KernelArgs* args, uint32_t nthreads,
                            const SyncEvent* wait, uint64_t wait_gt, SyncEvent* done,
                            uint64_t done_value) {
  if (kernel >= kernels_.size() || args == nullptr || nthreads == 0 || nthreads > 64)
    return Code::kInvalidValue;
  Launch* l = nullptr;
  for (uint32_t i = 0; i < max_launches_; ++i)
    if (launches_[i].remaining.load(std::memory_order_acquire) == 0) {
      l = &launches_[i];
      break;
    }
  if (l == nullptr) return Code::kAgain;
  l->fn = kernels_[kernel].second;
  l->args = args;
  l->nthreads = nthreads;
  l->wait = wait;
  l->wait_gt = wait_gt;
  l->done = done;
  l->done_value = done_value;
  l->remaining.store(nthreads, std::memory_order_release);
  for (uint32_t t = 0; t < nthreads; ++t) {
    Worker* w = workers_[next_worker_].get();
    next_worker_ = (next_worker_ + 1) % static_cast<uint32_t>(workers_.size());
    // Cannot fail: a worker holds at most 64 slices per launch slot.
    (void)w->ring.push(Slice{l, t});
    w->seq.fetch_add(1, std::memory_order_release);
    futex_wake(&w->seq);
  }
  return Code::kSuccess;
}

void KernelEngine::run(Worker* w) {
  // Slices whose wait event is not satisfied yet are set aside, not waited on: a
  // launch queued behind one that waits for it must still run (events in any order).
  std::vector<Slice> deferred;
  deferred.reserve(static_cast<size_t>(max_launches_) * 64);
  auto ready = [](const Slice& s) {
    return s.launch->wait == nullptr || s.launch->wait->get() > s.launch->wait_gt;
  };
  auto execute = [&](const Slice& s) {
    Launch* l = s.launch;
    l->fn(*l->args, s.thread, l->nthreads, &w->scratch);
    // Read what completion needs before the decrement: at 0 the slot may be reused.
    SyncEvent* done = l->done;
    const uint64_t value = l->done_value;
    if (l->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1 && done != nullptr)
      done->set(value);
  };
  for (;;) {
    bool ran = false;
    for (size_t i = 0; i < deferred.size();) {
      if (ready(deferred[i])) {
        Slice s = deferred[i];
        deferred[i] = deferred.back();
        deferred.pop_back();
        execute(s);
        ran = true;
      } else {
        ++i;
      }
    }
    const uint32_t seen = w->seq.load(std::memory_order_acquire);
    Slice s;
    if (w->ring.pop(&s)) {
      if (ready(s))
        execute(s);
      else
        deferred.push_back(s);
      continue;
    }
    if (ran) continue;
    if (quit_.load(std::memory_order_acquire)) return;
    if (!deferred.empty()) {
      // Events are set by other threads without telling us; look again shortly.
      timespec ts{0, 20000};
      nanosleep(&ts, nullptr);
      continue;
    }
    futex_wait(&w->seq, seen);
  }
}

}  // namespace dpukv
