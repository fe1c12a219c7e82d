#include "engines/compress/compress_engine.h"

#include "runtime/buf_checks.h"

namespace dpukv {

Status CompressEngine::create(ProgressEngine* pe, const CompressOptions& opts,
                              std::unique_ptr<CompressEngine>* out) {
  if (pe == nullptr || out == nullptr || opts.num_threads == 0 || opts.num_threads > 64 ||
      opts.queue_depth == 0 || opts.max_buf_size == 0 || opts.max_buf_size > (1ull << 32))
    return Code::kInvalidValue;
  out->reset(new CompressEngine(pe, opts));
  return Code::kSuccess;
}

CompressEngine::~CompressEngine() {
  workers_.stop();
}

Status CompressEngine::set_conf(CompressCb on_done, CompressCb on_error, uint32_t num_tasks) {
  DPUKV_RETURN_IF_ERROR(require_idle());
  if (on_done == nullptr || on_error == nullptr || num_tasks == 0) return Code::kInvalidValue;
  DPUKV_RETURN_IF_ERROR(pool_.reset(num_tasks));
  on_done_ = on_done;
  on_error_ = on_error;
  return Code::kSuccess;
}

Status CompressEngine::do_start() {
  if (pool_.size() == 0) return Code::kBadState;
  scratch_.clear();
  for (uint32_t i = 0; i < opts_.num_threads; ++i) {
    std::unique_ptr<CodecScratch> s;
    DPUKV_RETURN_IF_ERROR(CodecScratch::create(opts_.max_buf_size, &s));
    scratch_.push_back(std::move(s));
  }
  rejected_ = std::make_unique<SpscRing<CompressTask*>>(pool_.size());
  EngineWorkersOptions wo;
  wo.num_threads = opts_.num_threads;
  wo.sq_depth = opts_.queue_depth;
  wo.cq_depth = pool_.size();
  wo.spin_us = opts_.spin_us;
  wo.first_cpu = opts_.first_cpu;
  return workers_.start(wo, &CompressEngine::execute, this, pe());
}

void CompressEngine::do_stop() {
  workers_.flush();
}

bool CompressEngine::drained() {
  if (inflight_ != 0 || pool_.outstanding() != 0) return false;
  workers_.stop();
  rejected_.reset();
  scratch_.clear();
  return true;
}

void CompressEngine::execute(CompressTask* t, bool flushing, void* self, uint32_t worker) {
  if (flushing) {
    t->status_ = Code::kShutdown;
    return;
  }
  auto* e = static_cast<CompressEngine*>(self);
  CodecScratch* s = e->scratch_[worker].get();
  Buf* d = t->dst_;
  uint8_t* out = d->data() + d->data_len();
  const size_t cap = d->tail_room();
  t->status_ = t->op_ == CompressTask::Op::kCompress
                   ? codec_compress(t->algo_, t->params_, t->src_->data(), t->src_->data_len(), out,
                                    cap, s, &t->result_)
                   : codec_decompress(t->algo_, t->params_, t->src_->data(), t->src_->data_len(),
                                      out, cap, s, &t->result_);
  if (t->status_.ok()) (void)d->set_data_len(d->data_len() + t->result_.out_len);
}

Status CompressEngine::task_alloc_init(CompressTask::Op op, CompressAlgo algo,
                                       const CodecParams& params, Buf* src, Buf* dst, UserData ud,
                                       CompressTask** out) {
  if (out == nullptr) return Code::kInvalidValue;
  CompressTask* t = pool_.alloc();
  if (t == nullptr) return Code::kNoMemory;
  t->op_ = op;
  t->algo_ = algo;
  t->params_ = params;
  t->src_ = src;
  t->dst_ = dst;
  t->ud_ = ud;
  t->status_ = Code::kSuccess;
  t->result_ = {};
  t->state_ = CompressTask::State::kAllocated;
  *out = t;
  return Code::kSuccess;
}

Status CompressEngine::free(CompressTask* t) {
  if (!pool_.owns(t) || t->state_ != CompressTask::State::kAllocated) return Code::kInvalidValue;
  t->state_ = CompressTask::State::kFree;
  pool_.free(t);
  return Code::kSuccess;
}

Status CompressEngine::submit(CompressTask* t) {
  if (!pool_.owns(t) || t->state_ != CompressTask::State::kAllocated) return Code::kInvalidValue;
  if (state() != CtxState::kRunning) return Code::kBadState;
  Status v = check_transfer(t->src_, t->dst_, 1, opts_.max_buf_size, false);
  if (v.ok() && !caps().supports(t->algo_)) v = Code::kNotSupported;
  t->state_ = CompressTask::State::kInFlight;
  if (!v.ok()) {
    t->status_ = v;
    (void)rejected_->push(t);
    ++inflight_;
    return Code::kSuccess;
  }
  if (!workers_.submit(t)) {
    t->state_ = CompressTask::State::kAllocated;
    return Code::kAgain;
  }
  ++inflight_;
  return Code::kSuccess;
}

void CompressEngine::complete(CompressTask* t) {
  --inflight_;
  t->state_ = CompressTask::State::kAllocated;
  if (state() == CtxState::kStopping && t->status_.ok()) t->status_ = Code::kShutdown;
  (t->status_.ok() ? on_done_ : on_error_)(t, t->ud_, user_data());
}

size_t CompressEngine::poll() {
  CompressTask* batch[64];
  size_t events = 0, n;
  if (rejected_)
    while ((n = rejected_->pop_bulk(batch, 64)) != 0) {
      for (size_t i = 0; i < n; ++i) complete(batch[i]);
      events += n;
    }
  while ((n = workers_.poll(batch, 64)) != 0) {
    for (size_t i = 0; i < n; ++i) complete(batch[i]);
    events += n;
  }
  return events;
}

bool CompressEngine::arm_notification() {
  bool pending = workers_.arm();
  return pending || (rejected_ && !rejected_->empty());
}

}  // namespace dpukv
