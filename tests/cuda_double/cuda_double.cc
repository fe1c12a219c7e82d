// A TEST DOUBLE of the CUDA driver (libcuda.so.1) for CI machines without a GPU: the
// subset dpukv's driver boundary loads (src/runtime/cuda_driver.h), with the
// behaviour the CUDA Driver API reference documents for each call (docs.nvidia.com/
// cuda/cuda-driver-api, cited per call below). It makes the code above the boundary
// run in CI; it does not make the real path verified. scripts/gpu_check.sh runs the
// same tests against NVIDIA's driver.
//
// How it stands in for a GPU:
//  - "device memory" is a memfd mapping; a CUdeviceptr is its address here. An IPC
//    handle names the allocation (pid, fd, size, id); another process opens it
//    through /proc/PID/fd, so a handle of a dead process cannot be opened.
//  - Copies run later, in stream order, on a thread of the double, and finish
//    through events; each copy waits a little first, so a caller that reads before
//    waiting for its event sees the old bytes, as on a GPU.
//  - Faults are injected with DPUKV_CUDA_DOUBLE_FAULT (comma list; read at cuInit,
//    for processes a test starts) or dpukv_cuda_double_fault() (same names):
//    init (cuInit: CUDA_ERROR_NO_DEVICE), copy (every copy: CUDA_ERROR_ILLEGAL_ADDRESS
//    when it runs), copy_once (the next copy only), copy_nth=N (the Nth copy from
//    now only), register (cuMemHostRegister:
//    CUDA_ERROR_OUT_OF_MEMORY, as when the locked-memory limit is reached), uuid=HEX32
//    (this process's device has that UUID: a foreign device to another process),
//    module (cuModuleLoadData: CUDA_ERROR_INVALID_PTX, a driver that cannot JIT it),
//    kernel (every launch faults when it runs: CUDA_ERROR_ILLEGAL_ADDRESS, sticky on
//    its stream), kernel_nth=N (the Nth launch from now only), kernel_wrong (every
//    kernel's result has its low bit flipped: a miscompiled kernel), flip_once
//    (the next copy lands with its first byte changed: a corrupting link).
//  - Kernels: cuModuleLoadData takes PTX text (what dpukv loads) and knows its
//    .entry names; the one kernel dpukv launches, dpukv_xxh3_64_batch (a batch of
//    (p, len, out) jobs), runs as its CPU twin (XXH3_64bits of each job's device
//    bytes into its *out) in stream order.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <xxhash.h>

#include "engines/gpu/verify_kernel_abi.h"

namespace {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // NOLINT(google-runtime-int)
struct CUipcMemHandle {
  char reserved[64];
};
struct CUuuid {
  char bytes[16];
};

constexpr CUresult kSuccess = 0, kInvalidValue = 1, kOutOfMemory = 2, kNotInitialized = 3,
                   kNoDevice = 100, kInvalidDevice = 101, kInvalidContext = 201, kMapFailed = 205,
                   kInvalidHandle = 400, kNotFound = 500, kNotReady = 600, kIllegalAddress = 700,
                   kAlreadyRegistered = 712, kNotRegistered = 713;
constexpr CUresult kInvalidImage = 200, kInvalidPtx = 218;

constexpr char kHandleMagic[8] = {'D', 'K', 'V', 'C', 'U', 'D', 'A', '1'};
struct Handle {  // what the 64 bytes of a CUipcMemHandle hold here
  char magic[8];
  int32_t pid, fd;
  uint64_t size, id;
  char uuid[16];
  char pad[16];
};
static_assert(sizeof(Handle) == 64, "fills CU_IPC_HANDLE_SIZE");

struct Alloc {
  uint64_t size = 0, id = 0;
  int fd = -1;  // own allocations: the memfd; imports: -1
  bool imported = false;
};

struct Op {
  enum Kind { kCopy, kEvent, kHashKernel } kind;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
  bool fail = false;
  struct Event* event = nullptr;
  bool flip = false;                      // lands with its first byte changed
  std::vector<dpukv_xxh3::HashJob> jobs;  // kHashKernel's
};

Op make_op(Op::Kind k, void* dst, const void* src, size_t bytes, bool fail, struct Event* e) {
  Op op{};
  op.kind = k;
  op.dst = dst;
  op.src = src;
  op.bytes = bytes;
  op.fail = fail;
  op.event = e;
  return op;
}

struct Stream {
  std::deque<Op> ops;
  CUresult error = kSuccess;  // sticky, as a context's is after an illegal address
};

}  // namespace

