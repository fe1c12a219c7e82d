#include "agent/gpu_service.h"

#include <cstdio>
#include <cstring>

#include "runtime/log.h"

namespace dpukv {

namespace {

std::string uuid_text(const uint8_t* u) {
  // As nvidia-smi prints it: GPU-8-4-4-4-12 hex digits.
  char s[48];
  std::snprintf(s, sizeof(s),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
                u[14], u[15]);
  return s;
}

}  // namespace

GpuService::GpuService(ProgressEngine* pe, CacheEngine* cache, const GpuServiceOptions& o)
    : opts_(o) {
  if (!o.enabled) {
    description_ = "off (--no-gpu)";
    return;
  }
  CudaEngineOptions eo;
  eo.driver_library = o.driver_library;
  // An event for every request the cache can have in flight, as the DMA engine
  // has a task for each: a copy never finds the engine full.
  eo.max_inflight = cache->options().max_requests;
  eo.hash_threads = o.hash_threads;
  eo.checksum = o.checksum;
  std::string why;
  std::unique_ptr<CudaEngine> e;
  Status st = CudaEngine::create(pe, eo, &e, &why);
  if (st.ok()) {
    // The arena is what every GPU copy reads or writes: pinned once, as a DOCA
    // mmap is registered once.
    void* base;
    uint64_t len;
    cache->arena(&base, &len);
    st = e->register_host(base, len, &why);
  }
  if (!st.ok()) {
    description_ = "off: " + why;
    APP_LOG_INFO("agent: GPU copies off: %s; host memory is served, GPU exports are refused",
                 why.c_str());
    return;
  }
  engine_ = std::move(e);
  cache->set_device_copier(engine_.get());
  description_ = "on: " + uuid_text(engine_->device_uuid());
  APP_LOG_INFO("agent: GPU copies on: CUDA device 0 (%s)",
               uuid_text(engine_->device_uuid()).c_str());
}

// The engine loads its checksum kernel here, before any client's request.
Status GpuService::start() {
  if (!engine_) return {};
  const Status st = engine_->start();
  if (!st.ok()) {
    description_ = "off: the CUDA engine did not start" +
                   (engine_->checksum_why().empty() ? "" : ": " + engine_->checksum_why());
    return st;
  }
  description_ +=
      engine_->checksum_design() == std::string("gpu-kernel")
          ? "; checksums on the GPU"
          : "; checksums on host threads" +
                (engine_->checksum_why().empty() ? std::string() : ": " + engine_->checksum_why());
  APP_LOG_INFO("agent: GPU path %s", description_.c_str());
  return st;
}

Status GpuService::stop() {
  return engine_ ? engine_->stop() : Status();
}

bool GpuService::idle() const {
  return !engine_ || engine_->state() == CtxState::kIdle;
}

Status GpuService::add(Exports* x, const agent::GpuExportEntry& e, const uint8_t* proof,
                       const std::string& over_limit, std::string* why) {
  auto refuse = [&](Status st, std::string text) {
    ++counters_.exports_refused;
    *why = std::move(text);
    return st;
  };
  if (!engine_) return refuse(Code::kNotSupported, "this agent has no GPU path: " + description_);
  if ((e.map_id & agent::kGpuMapBit) == 0 || e.reserved != 0)
    return refuse(Code::kInvalidValue, "a GPU export's map id must have the GPU bit set");
  for (const Exports::Map& m : x->maps)
    if (m.map_id == e.map_id)
      return refuse(Code::kInvalidValue, "map id already exported on this connection");
  if (x->maps.size() >= opts_.max_exports)
    return refuse(Code::kNoMemory,
                  "at most " + std::to_string(opts_.max_exports) + " GPU exports per client");
  if (!over_limit.empty()) return refuse(Code::kTooBig, over_limit);
  if (proof == nullptr)
    return refuse(Code::kNotPermitted,
                  "no proof asked for (kGpuProof) before this export: a GPU export must show "
                  "the sender holds the memory");
  GpuRegionDesc d;
  std::memcpy(d.handle.reserved, e.handle, sizeof(e.handle));
  std::memcpy(d.device_uuid, e.device_uuid, sizeof(d.device_uuid));
  d.offset = e.offset;
  d.bytes = e.bytes;
  uint64_t region = 0;
  Status st = engine_->import(d, proof, agent::kGpuProofBytes, &region, why);
  if (!st.ok()) {
    ++counters_.exports_refused;
    return st;
  }
  x->maps.push_back({e.map_id, region, e.bytes});
  x->bytes += e.bytes;
  ++counters_.exports;
  return Code::kSuccess;
}

Status GpuService::remove(Exports* x, uint64_t map_id) {
  for (size_t i = 0; i < x->maps.size(); ++i) {
    if (x->maps[i].map_id != map_id) continue;
    (void)engine_->release(x->maps[i].region);  // closed once its copies finish
    x->bytes -= x->maps[i].bytes;
    x->maps[i] = x->maps.back();
    x->maps.pop_back();
    ++counters_.releases;
    return Code::kSuccess;
  }
  return Code::kNotPermitted;
}

void GpuService::remove_all(Exports* x) {
  while (!x->maps.empty()) (void)remove(x, x->maps.back().map_id);
}

Status GpuService::range(const Exports& x, uint64_t map_id, uint64_t offset, uint64_t length,
                         DeviceRange* out) const {
  for (const Exports::Map& m : x.maps) {
    if (m.map_id != map_id) continue;
    if (length == 0 || offset > m.bytes || length > m.bytes - offset) return Code::kInvalidValue;
    *out = DeviceRange{m.region, offset, length};
    return Code::kSuccess;
  }
  return Code::kNotPermitted;
}

CudaEngine::Counters GpuService::engine_counters() const {
  return engine_ ? engine_->counters() : CudaEngine::Counters{};
}

uint64_t GpuService::regions() const {
  return engine_ ? engine_->regions() : 0;
}

}  // namespace dpukv
