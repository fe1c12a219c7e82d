// The client's GPU path (client.h): device memory exported to the agent (with the
// proof that this process owns it), released, and the agent's say on whether it
// copies into GPU memory.
#include "client/client.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "runtime/log.h"

namespace dpukv {

using agent::AgentHeader;
using agent::IoEntry;
using agent::Op;

Status Client::send_gpu_export(const GpuExport& x, std::string* why) {
  std::vector<uint8_t> resp;
  DPUKV_RETURN_IF_ERROR(call(Op::kGpuProof, 0, nullptr, 0, 0, &resp));
  if (resp.size() != sizeof(AgentHeader) + agent::kGpuProofBytes) {
    *why = "the agent's proof has the wrong size";
    return Code::kCorrupted;
  }
  uint8_t old[agent::kGpuProofBytes];
  DPUKV_RETURN_IF_ERROR(write_device(x.device_ptr, x.device, resp.data() + sizeof(AgentHeader), old,
                                     sizeof(old), why));
  resp.clear();
  Status st = call(Op::kGpuExport, 0, &x.e, sizeof(x.e), 1, &resp);
  if (!st.ok() && resp.size() > sizeof(AgentHeader))
    why->assign(reinterpret_cast<const char*>(resp.data()) + sizeof(AgentHeader),
                resp.size() - sizeof(AgentHeader));
  std::string restore_why;
  const Status restored =
      write_device(x.device_ptr, x.device, old, nullptr, sizeof(old), &restore_why);
  if (!restored.ok() && st.ok()) {
    // The caller is told the export failed: the agent must not keep it either.
    std::vector<uint8_t> r;
    (void)call(Op::kGpuRelease, 0, &x.e.map_id, sizeof(x.e.map_id), 1, &r);
    *why = restore_why;
    return restored;
  }
  return st;
}

// Copies n bytes to device memory (first saving what was there into old, when not
// null), with every earlier piece of work of the context finished first: the
// range may be staging a stream of the caller's still reads (after a reconnect).
Status Client::write_device(uint64_t device_ptr, int device, const void* src, void* old, size_t n,
                            std::string* why) {
  if (!cuda_) DPUKV_RETURN_IF_ERROR(cuda::Driver::open(&cuda_, why));
  using namespace cuda;  // NOLINT(google-build-using-namespace): the driver's names
  const Driver& d = *cuda_;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUresult r = d.device_get(&dev, device);
  if (r == kCudaSuccess) r = d.primary_ctx_retain(&ctx, dev);
  if (r != kCudaSuccess) {
    *why = "CUDA device " + std::to_string(device) + ": " + d.error_name(r);
    return Driver::to_status(r);
  }
  r = d.ctx_set_current(ctx);
  if (r == kCudaSuccess) r = d.ctx_synchronize();
  if (r == kCudaSuccess && old != nullptr) r = d.memcpy_dtoh_async(old, device_ptr, n, nullptr);
  if (r == kCudaSuccess) r = d.stream_synchronize(nullptr);
  if (r == kCudaSuccess) r = d.memcpy_htod_async(device_ptr, src, n, nullptr);
  if (r == kCudaSuccess) r = d.stream_synchronize(nullptr);
  (void)d.primary_ctx_release(dev);
  if (r != kCudaSuccess) {
    *why = "writing the export's proof into GPU memory: " + d.error_name(r);
    return Driver::to_status(r);
  }
  return Code::kSuccess;
}

bool Client::agent_gpu() {
  std::lock_guard<std::mutex> g(mu_);
  return ensure_connected().ok() && agent_gpu_;
}

Status Client::export_gpu(uint64_t device_ptr, size_t bytes, int device, GpuStaging* out,
                          std::string* why) {
  std::string scratch;
  if (why == nullptr) why = &scratch;
  if (out == nullptr || bytes == 0 || device_ptr == 0 || device < 0) {
    *why = "no memory named";
    return Code::kInvalidValue;
  }
  if (bytes < agent::kGpuProofBytes) {
    *why = "a GPU export is at least " + std::to_string(agent::kGpuProofBytes) +
           " bytes (it carries the proof the sender holds it)";
    return Code::kInvalidValue;
  }
  std::lock_guard<std::mutex> g(mu_);
  DPUKV_RETURN_IF_ERROR(ensure_connected());
  if (!agent_gpu_) {
    *why = "the agent has no GPU path (`dpukv stat` says why)";
    return Code::kNotSupported;
  }
  if (!cuda_) DPUKV_RETURN_IF_ERROR(cuda::Driver::open(&cuda_, why));
  using namespace cuda;  // NOLINT(google-build-using-namespace): the driver's names
  const Driver& d = *cuda_;
  CUdevice dev = 0;
  CUuuid uuid;
  CUcontext ctx = nullptr;
  CUresult r = d.device_get(&dev, device);
  if (r == kCudaSuccess) r = d.device_get_uuid(&uuid, dev);
  if (r == kCudaSuccess) r = d.primary_ctx_retain(&ctx, dev);
  if (r != kCudaSuccess) {
    *why = "CUDA device " + std::to_string(device) + ": " + d.error_name(r);
    return Driver::to_status(r);
  }
  // The primary context is the one torch and the runtime API use: making it
  // current on this thread changes nothing for them.
  r = d.ctx_set_current(ctx);
  CUdeviceptr base = 0;
  size_t alloc = 0;
  if (r == kCudaSuccess) r = d.mem_get_address_range(&base, &alloc, device_ptr);
  agent::GpuExportEntry e{};
  CUipcMemHandle h;
  if (r == kCudaSuccess && (device_ptr - base > alloc || bytes > alloc - (device_ptr - base))) {
    (void)d.primary_ctx_release(dev);
    *why = "the range leaves its allocation of " + std::to_string(alloc) + " bytes";
    return Code::kInvalidValue;
  }
  if (r == kCudaSuccess) r = d.ipc_get_mem_handle(&h, base);
  (void)d.primary_ctx_release(dev);
  if (r != kCudaSuccess) {
    *why = "not exportable device memory: " + d.error_name(r);
    return Code::kInvalidValue;
  }
  e.map_id = agent::kGpuMapBit | next_gpu_id_++;
  e.offset = device_ptr - base;
  e.bytes = bytes;
  std::memcpy(e.device_uuid, uuid.bytes, sizeof(e.device_uuid));
  std::memcpy(e.handle, h.reserved, sizeof(e.handle));
  const GpuExport x{e, device_ptr, device};
  DPUKV_RETURN_IF_ERROR(send_gpu_export(x, why));
  gpu_exports_.push_back(x);
  *out = GpuStaging{device_ptr, bytes, device, e.map_id};
  return Code::kSuccess;
}

Status Client::release_gpu(const GpuStaging& gs) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = std::find_if(gpu_exports_.begin(), gpu_exports_.end(),
                         [&](const GpuExport& x) { return x.e.map_id == gs.id; });
  // Not NOT_FOUND: bindings read that as "no agent", and the agent is not the issue.
  if (it == gpu_exports_.end()) return Code::kInvalidValue;
  gpu_exports_.erase(it);
  DPUKV_RETURN_IF_ERROR(ensure_connected());
  std::vector<uint8_t> resp;
  return call(Op::kGpuRelease, 0, &gs.id, sizeof(gs.id), 1, &resp);
}

}  // namespace dpukv