struct CUctx_st {
  int device;
};
struct CUstream_st {
  Stream s;
};
struct CUevent_st {
  bool recorded = false, done = true;
  CUresult result = kSuccess;
};
struct CUmod_st {
  std::string ptx;
};
struct CUfunc_st {
  std::string name;
};
namespace {
struct Event : CUevent_st {};

struct State {
  std::mutex mu;
  std::condition_variable cv;
  bool initialised = false;
  bool fault_init = false, fault_copy = false, fault_register = false;
  int fault_copy_in = 0;  // > 0: the copy that many from now fails (once)
  bool fault_module = false, fault_kernel = false, fault_kernel_wrong = false;
  int fault_kernel_in = 0;
  bool fault_flip = false;
  std::map<uintptr_t, size_t> host_allocs;  // cuMemHostAlloc's, mapped for kernels
  char uuid[16] = {'d', 'p', 'u', 'k', 'v', '-', 'd', 'o', 'u', 'b', 'l', 'e', '-', 'g', 'p', 'u'};
  std::map<uintptr_t, Alloc> allocs;  // by base address
  std::map<uintptr_t, size_t> registered;
  uint64_t next_id = 1;
  CUctx_st ctx{0};
  CUstream_st legacy;  // the NULL stream
  std::deque<CUstream_st*> streams;
  std::thread worker;
  bool stop = false;
};
// Never destroyed: the worker thread waits on g.cv until the process ends, and
// glibc's pthread_cond_destroy would wait for it at exit.
State& g = *new State;

void apply_fault(const std::string& f) {
  if (f == "init") g.fault_init = true;
  if (f == "copy") g.fault_copy = true;
  if (f == "copy_once") g.fault_copy_in = 1;
  if (f.rfind("copy_nth=", 0) == 0) g.fault_copy_in = std::atoi(f.c_str() + 9);
  if (f == "register") g.fault_register = true;
  if (f == "module") g.fault_module = true;
  if (f == "kernel") g.fault_kernel = true;
  if (f.rfind("kernel_nth=", 0) == 0) g.fault_kernel_in = std::atoi(f.c_str() + 11);
  if (f == "kernel_wrong") g.fault_kernel_wrong = true;
  if (f == "flip_once") g.fault_flip = true;
  if (f == "none") {
    g.fault_init = g.fault_copy = g.fault_register = false;
    g.fault_module = g.fault_kernel = g.fault_kernel_wrong = g.fault_flip = false;
    g.fault_copy_in = g.fault_kernel_in = 0;
  }
  if (f.rfind("uuid=", 0) == 0 && f.size() == 5 + 32)
    for (int i = 0; i < 16; ++i)
      g.uuid[i] = static_cast<char>(std::stoi(f.substr(5 + 2 * i, 2), nullptr, 16));
}

void apply_faults(const char* list) {
  std::string s = list ? list : "";
  size_t p = 0;
  while (p <= s.size()) {
    const size_t c = s.find(',', p);
    apply_fault(s.substr(p, c == std::string::npos ? std::string::npos : c - p));
    if (c == std::string::npos) break;
    p = c + 1;
  }
}

// The allocation (own or imported) holding [p, p + n), or nullptr.
const Alloc* find(uintptr_t p, size_t n, uintptr_t* base) {
  auto it = g.allocs.upper_bound(p);
  if (it == g.allocs.begin()) return nullptr;
  --it;
  if (p - it->first + n > it->second.size || p < it->first) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

// Runs every stream's operations in order, each a little later than asked.
void work() {
  std::unique_lock<std::mutex> lk(g.mu);
  for (;;) {
    Stream* ready = nullptr;
    g.cv.wait(lk, [&] {
      if (g.stop) return true;
      if (!g.legacy.s.ops.empty()) ready = &g.legacy.s;
      for (CUstream_st* s : g.streams)
        if (ready == nullptr && !s->s.ops.empty()) ready = &s->s;
      return ready != nullptr;
    });
    if (g.stop) return;
    Op op = ready->ops.front();
    lk.unlock();
    if (op.kind == Op::kCopy) std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (op.kind == Op::kCopy && !op.fail && ready->error == kSuccess) {
      std::memcpy(op.dst, op.src, op.bytes);
      if (op.flip) static_cast<uint8_t*>(op.dst)[0] ^= 0x80;
    }
    if (op.kind == Op::kHashKernel && !op.fail && ready->error == kSuccess)
      for (const dpukv_xxh3::HashJob& j : op.jobs) {
        uint64_t h = XXH3_64bits(reinterpret_cast<const void*>(j.p), j.len);
        if (g.fault_kernel_wrong) h ^= 1;
        std::memcpy(reinterpret_cast<void*>(j.out), &h, sizeof(h));
      }
    lk.lock();
    if ((op.kind == Op::kCopy || op.kind == Op::kHashKernel) && op.fail)
      ready->error = kIllegalAddress;
    if (op.kind == Op::kEvent) {
      op.event->result = ready->error;
      op.event->done = true;
    }
    ready->ops.pop_front();
    g.cv.notify_all();
  }
}

CUresult enqueue(CUstream_st* s, Op op) {
  Stream& st = s ? s->s : g.legacy.s;
  if (st.error != kSuccess) return st.error;
  st.ops.push_back(op);
  g.cv.notify_all();
  return kSuccess;
}

}  // namespace

extern "C" {

void dpukv_cuda_double_fault(const char* what) {
  std::lock_guard<std::mutex> lk(g.mu);
  apply_faults(what);
}

// cuInit: "Initializes the driver API ... must be called before any other function".
CUresult cuInit(unsigned flags) {
  std::lock_guard<std::mutex> lk(g.mu);
  if (flags != 0) return kInvalidValue;  // "Flags ... must be 0"
  apply_faults(std::getenv("DPUKV_CUDA_DOUBLE_FAULT"));
  if (g.fault_init) return kNoDevice;
  if (!g.initialised) {
    g.initialised = true;
    g.worker = std::thread(work);
    g.worker.detach();  // lives as long as the process, as the driver's threads do
  }
  return kSuccess;
}

CUresult cuDriverGetVersion(int* v) {
  if (v == nullptr) return kInvalidValue;
  *v = 12040;
  return kSuccess;
}

CUresult cuDeviceGetCount(int* n) {
  if (!g.initialised) return kNotInitialized;
  if (n == nullptr) return kInvalidValue;
  *n = 1;
  return kSuccess;
}

CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (!g.initialised) return kNotInitialized;
  if (d == nullptr) return kInvalidValue;
  if (ordinal != 0) return kInvalidDevice;
  *d = 0;
  return kSuccess;
}

CUresult cuDeviceGetUuid_v2(CUuuid* u, CUdevice d) {
  if (!g.initialised) return kNotInitialized;
  if (u == nullptr) return kInvalidValue;
  if (d != 0) return kInvalidDevice;
  std::memcpy(u->bytes, g.uuid, 16);
  return kSuccess;
}

CUresult cuDevicePrimaryCtxRetain(CUctx_st** ctx, CUdevice d) {
  if (!g.initialised) return kNotInitialized;
  if (ctx == nullptr) return kInvalidValue;
  if (d != 0) return kInvalidDevice;
  *ctx = &g.ctx;
  return kSuccess;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  return d == 0 ? kSuccess : kInvalidDevice;
}

CUresult cuCtxSetCurrent(CUctx_st* ctx) {
  return ctx == nullptr || ctx == &g.ctx ? kSuccess : kInvalidContext;
}

// cuMemAlloc: "If bytesize is 0, cuMemAlloc() returns CUDA_ERROR_INVALID_VALUE."
CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
  std::lock_guard<std::mutex> lk(g.mu);
  if (!g.initialised) return kNotInitialized;
  if (p == nullptr || bytes == 0) return kInvalidValue;
  const uint64_t id = g.next_id++;
  const std::string name = "cuda-double-" + std::to_string(getpid()) + "-" + std::to_string(id);
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return kOutOfMemory;
  void* m = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0)
    m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    close(fd);
    return kOutOfMemory;
  }
  g.allocs[reinterpret_cast<uintptr_t>(m)] = Alloc{bytes, id, fd, false};
  *p = reinterpret_cast<uintptr_t>(m);
  return kSuccess;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
  std::lock_guard<std::mutex> lk(g.mu);
  auto it = g.allocs.find(static_cast<uintptr_t>(p));
  if (it == g.allocs.end() || it->second.imported) return kInvalidValue;
  munmap(reinterpret_cast<void*>(it->first), it->second.size);
  close(it->second.fd);
  g.allocs.erase(it);
  return kSuccess;
}

