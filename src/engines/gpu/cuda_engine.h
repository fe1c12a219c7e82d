// The agent's CUDA copy engine: copies between host memory the agent owns (its
// arena, registered with the driver once) and GPU memory a client exported to it
// (a CUDA IPC handle of the allocation and a range inside it), as a BlueField's DMA
// engine writes into GPU memory the host exposed. A Context on the progress
// engine, as the DMA engine is: copies go on a few streams, each followed by an
// event, and complete when poll() finds their event done; no thread of the agent
// ever blocks on the GPU.
//
// Everything a client sends is checked: the device (by UUID) must be one this
// driver sees (else NOT_PERMITTED), the handle must open, and the range must lie
// inside the allocation the handle names (else INVALID_VALUE); a copy must lie
// inside its region and the registered host memory. A copy the GPU fails
// (CUDA_ERROR_ILLEGAL_ADDRESS) fails its request with IO_FAILED; the engine makes
// a new stream for the next ones, and if the driver refuses that (a context the
// error poisoned, as CUDA's sticky errors do), it stops taking GPU copies and says
// why, while the agent goes on serving host memory.
//
// A copy may also checksum the bytes (xxh3-64, the chunk checksum), as a DMA
// engine with a CRC offload does, and never on the progress thread. Where the
// driver loads the engine's kernel (verify_kernel.cu, embedded as PTX and checked
// against the host's xxh3 at start) the GPU hashes them: a copy to the GPU where it
// landed, a copy from it at its source, so the host reads each byte once (the
// copy's) and what is verified is what the GPU holds. Otherwise, and for ranges
// the kernel does not take (240 bytes or fewer, not 8-byte aligned), the engine's
// hash threads hash the host bytes: while a copy to the GPU runs, once a copy from
// it landed. checksum_design() says which ran.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engines/device_copier.h"
#include "runtime/context.h"
#include "runtime/cuda_driver.h"
#include "runtime/engine_workers.h"

namespace dpukv_xxh3 {
struct HashJobs;  // verify_kernel_abi.h
}  // namespace dpukv_xxh3

namespace dpukv {

struct CudaEngineOptions {
  std::string driver_library;  // empty: DPUKV_CUDA_DRIVER, else libcuda.so.1
  uint32_t streams = 4;
  uint32_t max_inflight = 256;  // copies in flight over all streams
  uint32_t hash_threads = 1;    // threads that checksum copies the kernel does not take
  // Where copies are checksummed: kAuto, the GPU if its kernel loads and passes the
  // start-up check, else the hash threads (why: checksum_why()); kGpu, the GPU or
  // the engine does not start; kHost, the hash threads always.
  enum class Checksum { kAuto, kGpu, kHost } checksum = Checksum::kAuto;
};

// A GPU range a client exports: the IPC handle of its allocation, the device's
// UUID, and [offset, offset + bytes) inside the allocation.
struct GpuRegionDesc {
  cuda::CUipcMemHandle handle;
  uint8_t device_uuid[16];
  uint64_t offset;
  uint64_t bytes;
};

class CudaEngine final : public Context, public DeviceCopier {
 public:
  using CopyCb = DeviceCopier::DoneCb;

  // NOT_SUPPORTED with *why when there is no driver or no device.
  static Status create(ProgressEngine* pe, const CudaEngineOptions& o,
                       std::unique_ptr<CudaEngine>* out, std::string* why);
  ~CudaEngine() override;

  // Host memory copies may use (the agent's arena): pinned with the driver once.
  Status register_host(void* p, uint64_t bytes, std::string* why);
  // Opens a client's region; *id names it in copies. NOT_PERMITTED: a device this
  // driver does not see, or a region whose first proof_len bytes are not `proof`
  // (the sender does not hold that memory: agent_wire.h, kGpuProof); INVALID_VALUE:
  // a handle that does not open, a range outside its allocation or shorter than
  // the proof (why says which). Reading the proof is a synchronous 16-byte copy on
  // a stream of its own: an export is a control-path request, once per staging.
  Status import(const GpuRegionDesc& d, const uint8_t* proof, uint32_t proof_len, uint64_t* id,
                std::string* why);
  // Closes a region (its session ended, or its client died): at once, or when its
  // copies in flight have finished.
  Status release(uint64_t id);

  // host -> region (to_gpu) or region -> host; cb(arg, status) from poll(), with
  // *checksum (when not null) set before cb runs to the xxh3-64 of the bytes at the
  // GPU's end (the kernel) or of the host bytes (the hash threads): the same bytes
  // unless the copy changed them.
  // INVALID_VALUE: outside the region or the registered host memory; AGAIN: too
  // many copies in flight; NOT_SUPPORTED: the engine stopped taking copies.
  Status copy(uint64_t region, uint64_t offset, void* host, uint64_t bytes, bool to_gpu,
              uint64_t* checksum, CopyCb cb, void* arg) override;
  // The region's bytes (0: no such region): what a request may name in it.
  uint64_t region_bytes(uint64_t id) const;
  // The device's UUID and ordinal this engine copies to.
  const uint8_t* device_uuid() const { return uuid_; }

