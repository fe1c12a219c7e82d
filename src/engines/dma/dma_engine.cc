#include "engines/dma/dma_engine.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack, no allocation per task
#include <xxhash.h>

#include "runtime/buf_checks.h"
#include "runtime/chunk_checksum.h"
#include "runtime/log.h"
#include "runtime/mmap.h"

namespace dpukv {

void DmaEngine::execute(DmaMemcpyTask* t, bool flushing, void* self, uint32_t /*worker*/) {
  if (flushing) {
    t->status_ = Code::kShutdown;
    return;
  }
  const CopyPolicy& copy = static_cast<DmaEngine*>(self)->opts_.copy;
  // With a checksum, pieces are hashed first (which pulls them into the cache) and
  // then copied from the cache, so the source is read from memory once.
  constexpr size_t kPiece = 256 * 1024;
  alignas(64) XXH3_state_t hs;
  if (t->want_checksum_) XXH3_64bits_reset(&hs);
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
    if (t->want_checksum_ && n > kPiece) n = kPiece;
    if (t->want_checksum_) chunk_checksum_update(&hs, s->data() + s_off, n);
    copy.pick(n)(d->data() + d->data_len(), s->data() + s_off, n);
    (void)d->set_data_len(d->data_len() + n);
    s_off += n;
  }
  if (t->want_checksum_) t->checksum_ = XXH3_64bits_digest(&hs);
  t->status_ = Code::kSuccess;
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
  core_.stop_threads();
}

DmaCaps DmaEngine::caps() const {
  return {opts_.max_buf_size, opts_.max_list_len, opts_.queue_depth * opts_.num_threads};
}

Status DmaEngine::set_memcpy_conf(DmaMemcpyCb on_done, DmaMemcpyCb on_error, uint32_t num_tasks) {
  DPUKV_RETURN_IF_ERROR(require_idle());
  return core_.configure(on_done, on_error, num_tasks);
}

Status DmaEngine::do_start() {
  EngineWorkersOptions wo;
  wo.num_threads = opts_.num_threads;
  wo.sq_depth = opts_.queue_depth;
  wo.spin_us = opts_.spin_us;
  wo.first_cpu = opts_.first_cpu;
  return core_.start(wo, &DmaEngine::execute, this, pe());
}

void DmaEngine::do_stop() {
  core_.flush();
}
bool DmaEngine::drained() {
  return core_.drained();
}

Status DmaEngine::memcpy_alloc_init(Buf* src, Buf* dst, UserData ud, DmaMemcpyTask** out) {
  if (out == nullptr) return Code::kInvalidValue;
  DmaMemcpyTask* t = core_.alloc();
  if (t == nullptr) return Code::kNoMemory;
  t->src_ = src;
  t->dst_ = dst;
  t->ud_ = ud;
  t->want_checksum_ = false;
  t->checksum_ = 0;
  *out = t;
  return Code::kSuccess;
}

Status DmaEngine::free(DmaMemcpyTask* t) {
  return core_.free(t);
}

Status DmaEngine::validate(const Buf* src, const Buf* dst) const {
  return check_transfer(src, dst, opts_.max_list_len, opts_.max_buf_size, true);
}

Status DmaEngine::submit(DmaMemcpyTask* t) {
  if (!core_.allocated(t)) return Code::kInvalidValue;
  if (state() != CtxState::kRunning) return Code::kBadState;
  return core_.submit(t, validate(t->src_, t->dst_));
}

size_t DmaEngine::poll() {
  return core_.poll(state() == CtxState::kStopping, user_data());
}

bool DmaEngine::arm_notification() {
  return core_.arm();
}

}  // namespace dpukv