// cuMemGetAddressRange: "Returns the base address ... and size of the allocation by
// cuMemAlloc() or cuMemAllocPitch() that contains the input pointer".
CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  std::lock_guard<std::mutex> lk(g.mu);
  uintptr_t b = 0;
  const Alloc* a = find(static_cast<uintptr_t>(p), 1, &b);
  if (a == nullptr) return kNotFound;
  if (base) *base = b;
  if (size) *size = a->size;
  return kSuccess;
}

// cuIpcGetMemHandle: "Takes a pointer to the base of an existing device memory
// allocation created with cuMemAlloc and exports it for use in another process."
CUresult cuIpcGetMemHandle(CUipcMemHandle* h, CUdeviceptr p) {
  std::lock_guard<std::mutex> lk(g.mu);
  auto it = g.allocs.find(static_cast<uintptr_t>(p));
  if (h == nullptr || it == g.allocs.end() || it->second.imported) return kInvalidValue;
  Handle x{};
  std::memcpy(x.magic, kHandleMagic, 8);
  x.pid = getpid();
  x.fd = it->second.fd;
  x.size = it->second.size;
  x.id = it->second.id;
  std::memcpy(x.uuid, g.uuid, 16);
  std::memcpy(h->reserved, &x, sizeof(x));
  return kSuccess;
}

