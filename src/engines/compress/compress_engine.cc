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
  core_.stop_threads();
}

Status CompressEngine::set_conf(CompressCb on_done, CompressCb on_error, uint32_t num_tasks) {
  DPUKV_RETURN_IF_ERROR(require_idle());
  return core_.configure(on_done, on_error, num_tasks);
}

Status CompressEngine::do_start() {
  scratch_.clear();
  for (uint32_t i = 0; i < opts_.num_threads; ++i) {
    std::unique_ptr<CodecScratch> s;
    DPUKV_RETURN_IF_ERROR(CodecScratch::create(opts_.max_buf_size, &s));
    scratch_.push_back(std::move(s));
  }
  EngineWorkersOptions wo;
  wo.num_threads = opts_.num_threads;
  wo.sq_depth = opts_.queue_depth;
  wo.spin_us = opts_.spin_us;
  wo.first_cpu = opts_.first_cpu;
  return core_.start(wo, &CompressEngine::execute, this, pe());
}

void CompressEngine::do_stop() {
  core_.flush();
}

bool CompressEngine::drained() {
  if (!core_.drained()) return false;
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
  CompressTask* t = core_.alloc();
  if (t == nullptr) return Code::kNoMemory;
  t->op_ = op;
  t->algo_ = algo;
  t->params_ = params;
  t->src_ = src;
  t->dst_ = dst;
  t->ud_ = ud;
  t->result_ = {};
  *out = t;
  return Code::kSuccess;
}

Status CompressEngine::free(CompressTask* t) {
  return core_.free(t);
}

Status CompressEngine::submit(CompressTask* t) {
  if (!core_.allocated(t)) return Code::kInvalidValue;
  if (state() != CtxState::kRunning) return Code::kBadState;
  Status v = check_transfer(t->src_, t->dst_, 1, opts_.max_buf_size, false);
  if (v.ok() && !caps().supports(t->algo_)) v = Code::kNotSupported;
  return core_.submit(t, v);
}

size_t CompressEngine::poll() {
  return core_.poll(state() == CtxState::kStopping, user_data());
}

bool CompressEngine::arm_notification() {
  return core_.arm();
}

}  // namespace dpukv
