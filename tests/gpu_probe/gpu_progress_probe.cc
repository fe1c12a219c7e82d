// What the progress thread spends per chunk on the GPU path: a cache engine and a
// CUDA engine on one progress engine, storing and retrieving a layer's chunks
// (adjacent 1 MiB ranges of one GPU export) through the driver. Submissions and
// polls run in measured_*(), which scripts/progress_instructions.sh counts with
// callgrind (instructions of this thread only: the double's copies run on its own
// thread, as a GPU's DMA does). Between polls the probe waits for the driver with
// cuCtxSynchronize, uncounted, so a poll rarely finds nothing (idle_polls says how
// often): the count is the same on a busy machine and an idle one.
//
// A second process (this binary, --child) holds the GPU memory and exports it,
// as an inference process does, its bytes a pattern. Exit 0 when every store and
// retrieve succeeded (each retrieve verified against its store's checksum).
#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cache/cache_engine.h"
#include "engines/gpu/cuda_engine.h"
#include "runtime/child_process.h"
#include "runtime/cuda_driver.h"
#include "runtime/progress_engine.h"

extern char** environ;

namespace dpukv {
namespace {

using namespace cuda;  // NOLINT(google-build-using-namespace)

constexpr uint64_t kChunk = 1 << 20;
constexpr uint8_t kProof[16] = {'d', 'p', 'u', 'k', 'v', '-', 'p', 'r',
                                'o', 'b', 'e', '-', 'p', 'r', 'o', 'f'};

int die(const char* what, const std::string& why = "") {
  std::fprintf(stderr, "gpu_progress_probe: %s%s%s\n", what, why.empty() ? "" : ": ", why.c_str());
  return 1;
}

// The child: GPU memory of `bytes`, the proof at its start, its handle on stdout;
// it lives until stdin closes.
int child(uint64_t bytes) {
  std::unique_ptr<Driver> d;
  std::string why;
  if (!Driver::open(&d, &why).ok()) return die("child driver", why);
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr mem = 0;
  CUipcMemHandle h;
  if (d->device_get(&dev, 0) != 0 || d->primary_ctx_retain(&ctx, dev) != 0 ||
      d->ctx_set_current(ctx) != 0 || d->mem_alloc(&mem, bytes) != 0)
    return die("child: no GPU memory");
  std::vector<uint8_t> fill(bytes);
  for (uint64_t i = 0; i < bytes; ++i) fill[i] = static_cast<uint8_t>(i * 131 + (i >> 20));
  std::memcpy(fill.data(), kProof, sizeof(kProof));
  if (d->memcpy_htod_async(mem, fill.data(), bytes, nullptr) != 0 ||
      d->stream_synchronize(nullptr) != 0 || d->ipc_get_mem_handle(&h, mem) != 0)
    return die("child: cannot export GPU memory");
  for (char b : h.reserved) std::printf("%02x", static_cast<uint8_t>(b));
  std::printf("\n");
  std::fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  return 0;
}

struct Probe {
  std::unique_ptr<ProgressEngine> pe;
  std::unique_ptr<CacheEngine> cache;
  std::unique_ptr<CudaEngine> gpu;
  std::unique_ptr<Driver> drv;  // this process's handle on the same driver: cuCtxSynchronize
  uint64_t region = 0;
  uint32_t chunks = 0;
  std::vector<Status> st;
  uint64_t idle_polls = 0;     // polls in measured rounds that found nothing
  std::vector<ChunkKey> keys;  // made before: the client's work, not the agent's
};

ChunkKey key(uint64_t i) {
  return key_from_block_id(KeyContext{7, 1, 0, 0}, i);
}

void done(void* arg, Status s) {
  *static_cast<Status*>(arg) = s;
}

// The counted work (scripts/progress_instructions.sh counts calls of measured_*):
// a layer's requests submitted, and each poll of the progress engine. Waiting for
// the driver between polls is not counted; kept out of line to be found by name.
__attribute__((noinline)) void measured_submit(Probe* p, bool store, uint64_t first_key) {
  for (uint32_t i = 0; i < p->chunks; ++i) {
    p->st[i] = Code::kInProgress;
    const DeviceRange r{p->region, uint64_t{16} * 4096 + i * kChunk, kChunk};
    const ChunkKey& k = p->keys[first_key + i];
    const Status s = store ? p->cache->store_device(k, r, &done, &p->st[i])
                           : p->cache->retrieve_device(k, r, &done, &p->st[i]);
    if (!s.ok()) p->st[i] = s;
  }
}

__attribute__((noinline)) size_t measured_poll(Probe* p) {
  return p->pe->progress();
}

// One layer: every chunk stored from (store) or retrieved into adjacent ranges of
// the export, driven to completion.
bool round(Probe* p, bool store, uint64_t first_key) {
  measured_submit(p, store, first_key);
  for (;;) {
    const size_t found = measured_poll(p);
    bool all = true;
    for (uint32_t i = 0; i < p->chunks; ++i) all = all && p->st[i] != Code::kInProgress;
    if (all) break;
    (void)p->drv->ctx_synchronize();  // the GPU's work is done before the next poll
    if (found == 0) {                 // host threads still hashing: let them finish, not spin
      ++p->idle_polls;
      usleep(1000);
    }
  }
  for (uint32_t i = 0; i < p->chunks; ++i)
    if (!p->st[i].ok()) return false;
  return true;
}

int run(const char* self, uint32_t chunks, uint32_t rounds, const char* checksum) {
  const uint64_t region_bytes = 16 * 4096 + uint64_t{chunks} * kChunk;
  int to[2], from[2];
  if (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0) return die("pipe");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from[1], 1);
  std::string bytes = std::to_string(region_bytes);
  char* argv[] = {const_cast<char*>(self), const_cast<char*>("--child"), bytes.data(), nullptr};
  pid_t pid = -1;
  // By its path, not /proc/self/exe: under valgrind that is valgrind, and the
  // child (a new exec, not traced) runs natively.
  if (posix_spawn(&pid, self, &fa, nullptr, argv, environ) != 0) return die("spawn");
  posix_spawn_file_actions_destroy(&fa);
  close(to[0]);
  close(from[1]);
  FILE* in = fdopen(from[0], "r");
  char line[256] = {};
  if (in == nullptr || std::fgets(line, sizeof(line), in) == nullptr || std::strlen(line) < 128)
    return die("the child did not export its memory");