// cuIpcOpenMemHandle: "Maps memory exported from another process ... Memory
// handles from the same process cannot be opened" (CUDA_ERROR_INVALID_CONTEXT here);
// "the handle must be from the same device" (CUDA_ERROR_INVALID_DEVICE otherwise).
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* p, CUipcMemHandle h, unsigned flags) {
  std::lock_guard<std::mutex> lk(g.mu);
  if (!g.initialised) return kNotInitialized;
  Handle x;
  std::memcpy(&x, h.reserved, sizeof(x));
  if (p == nullptr || (flags & ~1u) != 0 || std::memcmp(x.magic, kHandleMagic, 8) != 0 ||
      x.size == 0)
    return kInvalidValue;
  if (x.pid == getpid()) return kInvalidContext;
  if (std::memcmp(x.uuid, g.uuid, 16) != 0) return kInvalidDevice;
  const std::string path = "/proc/" + std::to_string(x.pid) + "/fd/" + std::to_string(x.fd);
  // The fd must still be that allocation (a dead process, or a number reused).
  char target[256] = {};
  const ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
  const std::string want =
      "/memfd:cuda-double-" + std::to_string(x.pid) + "-" + std::to_string(x.id);
  if (n <= 0 || std::string(target, static_cast<size_t>(n)).rfind(want, 0) != 0)
    return kInvalidHandle;
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return kInvalidHandle;
  // A handle is opaque to its holder: one whose size was altered names nothing.
  struct stat sb {};
  if (fstat(fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) != x.size) {
    close(fd);
    return kInvalidHandle;
  }
  void* m = mmap(nullptr, x.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return kMapFailed;
  g.allocs[reinterpret_cast<uintptr_t>(m)] = Alloc{x.size, x.id, -1, true};
  *p = reinterpret_cast<uintptr_t>(m);
  return kSuccess;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  std::lock_guard<std::mutex> lk(g.mu);
  auto it = g.allocs.find(static_cast<uintptr_t>(p));
  if (it == g.allocs.end() || !it->second.imported) return kInvalidValue;
  munmap(reinterpret_cast<void*>(it->first), it->second.size);
  g.allocs.erase(it);
  return kSuccess;
}

// cuMemHostRegister: "Page-locks the memory range ... CUDA_ERROR_HOST_MEMORY_ALREADY_
// REGISTERED" for a range that overlaps one registered already.
CUresult cuMemHostRegister_v2(void* p, size_t bytes, unsigned) {
  std::lock_guard<std::mutex> lk(g.mu);
  if (p == nullptr || bytes == 0) return kInvalidValue;
  if (g.fault_register) return kOutOfMemory;
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (const auto& [b, n] : g.registered)
    if (a < b + n && b < a + bytes) return kAlreadyRegistered;
  g.registered[a] = bytes;
  return kSuccess;
}

CUresult cuMemHostUnregister(void* p) {
  std::lock_guard<std::mutex> lk(g.mu);
  return g.registered.erase(reinterpret_cast<uintptr_t>(p)) ? kSuccess : kNotRegistered;
}

// cuMemcpyHtoDAsync / DtoHAsync: asynchronous with respect to the host, ordered in
// the stream; a range outside any allocation is CUDA_ERROR_INVALID_VALUE at once.
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream_st* s) {
  std::lock_guard<std::mutex> lk(g.mu);
  if (src == nullptr || find(static_cast<uintptr_t>(dst), bytes, nullptr) == nullptr)
    return kInvalidValue;
  const bool fail = g.fault_copy || (g.fault_copy_in > 0 && --g.fault_copy_in == 0);
  Op op = make_op(Op::kCopy, reinterpret_cast<void*>(dst), src, bytes, fail, nullptr);
  op.flip = std::exchange(g.fault_flip, false);
  return enqueue(s, op);
}

CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream_st* s) {
  std::lock_guard<std::mutex> lk(g.mu);
  if (dst == nullptr || find(static_cast<uintptr_t>(src), bytes, nullptr) == nullptr)
    return kInvalidValue;
  const bool fail = g.fault_copy || (g.fault_copy_in > 0 && --g.fault_copy_in == 0);
  Op op = make_op(Op::kCopy, dst, reinterpret_cast<const void*>(src), bytes, fail, nullptr);
  op.flip = std::exchange(g.fault_flip, false);
  return enqueue(s, op);
}

CUresult cuStreamCreate(CUstream_st** s, unsigned) {
  std::lock_guard<std::mutex> lk(g.mu);
  if (s == nullptr) return kInvalidValue;
  *s = new CUstream_st();
  g.streams.push_back(*s);
  return kSuccess;
}

// cuStreamDestroy: "work ... still executing ... will complete before the stream is
// destroyed"; its resources go then.
CUresult cuStreamDestroy_v2(CUstream_st* s) {
  std::unique_lock<std::mutex> lk(g.mu);
  if (s == nullptr) return kInvalidValue;
  g.cv.wait(lk, [&] { return s->s.ops.empty(); });
  for (auto it = g.streams.begin(); it != g.streams.end(); ++it)
    if (*it == s) {
      g.streams.erase(it);
      break;
    }
  delete s;
  return kSuccess;
}

// cuCtxSynchronize: "Blocks until the device has completed all preceding requested
// tasks" (every stream of the context).
CUresult cuCtxSynchronize() {
  std::unique_lock<std::mutex> lk(g.mu);
  auto idle = [] {
    if (!g.legacy.s.ops.empty()) return false;
    for (CUstream_st* s : g.streams)
      if (!s->s.ops.empty()) return false;
    return true;
  };
  g.cv.wait(lk, idle);
  return kSuccess;
}

CUresult cuStreamSynchronize(CUstream_st* s) {
  std::unique_lock<std::mutex> lk(g.mu);
  Stream& st = s ? s->s : g.legacy.s;
  g.cv.wait(lk, [&] { return st.ops.empty(); });
  return st.error;
}

CUresult cuEventCreate(CUevent_st** e, unsigned) {
  if (e == nullptr) return kInvalidValue;
  *e = new Event();
  return kSuccess;
}

