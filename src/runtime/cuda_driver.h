// The CUDA driver boundary: the subset of the CUDA driver API dpukv uses, declared
// here (no CUDA toolkit is needed to build) and loaded at run time with dlopen, so
// one binary runs with a GPU, without one, and in CI against the test double
// (tests/cuda_double/, a libcuda.so.1 of the same subset).
//
// Which library: DPUKV_CUDA_DRIVER names one (a path, or a name dlopen searches);
// else libcuda.so.1, the name NVIDIA's driver installs. Without it open() says why
// (NOT_SUPPORTED): the agent then serves host memory only and answers GPU requests
// NOT_SUPPORTED with that reason.
//
// Names and signatures follow the CUDA Driver API reference (docs.nvidia.com/cuda/
// cuda-driver-api): the exported symbols are the versioned ones cuda.h maps the
// plain names to (cuMemcpyHtoDAsync -> cuMemcpyHtoDAsync_v2, ...), as of CUDA 11.4.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/status.h"

namespace dpukv::cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // NOLINT(google-runtime-int): the driver's type
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
struct CUipcMemHandle {
  char reserved[64];  // CU_IPC_HANDLE_SIZE
};
struct CUuuid {
  char bytes[16];
};

// The results dpukv tells apart (cuda.h's values).
enum : CUresult {
  kCudaSuccess = 0,
  kCudaErrorInvalidValue = 1,
  kCudaErrorOutOfMemory = 2,
  kCudaErrorNotInitialized = 3,
  kCudaErrorNoDevice = 100,
  kCudaErrorInvalidDevice = 101,
  kCudaErrorInvalidImage = 200,
  kCudaErrorInvalidContext = 201,
  kCudaErrorMapFailed = 205,
  kCudaErrorNoBinaryForGpu = 209,
  kCudaErrorInvalidPtx = 218,
  kCudaErrorInvalidHandle = 400,
  kCudaErrorNotFound = 500,
  kCudaErrorNotReady = 600,
  kCudaErrorIllegalAddress = 700,
  kCudaErrorHostMemoryAlreadyRegistered = 712,
  kCudaErrorHostMemoryNotRegistered = 713,
  kCudaErrorLaunchFailed = 719,
  kCudaErrorNotSupported = 801,
  kCudaErrorUnknown = 999,
};

constexpr unsigned kIpcMemLazyEnablePeerAccess = 0x1;  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
constexpr unsigned kStreamNonBlocking = 0x1;           // CU_STREAM_NON_BLOCKING
constexpr unsigned kEventDisableTiming = 0x2;          // CU_EVENT_DISABLE_TIMING
constexpr unsigned kMemHostRegisterPortable = 0x1;     // CU_MEMHOSTREGISTER_PORTABLE
constexpr unsigned kMemHostAllocPortable = 0x1;        // CU_MEMHOSTALLOC_PORTABLE
constexpr unsigned kMemHostAllocDeviceMap = 0x2;       // CU_MEMHOSTALLOC_DEVICEMAP

class Driver {
 public:
  // Loads the driver (DPUKV_CUDA_DRIVER, else libcuda.so.1) and calls cuInit(0).
  // NOT_SUPPORTED with *why set when there is no driver, a symbol is missing, or
  // cuInit fails (no device, no permission).
  static Status open(std::unique_ptr<Driver>* out, std::string* why);
  static Status open_library(const std::string& library, std::unique_ptr<Driver>* out,
                             std::string* why);
  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  const std::string& library() const { return library_; }
  // "CUDA_ERROR_ILLEGAL_ADDRESS" (or the number, if the driver has no name for it).
  std::string error_name(CUresult r) const;
  // dpukv's code for a driver result: the caller's status on the data path.
  static Status to_status(CUresult r);

  // The subset, as the driver exports it.
  CUresult (*init)(unsigned flags) = nullptr;
  CUresult (*driver_get_version)(int* version) = nullptr;
  CUresult (*device_get_count)(int* count) = nullptr;
  CUresult (*device_get)(CUdevice* dev, int ordinal) = nullptr;
  CUresult (*device_get_uuid)(CUuuid* uuid, CUdevice dev) = nullptr;
  CUresult (*primary_ctx_retain)(CUcontext* ctx, CUdevice dev) = nullptr;
  CUresult (*primary_ctx_release)(CUdevice dev) = nullptr;
  CUresult (*ctx_set_current)(CUcontext ctx) = nullptr;
  CUresult (*ctx_synchronize)() = nullptr;
  CUresult (*mem_alloc)(CUdeviceptr* dptr, size_t bytes) = nullptr;
  CUresult (*mem_free)(CUdeviceptr dptr) = nullptr;
  CUresult (*mem_get_address_range)(CUdeviceptr* base, size_t* size, CUdeviceptr dptr) = nullptr;
  CUresult (*ipc_get_mem_handle)(CUipcMemHandle* handle, CUdeviceptr dptr) = nullptr;
  CUresult (*ipc_open_mem_handle)(CUdeviceptr* dptr, CUipcMemHandle handle,
                                  unsigned flags) = nullptr;
  CUresult (*ipc_close_mem_handle)(CUdeviceptr dptr) = nullptr;
  CUresult (*mem_host_register)(void* p, size_t bytes, unsigned flags) = nullptr;
  CUresult (*mem_host_unregister)(void* p) = nullptr;
  CUresult (*memcpy_htod_async)(CUdeviceptr dst, const void* src, size_t bytes,
                                CUstream stream) = nullptr;
  CUresult (*memcpy_dtoh_async)(void* dst, CUdeviceptr src, size_t bytes,
                                CUstream stream) = nullptr;
  CUresult (*stream_create)(CUstream* stream, unsigned flags) = nullptr;
  CUresult (*stream_destroy)(CUstream stream) = nullptr;
  CUresult (*stream_synchronize)(CUstream stream) = nullptr;
  CUresult (*event_create)(CUevent* event, unsigned flags) = nullptr;
  CUresult (*event_record)(CUevent event, CUstream stream) = nullptr;
  CUresult (*event_query)(CUevent event) = nullptr;
  CUresult (*event_synchronize)(CUevent event) = nullptr;
  CUresult (*event_destroy)(CUevent event) = nullptr;
  CUresult (*get_error_name)(CUresult r, const char** name) = nullptr;
  // Kernels the engine loads as PTX text (the driver compiles it for its GPU).
  CUresult (*module_load_data)(CUmodule* module, const void* image) = nullptr;
  CUresult (*module_unload)(CUmodule module) = nullptr;
  CUresult (*module_get_function)(CUfunction* fn, CUmodule module, const char* name) = nullptr;
  CUresult (*launch_kernel)(CUfunction fn, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                            unsigned block_x, unsigned block_y, unsigned block_z,
                            unsigned shared_bytes, CUstream stream, void** params,
                            void** extra) = nullptr;
  // Pinned host memory kernels write into (their results).
  CUresult (*mem_host_alloc)(void** p, size_t bytes, unsigned flags) = nullptr;
  CUresult (*mem_free_host)(void* p) = nullptr;
  CUresult (*mem_host_get_device_pointer)(CUdeviceptr* dptr, void* p, unsigned flags) = nullptr;

 private:
  Driver() = default;
  void* handle_ = nullptr;
  std::string library_;
};

}  // namespace dpukv::cuda
