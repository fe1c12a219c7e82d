// Compress engine (doca_compress): compress and decompress tasks on software
// engine threads (the stand-in for the hardware compress engine), with the
// checksums and, for lossy KV codecs, the error of every encode.
//
// A task reads the data section of src and writes after the data of dst (whose
// data_len grows by the output). Both are single buffers (no lists). Bad input
// completes the task with an error: a destination too small (TOO_BIG), corrupt
// compressed data (CORRUPTED), buffers outside their maps or overlapping
// (INVALID_VALUE), a read-only destination (NOT_PERMITTED).
#pragma once

#include <memory>
#include <vector>

#include "engines/compress/codec.h"
#include "runtime/buf.h"
#include "runtime/context.h"
#include "runtime/task_engine.h"

namespace dpukv {

struct CompressOptions {
  uint32_t num_threads = 1;
  uint32_t queue_depth = 64;
  uint64_t max_buf_size = 32ull << 20;  // largest input or output of a task
  uint32_t spin_us = 100;
  int first_cpu = -1;
};

struct CompressCaps {
  uint64_t max_buf_size;
  uint32_t max_inflight;
  bool supports(CompressAlgo a) const { return a < CompressAlgo::kCount_; }
};

class CompressEngine;

class CompressTask {
 public:
  enum class Op : uint8_t { kCompress, kDecompress };
  Buf* src() const { return src_; }
  Buf* dst() const { return dst_; }
  Status status() const { return status_; }
  const CodecResult& result() const { return result_; }
  UserData user_data() const { return ud_; }

 private:
  friend class CompressEngine;
  friend class TaskEngine<CompressTask>;
  enum class State : uint8_t { kFree, kAllocated, kInFlight };
  Op op_ = Op::kCompress;
  CompressAlgo algo_ = CompressAlgo::kLz4Block;
  CodecParams params_;
  Buf* src_ = nullptr;
  Buf* dst_ = nullptr;
  UserData ud_{};
  Status status_;
  CodecResult result_;
  State state_ = State::kFree;
};

using CompressCb = void (*)(CompressTask* task, UserData task_ud, UserData ctx_ud);

class CompressEngine final : public Context {
 public:
  static Status create(ProgressEngine* pe, const CompressOptions& opts,
                       std::unique_ptr<CompressEngine>* out);
  ~CompressEngine() override;

  CompressCaps caps() const { return {opts_.max_buf_size, opts_.queue_depth * opts_.num_threads}; }
  Status set_conf(CompressCb on_done, CompressCb on_error, uint32_t num_tasks);  // IDLE only

  Status task_alloc_init(CompressTask::Op op, CompressAlgo algo, const CodecParams& params,
                         Buf* src, Buf* dst, UserData ud, CompressTask** out);
  Status submit(CompressTask* t);  // AGAIN when every queue is full
  Status free(CompressTask* t);

 private:
  CompressEngine(ProgressEngine* pe, const CompressOptions& opts) : Context(pe), opts_(opts) {}
  Status do_start() override;
  void do_stop() override;
  bool drained() override;
  size_t poll() override;
  bool arm_notification() override;
  static void execute(CompressTask* t, bool flushing, void* self, uint32_t worker);

  CompressOptions opts_;
  std::vector<std::unique_ptr<CodecScratch>> scratch_;  // one per engine thread
  TaskEngine<CompressTask> core_;
};

}  // namespace dpukv