// cuEventRecord: "Captures in hEvent the contents of hStream at the time of this
// call ... cuEventQuery() ... will check whether the captured work has completed."
CUresult cuEventRecord(CUevent_st* e, CUstream_st* s) {
  std::lock_guard<std::mutex> lk(g.mu);
  if (e == nullptr) return kInvalidHandle;
  e->recorded = true;
  e->done = false;
  e->result = kSuccess;
  Stream& st = s ? s->s : g.legacy.s;
  if (st.error != kSuccess) {  // nothing will run on it again
    e->done = true;
    e->result = st.error;
    return kSuccess;
  }
  st.ops.push_back(make_op(Op::kEvent, nullptr, nullptr, 0, false, static_cast<Event*>(e)));
  g.cv.notify_all();
  return kSuccess;
}

// cuEventQuery: CUDA_SUCCESS when the captured work completed, CUDA_ERROR_NOT_READY
// if not; "If cuEventRecord() has not been called on this event, the function
// returns CUDA_SUCCESS"; an asynchronous error of that work is returned here.
CUresult cuEventQuery(CUevent_st* e) {
  std::lock_guard<std::mutex> lk(g.mu);
  if (e == nullptr) return kInvalidHandle;
  if (!e->done) return kNotReady;
  return e->result;
}

CUresult cuEventSynchronize(CUevent_st* e) {
  std::unique_lock<std::mutex> lk(g.mu);
  if (e == nullptr) return kInvalidHandle;
  g.cv.wait(lk, [&] { return e->done; });
  return e->result;
}

CUresult cuEventDestroy_v2(CUevent_st* e) {
  std::unique_lock<std::mutex> lk(g.mu);
  if (e == nullptr) return kInvalidHandle;
  g.cv.wait(lk, [&] { return e->done; });  // "resources ... released ... once complete"
  delete static_cast<Event*>(e);
  return kSuccess;
}

// cuMemHostAlloc: "Allocates bytesize bytes of host memory that is page-locked and
// accessible to the device"; CU_MEMHOSTALLOC_DEVICEMAP maps it into the device's
// address space (cuMemHostGetDevicePointer). Here the device pointer is the address.
CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned flags) {
  std::lock_guard<std::mutex> lk(g.mu);
  if (p == nullptr || bytes == 0 || (flags & ~7u) != 0) return kInvalidValue;
  void* m = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (m == nullptr) return kOutOfMemory;
  g.host_allocs[reinterpret_cast<uintptr_t>(m)] = bytes;
  *p = m;
  return kSuccess;
}

CUresult cuMemFreeHost(void* p) {
  std::lock_guard<std::mutex> lk(g.mu);
  if (g.host_allocs.erase(reinterpret_cast<uintptr_t>(p)) == 0) return kInvalidValue;
  std::free(p);
  return kSuccess;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* d, void* p, unsigned flags) {
  std::lock_guard<std::mutex> lk(g.mu);
  if (d == nullptr || flags != 0) return kInvalidValue;
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (const auto& [b, n] : g.host_allocs)
    if (a >= b && a < b + n) {
      *d = a;
      return kSuccess;
    }
  return kInvalidValue;
}

// cuModuleLoadData: "Takes a pointer image and loads the corresponding module ...
// The pointer may be obtained ... or a NULL-terminated text string" (PTX, compiled
// by the driver's JIT). Here: PTX text with a .version and an .entry.
CUresult cuModuleLoadData(CUmod_st** m, const void* image) {
  std::lock_guard<std::mutex> lk(g.mu);
  if (!g.initialised) return kNotInitialized;
  if (m == nullptr || image == nullptr) return kInvalidValue;
  const std::string ptx(static_cast<const char*>(image));
  if (ptx.find(".version") == std::string::npos) return kInvalidImage;
  if (g.fault_module || ptx.find(".entry") == std::string::npos) return kInvalidPtx;
  *m = new CUmod_st{ptx};
  return kSuccess;
}

CUresult cuModuleUnload(CUmod_st* m) {
  if (m == nullptr) return kInvalidValue;
  delete m;
  return kSuccess;
}

