// The agent's GPU half: the CUDA copy engine when a driver and a device are there,
// the GPU memory each session exported, and what the agent says about both.
//
// Without a driver (or with the arena not registrable with it) the service is off,
// says why once in the log and in `dpukv stat`, and the agent answers GPU exports
// NOT_SUPPORTED with that reason; HELLO tells clients up front, so they take the
// host-staging path instead. Host memory is served either way.
//
// A session's exports are checked as memfd exports are: a map id the session did
// not export is NOT_PERMITTED, a range outside its export INVALID_VALUE, and the
// bytes one client exports count against the same per-client staging limit. They
// are closed when the client releases them, when its session ends, or when it dies
// (a copy still in flight closes its region when it finishes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/cache_engine.h"
#include "engines/gpu/cuda_engine.h"
#include "protocol/agent_wire.h"

namespace dpukv {

struct GpuServiceOptions {
  bool enabled = true;         // false: never load a driver (`--no-gpu`)
  std::string driver_library;  // empty: DPUKV_CUDA_DRIVER, else libcuda.so.1
  uint32_t max_exports = 64;   // GPU exports one session may hold
  uint32_t hash_threads = 1;   // the CUDA engine's checksum threads (--dma-threads)
  CudaEngineOptions::Checksum checksum = CudaEngineOptions::Checksum::kAuto;  // --gpu-checksum
};

class GpuService {
 public:
  // The GPU memory one session exported.
  struct Exports {
    struct Map {
      uint64_t map_id, region, bytes;
    };
    std::vector<Map> maps;
    uint64_t bytes = 0;
  };
  struct Counters {
    uint64_t exports = 0, exports_refused = 0, releases = 0;
  };

  // Never fails: an engine that cannot start leaves the service off, with why.
  GpuService(ProgressEngine* pe, CacheEngine* cache, const GpuServiceOptions& o);
  bool on() const { return engine_ != nullptr; }
  // "on: GPU-xxxxxxxx-…, checksums on the GPU" (once started), or why the path is off.
  const std::string& description() const { return description_; }

  Status start();
  Status stop();
  bool idle() const;

  // A client's export. proof: the session's proof (agent_wire.h, kGpuProof), which
  // the exported range must start with; null: the session asked for none, and the
  // export is refused. over_limit: why the export would pass the staging limits
  // (the channel's ComchBase::import_fits, host and GPU counted together), or
  // empty when it fits. *why says what was wrong.
  Status add(Exports* x, const agent::GpuExportEntry& e, const uint8_t* proof,
             const std::string& over_limit, std::string* why);
  Status remove(Exports* x, uint64_t map_id);
  void remove_all(Exports* x);
  // [offset, offset + length) of a map this session exported, as the cache names
  // device memory. NOT_PERMITTED: not this session's; INVALID_VALUE: outside it.
  Status range(const Exports& x, uint64_t map_id, uint64_t offset, uint64_t length,
               DeviceRange* out) const;

  const Counters& counters() const { return counters_; }
  // The engine's counters (zeros when off).
  CudaEngine::Counters engine_counters() const;
  uint64_t regions() const;

 private:
  std::unique_ptr<CudaEngine> engine_;
  std::string description_;
  GpuServiceOptions opts_;
  Counters counters_;
};

}  // namespace dpukv