  size_t regions() const { return open_regions_; }
  uint32_t inflight() const { return inflight_; }
  // Empty while the engine takes copies; else why it stopped.
  const std::string& broken() const { return broken_; }
  // "gpu-kernel" or "host-threads": where checksums are computed; and, when the
  // host's although the GPU's was asked for (kAuto), why.
  const char* checksum_design() const {
    return hash_fn_ != nullptr ? "gpu-kernel" : "host-threads";
  }
  const std::string& checksum_why() const { return checksum_why_; }
  struct Counters {
    uint64_t copies = 0, bytes = 0, failed = 0, imports = 0, refused = 0, streams_replaced = 0;
    uint64_t gpu_hashed = 0, host_hashed = 0;  // copies checksummed by the kernel, on the host
    uint64_t driver_copies = 0, groups = 0;    // cuMemcpy calls; groups (one event, one launch)
  };
  const Counters& counters() const { return counters_; }

 private:
  struct Region {
    uint64_t id = 0;             // 0: a free slot
    cuda::CUdeviceptr base = 0;  // the opened allocation
    uint64_t offset = 0, bytes = 0;
    uint32_t inflight = 0;
    bool closing = false;
  };
  // A slot of copies_, with its event; also the hash threads' task.
  struct Copy {
    cuda::CUevent event = nullptr;
    uint64_t region = 0;
    CopyCb cb = nullptr;
    void* arg = nullptr;
    cuda::CUdeviceptr dev = 0;
    uint8_t* host = nullptr;
    uint64_t bytes = 0;
    uint64_t* checksum = nullptr;  // the caller's: set from hash before cb
    uint64_t hash = 0;             // a hash thread's result
    Status status;
    uint8_t owed = 0;  // completions still to come: the GPU's event, the hash
    bool to_gpu = false;
    bool gpu_hash = false;  // the kernel hashes it (result in results_[its slot])
    // Issued in groups (see flush()): the group's first copy carries the event and
    // the group's place in its stream's queue.
    Copy* member_next = nullptr;  // the next copy of its group
    Copy* queue_next = nullptr;   // the next group on its stream (first copies only)
  };
  struct Stream {
    cuda::CUstream s = nullptr;
    Copy* head = nullptr;  // groups in issue order: each one's event finishes after the last's
    Copy* tail = nullptr;
  };

  CudaEngine(ProgressEngine* pe, const CudaEngineOptions& o);
  Status do_start() override;
  void do_stop() override;
  bool drained() override;
  size_t poll() override;
  bool arm_notification() override;
  static void hash(Copy* c, bool flushing, void* self, uint32_t worker);
  void start_hash(Copy* c);
  void flush();
  void issue_group(Stream& s, Copy* const* g, size_t n);
  void group_done(Copy* first, cuda::CUresult r);
  void arrive(Copy* c);
  void finish(Copy* c);
  void close_region(uint64_t id);
  // Whether device memory at `at` holds `proof` (import's check of the sender).
  bool holds_proof(cuda::CUdeviceptr at, const uint8_t* proof, uint32_t len);
  // Loads the checksum kernel and checks it against the host's xxh3 (and makes
  // every stream's first copy): false with *why when it cannot be used.
  bool load_hash_kernel(std::string* why);
  cuda::CUresult launch_hash(dpukv_xxh3::HashJobs* jobs, cuda::CUstream s);

  CudaEngineOptions opts_;
  std::unique_ptr<cuda::Driver> drv_;
  cuda::CUdevice dev_ = 0;
  cuda::CUcontext ctx_ = nullptr;
  uint8_t uuid_[16] = {};
  std::vector<Stream> streams_;
  std::vector<Copy> copies_;  // max_inflight slots
  std::vector<Copy*> free_copies_;
  std::vector<Copy*> pending_;  // taken since the last poll, issued by flush()
  EngineWorkers<Copy> hashers_;
  uint32_t next_stream_ = 0, inflight_ = 0;
  void* host_ = nullptr;
  uint64_t host_bytes_ = 0;
  // Regions by id without hashing (each copy looks its region up twice): an id is
  // (sequence << 20) | slot, so an id whose slot was reused names nothing.
  Region* find_region(uint64_t id) {
    const uint64_t slot = id & ((1u << 20) - 1);
    return slot < regions_.size() && regions_[slot].id == id && id != 0 ? &regions_[slot] : nullptr;
  }
  std::vector<Region> regions_;
  std::vector<uint32_t> free_region_slots_;
  size_t open_regions_ = 0;
  uint64_t next_region_ = 1;
  std::string broken_;
  Counters counters_;
  cuda::CUmodule module_ = nullptr;
  cuda::CUfunction hash_fn_ = nullptr;  // null: checksums on the hash threads
  uint64_t* results_ = nullptr;         // max_inflight + 1 (the check's) results
  cuda::CUdeviceptr results_dev_ = 0;
  std::string checksum_why_;
};

}  // namespace dpukv