  Probe p;
  p.chunks = chunks;
  p.st.assign(chunks, Code::kSuccess);
  for (uint64_t i = 0; i < uint64_t{chunks} * rounds; ++i) p.keys.push_back(key(i));
  std::string why;
  if (!ProgressEngine::create(&p.pe).ok()) return die("progress engine");
  CacheOptions co;
  // The agent's defaults: 64 MiB allocator pages (--max-chunk-size), room for two
  // layers' chunks, so later rounds evict.
  co.max_chunk_bytes = 64 << 20;
  co.memory_bytes = (2 * uint64_t{chunks} * kChunk + co.max_chunk_bytes - 1) / co.max_chunk_bytes *
                    co.max_chunk_bytes;
  co.max_requests = 1024;
  if (!CacheEngine::create(p.pe.get(), co, &p.cache).ok() || !p.cache->start().ok())
    return die("cache engine");
  CudaEngineOptions go;
  go.max_inflight = co.max_requests;
  go.checksum = std::strcmp(checksum, "host") == 0 ? CudaEngineOptions::Checksum::kHost
                                                   : CudaEngineOptions::Checksum::kAuto;
  if (!CudaEngine::create(p.pe.get(), go, &p.gpu, &why).ok() || !p.gpu->start().ok())
    return die("cuda engine", why);
  void* base;
  uint64_t len;
  p.cache->arena(&base, &len);
  if (!p.gpu->register_host(base, len, &why).ok()) return die("register", why);
  p.cache->set_device_copier(p.gpu.get());
  if (!Driver::open(&p.drv, &why).ok()) return die("driver", why);
  GpuRegionDesc d{};
  for (size_t i = 0; i < 64; ++i)
    d.handle.reserved[i] = static_cast<char>(std::stoi(std::string(line + 2 * i, 2), nullptr, 16));
  std::memcpy(d.device_uuid, p.gpu->device_uuid(), 16);
  d.offset = 0;
  d.bytes = region_bytes;
  if (!p.gpu->import(d, kProof, sizeof(kProof), &p.region, &why).ok()) return die("import", why);

  bool ok = true;
  for (uint32_t r = 0; r < rounds && ok; ++r) {
    ok = round(&p, true, uint64_t{r} * chunks) && round(&p, false, uint64_t{r} * chunks);
  }
  const CudaEngine::Counters c = p.gpu->counters();
  std::printf(
      "{\"chunks\": %u, \"rounds\": %u, \"chunk_bytes\": %llu, \"checksum\": \"%s\", "
      "\"driver_copies\": %llu, \"idle_polls\": %llu, \"ok\": %s}\n",
      chunks, rounds, static_cast<unsigned long long>(kChunk), p.gpu->checksum_design(),
      static_cast<unsigned long long>(c.copies), static_cast<unsigned long long>(p.idle_polls),
      ok ? "true" : "false");
  (void)p.gpu->release(p.region);
  (void)p.cache->stop();
  (void)p.gpu->stop();
  while (p.cache->state() != CtxState::kIdle || p.gpu->state() != CtxState::kIdle) p.pe->progress();
  std::fclose(in);
  close(to[1]);  // the child's stdin: it exits
  (void)reap_child(pid, nullptr);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace dpukv

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--child") == 0)
    return dpukv::child(std::strtoull(argv[2], nullptr, 10));
  if (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || argc > 4)) {
    std::printf("usage: gpu_progress_probe [CHUNKS [ROUNDS [auto|host]]]\n");
    return argc > 4 ? 2 : 0;
  }
  const uint32_t chunks = argc > 1 ? static_cast<uint32_t>(std::atoi(argv[1])) : 32;
  const uint32_t rounds = argc > 2 ? static_cast<uint32_t>(std::atoi(argv[2])) : 4;
  if (chunks == 0 || chunks > 512 || rounds == 0) return 2;
  char self[4096];
  if (realpath(argv[0], self) == nullptr) return 2;
  return dpukv::run(self, chunks, rounds, argc > 3 ? argv[3] : "auto");
}
