// DMA engine (doca_dma): asynchronous memcpy tasks between buffers of local and
// imported maps, with scatter-gather on either side.
//
// Software engine threads stand in for hardware queues. Each has a submission
// ring (progress-engine thread → engine thread) and a completion ring (back);
// no locks and no allocation per task. Completions are delivered by
// ProgressEngine::progress() on the progress-engine thread.
//
// Semantics, as doca_dma_task_memcpy: the source is the data sections of the src
// list; the bytes are written after the current data of each dst buffer, filling
// dst buffers in list order, and each dst buffer's data_len grows by what it got.
// Bad input (range outside a map, a destination without write permission,
// overlapping source and destination, a destination smaller than the source, a
// list longer than max_list_len) completes the task with an error; nothing is
// written.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "runtime/buf.h"
#include "runtime/context.h"
#include "runtime/copy_routines.h"
#include "runtime/spsc_ring.h"
#include "runtime/task_engine.h"
#include "runtime/task_pool.h"

namespace dpukv {

struct DmaOptions {
  uint32_t num_threads = 1;            // software engine threads (hardware queues)
  uint32_t queue_depth = 256;          // submission-ring slots per engine thread
  uint32_t max_list_len = 64;          // scatter-gather elements per side
  uint64_t max_buf_size = 1ull << 31;  // bytes per task
  uint32_t spin_us = 100;              // engine thread spins this long before sleeping
  int first_cpu = -1;                  // >= 0: pin engine thread i to CPU first_cpu + i
  CopyPolicy copy;                     // which copy routine per size
};

struct DmaCaps {
  uint64_t max_buf_size;
  uint32_t max_list_len;
  uint32_t max_inflight;  // submission slots over all engine threads
};

class DmaEngine;

class DmaMemcpyTask {
 public:
  Buf* src() const { return src_; }
  Buf* dst() const { return dst_; }
  Status status() const { return status_; }
  UserData user_data() const { return ud_; }
  // Only between completions (not while in flight).
  void set_src(Buf* b) { src_ = b; }
  void set_dst(Buf* b) { dst_ = b; }
  void set_user_data(UserData ud) { ud_ = ud; }
  // Also compute xxh3-64 of the bytes moved (as a DMA engine with a CRC offload
  // would); read it with checksum() on completion.
  void set_checksum(bool on) { want_checksum_ = on; }
  uint64_t checksum() const { return checksum_; }

 private:
  friend class DmaEngine;
  friend class TaskEngine<DmaMemcpyTask>;
  enum class State : uint8_t { kFree, kAllocated, kInFlight };
  Buf* src_ = nullptr;
  Buf* dst_ = nullptr;
  UserData ud_{};
  Status status_;
  State state_ = State::kFree;
  bool want_checksum_ = false;
  uint64_t checksum_ = 0;
};

using DmaMemcpyCb = void (*)(DmaMemcpyTask* task, UserData task_ud, UserData ctx_ud);

class DmaEngine final : public Context {
 public:
  static Status create(ProgressEngine* pe, const DmaOptions& opts, std::unique_ptr<DmaEngine>* out);
  ~DmaEngine() override;

  DmaCaps caps() const;

  // Configuration, IDLE only: callbacks and the number of memcpy tasks in the pool.
  Status set_memcpy_conf(DmaMemcpyCb on_done, DmaMemcpyCb on_error, uint32_t num_tasks);

  // NO_MEMORY when the pool is empty.
  Status memcpy_alloc_init(Buf* src, Buf* dst, UserData ud, DmaMemcpyTask** out);
  // SUCCESS: the task will complete through a callback (possibly an error one).
  // AGAIN: every submission ring is full; retry after progress(). BAD_STATE: not RUNNING.
  Status submit(DmaMemcpyTask* task);
  // Returns an allocated, not in-flight task to the pool.
  Status free(DmaMemcpyTask* task);

  // Checks a src/dst pair as submit does; exposed for callers that want to know early.
  Status validate(const Buf* src, const Buf* dst) const;

  uint32_t inflight() const { return core_.inflight(); }

 private:
  DmaEngine(ProgressEngine* pe, const DmaOptions& opts);
  Status do_start() override;
  void do_stop() override;
  bool drained() override;
  size_t poll() override;
  bool arm_notification() override;
  static void execute(DmaMemcpyTask* t, bool flushing, void* self, uint32_t worker);

  DmaOptions opts_;
  TaskEngine<DmaMemcpyTask> core_;
};

}  // namespace dpukv
