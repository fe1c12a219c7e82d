#include "runtime/cuda_driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <type_traits>

namespace dpukv::cuda {

Status Driver::open(std::unique_ptr<Driver>* out, std::string* why) {
  const char* named = std::getenv("DPUKV_CUDA_DRIVER");
  return open_library(named != nullptr && *named != '\0' ? named : "libcuda.so.1", out, why);
}

Status Driver::open_library(const std::string& library, std::unique_ptr<Driver>* out,
                            std::string* why) {
  std::unique_ptr<Driver> d(new Driver());
  d->library_ = library;
  // RTLD_LOCAL: the driver's symbols stay out of the global namespace (a process
  // that also links CUDA's runtime keeps its own resolution).
  d->handle_ = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (d->handle_ == nullptr) {
    const char* e = ::dlerror();
    *why = "no CUDA driver: cannot load " + library + " (" + (e ? e : "unknown error") +
           "); set DPUKV_CUDA_DRIVER to its path";
    return Code::kNotSupported;
  }
  bool missing = false;
  auto sym = [&](auto* fn, const char* name) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(::dlsym(d->handle_, name));
    if (*fn == nullptr && !missing) {
      missing = true;
      *why = std::string("the CUDA driver ") + library + " has no " + name +
             " (a driver older than CUDA 11.4?)";
    }
  };
  sym(&d->init, "cuInit");
  sym(&d->driver_get_version, "cuDriverGetVersion");
  sym(&d->device_get_count, "cuDeviceGetCount");
  sym(&d->device_get, "cuDeviceGet");
  sym(&d->device_get_uuid, "cuDeviceGetUuid_v2");
  sym(&d->primary_ctx_retain, "cuDevicePrimaryCtxRetain");
  sym(&d->primary_ctx_release, "cuDevicePrimaryCtxRelease_v2");
  sym(&d->ctx_set_current, "cuCtxSetCurrent");
  sym(&d->mem_alloc, "cuMemAlloc_v2");
  sym(&d->mem_free, "cuMemFree_v2");
  sym(&d->mem_get_address_range, "cuMemGetAddressRange_v2");
  sym(&d->ipc_get_mem_handle, "cuIpcGetMemHandle");
  sym(&d->ipc_open_mem_handle, "cuIpcOpenMemHandle_v2");
  sym(&d->ipc_close_mem_handle, "cuIpcCloseMemHandle");
  sym(&d->mem_host_register, "cuMemHostRegister_v2");
  sym(&d->mem_host_unregister, "cuMemHostUnregister");
  sym(&d->memcpy_htod_async, "cuMemcpyHtoDAsync_v2");
  sym(&d->memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2");
  sym(&d->stream_create, "cuStreamCreate");
  sym(&d->stream_destroy, "cuStreamDestroy_v2");
  sym(&d->stream_synchronize, "cuStreamSynchronize");
  sym(&d->ctx_synchronize, "cuCtxSynchronize");
  sym(&d->event_create, "cuEventCreate");
  sym(&d->event_record, "cuEventRecord");
  sym(&d->event_query, "cuEventQuery");
  sym(&d->event_synchronize, "cuEventSynchronize");
  sym(&d->event_destroy, "cuEventDestroy_v2");
  sym(&d->get_error_name, "cuGetErrorName");
  sym(&d->module_load_data, "cuModuleLoadData");
  sym(&d->module_unload, "cuModuleUnload");
  sym(&d->module_get_function, "cuModuleGetFunction");
  sym(&d->launch_kernel, "cuLaunchKernel");
  sym(&d->mem_host_alloc, "cuMemHostAlloc");
  sym(&d->mem_free_host, "cuMemFreeHost");
  sym(&d->mem_host_get_device_pointer, "cuMemHostGetDevicePointer_v2");
  if (missing) return Code::kNotSupported;
  const CUresult r = d->init(0);
  if (r != kCudaSuccess) {
    *why = "the CUDA driver " + library + " did not initialise: " + d->error_name(r) +
           (r == kCudaErrorNoDevice ? " (no GPU visible to this process)" : "");
    return Code::kNotSupported;
  }
  *out = std::move(d);
  return Code::kSuccess;
}

Driver::~Driver() {
  if (handle_ != nullptr) ::dlclose(handle_);
}

std::string Driver::error_name(CUresult r) const {
  const char* name = nullptr;
  if (get_error_name != nullptr && get_error_name(r, &name) == kCudaSuccess && name != nullptr)
    return name;
  return "CUDA error " + std::to_string(r);
}

Status Driver::to_status(CUresult r) {
  switch (r) {
    case kCudaSuccess:
      return Code::kSuccess;
    case kCudaErrorNotReady:
      return Code::kInProgress;
    case kCudaErrorInvalidValue:
    case kCudaErrorInvalidHandle:
    case kCudaErrorInvalidDevice:
      return Code::kInvalidValue;
    case kCudaErrorOutOfMemory:
      return Code::kNoMemory;
    case kCudaErrorNotSupported:
    case kCudaErrorNoDevice:
      return Code::kNotSupported;
    case kCudaErrorIllegalAddress:
    case kCudaErrorLaunchFailed:
      return Code::kIoFailed;
    default:
      return Code::kDriver;
  }
}

}  // namespace dpukv::cuda