// cuModuleGetFunction: CUDA_ERROR_NOT_FOUND "if no function with name name exists".
CUresult cuModuleGetFunction(CUfunc_st** f, CUmod_st* m, const char* name) {
  if (f == nullptr || m == nullptr || name == nullptr) return kInvalidValue;
  if (m->ptx.find(std::string(".entry ") + name + "(") == std::string::npos) return kNotFound;
  // One function object per name, as long as the process: it is never unloaded here.
  static std::map<std::string, CUfunc_st>& fns = *new std::map<std::string, CUfunc_st>;
  std::lock_guard<std::mutex> lk(g.mu);
  CUfunc_st& fn = fns[name];
  fn.name = name;
  *f = &fn;
  return kSuccess;
}

// cuLaunchKernel: "kernelParams ... an array of pointers to the parameters". Only
// dpukv_xxh3_64_batch(HashJobs) runs (as its CPU twin: each job's XXH3_64bits into
// its *out); memory a job reaches outside any allocation faults when it runs, as
// on a GPU. The jobs are copied at the launch, as the driver copies parameters.
CUresult cuLaunchKernel(CUfunc_st* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned, CUstream_st* s, void** params,
                        void** extra) {
  std::lock_guard<std::mutex> lk(g.mu);
  if (f == nullptr || params == nullptr || extra != nullptr) return kInvalidValue;
  if (f->name != "dpukv_xxh3_64_batch") return kNotFound;
  dpukv_xxh3::HashJobs jobs;
  std::memcpy(&jobs, params[0], sizeof(jobs));
  if (gx == 0 || gx > dpukv_xxh3::kMaxHashJobs || gx != jobs.n || gy != 1 || gz != 1 || bx == 0 ||
      bx > 1024 || by != 1 || bz != 1)
    return kInvalidValue;
  bool fail = g.fault_kernel || (g.fault_kernel_in > 0 && --g.fault_kernel_in == 0);
  Op op = make_op(Op::kHashKernel, nullptr, nullptr, 0, fail, nullptr);
  op.jobs.reserve(jobs.n);
  for (unsigned i = 0; i < jobs.n; ++i) {
    const dpukv_xxh3::HashJob& j = jobs.job[i];
    bool out_ok = false;
    for (const auto& [b, n] : g.host_allocs) out_ok = out_ok || (j.out >= b && j.out + 8 <= b + n);
    op.fail = op.fail || j.p % 8 != 0 || find(j.p, j.len, nullptr) == nullptr || !out_ok;
    op.jobs.push_back(j);
  }
  return enqueue(s, std::move(op));
}

CUresult cuGetErrorName(CUresult r, const char** name) {
  if (name == nullptr) return kInvalidValue;
  switch (r) {
    case kSuccess:
      *name = "CUDA_SUCCESS";
      break;
    case kInvalidValue:
      *name = "CUDA_ERROR_INVALID_VALUE";
      break;
    case kOutOfMemory:
      *name = "CUDA_ERROR_OUT_OF_MEMORY";
      break;
    case kNotInitialized:
      *name = "CUDA_ERROR_NOT_INITIALIZED";
      break;
    case kNoDevice:
      *name = "CUDA_ERROR_NO_DEVICE";
      break;
    case kInvalidDevice:
      *name = "CUDA_ERROR_INVALID_DEVICE";
      break;
    case kInvalidContext:
      *name = "CUDA_ERROR_INVALID_CONTEXT";
      break;
    case kMapFailed:
      *name = "CUDA_ERROR_MAP_FAILED";
      break;
    case kInvalidImage:
      *name = "CUDA_ERROR_INVALID_IMAGE";
      break;
    case kInvalidPtx:
      *name = "CUDA_ERROR_INVALID_PTX";
      break;
    case kInvalidHandle:
      *name = "CUDA_ERROR_INVALID_HANDLE";
      break;
    case kNotFound:
      *name = "CUDA_ERROR_NOT_FOUND";
      break;
    case kNotReady:
      *name = "CUDA_ERROR_NOT_READY";
      break;
    case kIllegalAddress:
      *name = "CUDA_ERROR_ILLEGAL_ADDRESS";
      break;
    case kAlreadyRegistered:
      *name = "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED";
      break;
    case kNotRegistered:
      *name = "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED";
      break;
    default:
      *name = nullptr;
      return kInvalidValue;
  }
  return kSuccess;
}

}  // extern "C"
