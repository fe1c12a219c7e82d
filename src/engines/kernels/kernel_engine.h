// Kernels engine (doca_dpa): named near-data functions launched over N worker
// threads. A launch waits until its wait event's value is greater than a given
// value, runs the kernel once per thread index, and when the last thread is done
// sets its completion event to a given value. Launches can therefore be chained
// and ordered by events alone, without the owner thread in between.
//
// Threading: register and launch from one owner thread; kernels run on the
// engine's worker threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engines/compress/kv_codec.h"
#include "engines/kernels/sync_event.h"
#include "runtime/spsc_ring.h"
#include "runtime/status.h"

namespace dpukv {

// Arguments of the provided kernels: a batch of chunks, each thread taking chunks
// i with i % nthreads == thread.
struct KernelArgs {
  uint32_t count = 0;
  const uint8_t* const* src = nullptr;
  const size_t* src_len = nullptr;
  uint8_t* const* dst = nullptr;
  const size_t* dst_cap = nullptr;
  size_t* out_len = nullptr;                // per chunk
  uint64_t* out_value = nullptr;            // per chunk (checksum)
  Status* status = nullptr;                 // per chunk
  KvCodecParams params;                     // quantize: codec and shape; gather: shape
  uint32_t token_begin = 0, token_end = 0;  // gather
  bool crc32c = false;                      // checksum: CRC-32C instead of xxh3-64
};

// Per-worker working memory handed to kernels.
struct KernelScratch {
  KvScratch kv;
};

using KernelFn = void (*)(const KernelArgs& args, uint32_t thread, uint32_t nthreads,
                          KernelScratch* s);

struct KernelEngineOptions {
  uint32_t num_threads = 2;
  uint32_t max_launches = 64;         // in flight at once
  size_t max_chunk_bytes = 32 << 20;  // scratch per worker
};

class KernelEngine {
 public:
  static Status create(const KernelEngineOptions& o, std::unique_ptr<KernelEngine>* out);
  ~KernelEngine();
  KernelEngine(const KernelEngine&) = delete;
  KernelEngine& operator=(const KernelEngine&) = delete;

  // The built-in kernels are registered at creation: "quantize", "dequantize",
  // "checksum", "gather".
  Status register_kernel(const std::string& name, KernelFn fn, uint32_t* id);
  Status find(const std::string& name, uint32_t* id) const;

  // args must stay valid until done is set. nthreads in [1, 64]. AGAIN when
  // max_launches are in flight. wait may be null (run at once).
  Status launch(uint32_t kernel, const KernelArgs* args, uint32_t nthreads, const SyncEvent* wait,
                uint64_t wait_gt, SyncEvent* done, uint64_t done_value);

  uint32_t num_threads() const { return static_cast<uint32_t>(workers_.size()); }

 private:
  struct Launch {
    KernelFn fn = nullptr;
    const KernelArgs* args = nullptr;
    uint32_t nthreads = 0;
    const SyncEvent* wait = nullptr;
    uint64_t wait_gt = 0;
    SyncEvent* done = nullptr;
    uint64_t done_value = 0;
    std::atomic<uint32_t> remaining{0};  // 0: free
  };
  struct Slice {
    Launch* launch;
    uint32_t thread;
  };
  struct Worker {
    explicit Worker(size_t slots) : ring(slots) {}
    SpscRing<Slice> ring;
    std::atomic<uint32_t> seq{0};  // bumped on every push: the futex the worker sleeps on
    std::thread thread;
    KernelScratch scratch;
  };
  KernelEngine() = default;
  void run(Worker* w);

  std::vector<std::pair<std::string, KernelFn>> kernels_;
  std::unique_ptr<Launch[]> launches_;
  uint32_t max_launches_ = 0;
  std::vector<std::unique_ptr<Worker>> workers_;
  uint32_t next_worker_ = 0;
  std::atomic<bool> quit_{false};
};

}  // namespace dpukv
