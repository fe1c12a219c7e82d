// The CUDA copy engine through the driver test double (tests/cuda_double/): a
// client process allocates GPU memory and exports it with an IPC handle; the
// engine imports it, copies into and out of it at odd offsets and sizes from the
// progress engine (events polled, nothing blocks), and each byte is checked on the
// other side. Refused imports (a foreign device, a bad handle, a range outside the
// allocation), a copy the GPU fails, and a client killed with -9 are each the
// value the caller sees while the engine goes on. On a GPU machine
// scripts/gpu_check.sh runs this test against NVIDIA's driver (DPUKV_CUDA_DRIVER).
#include "engines/gpu/cuda_engine.h"

#include <xxhash.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda_double/cuda_test_support.h"
#include "runtime/child_process.h"
#include "runtime/progress_engine.h"

namespace dpukv {
namespace {

using namespace cuda;  // NOLINT(google-build-using-namespace)

using cuda_test::inject;
using cuda_test::library;

uint8_t client_byte(uint64_t i) {
  return static_cast<uint8_t>(i * 13 + 5);
}
uint8_t agent_byte(uint64_t i) {
  return static_cast<uint8_t>(i * 29 + 11);
}

constexpr uint64_t kAlloc = 4 << 20;

// The client: a child process running CudaEngineClient.Serve, talking over pipes.
struct Client {
  pid_t pid = -1;
  FILE* in = nullptr;   // its stdin
  FILE* out = nullptr;  // its stdout
  GpuRegionDesc desc{};
  bool start(const std::vector<std::string>& extra_env = {}) {
    int to[2], from[2];
    if (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0) return false;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from[1], 1);
    std::vector<std::string> env = {"DPUKV_CUDA_CLIENT=1"};
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    pid = cuda_test::spawn_test("CudaEngineClient.Serve", std::move(env), &fa);
    posix_spawn_file_actions_destroy(&fa);
    close(to[0]);
    close(from[1]);
    if (pid < 0) return false;
    in = fdopen(to[1], "w");
    out = fdopen(from[0], "r");
    // Its first line: the handle and the device UUID, in hex (gtest prints before).
    char line[512];
    while (std::fgets(line, sizeof(line), out) != nullptr)
      if (std::strncmp(line, "HANDLE ", 7) == 0) {
        for (size_t i = 0; i < 64; ++i)
          desc.handle.reserved[i] =
              static_cast<char>(std::stoi(std::string(line + 7 + 2 * i, 2), nullptr, 16));
        for (size_t i = 0; i < 16; ++i)
          desc.device_uuid[i] =
              static_cast<uint8_t>(std::stoi(std::string(line + 7 + 129 + 2 * i, 2), nullptr, 16));
        return true;
      }
    return false;
  }
  // Asks it to check [first, first + n) of its allocation against agent_byte().
  bool check(uint64_t first, uint64_t n) {
    std::fprintf(in, "check %llu %llu\n", static_cast<unsigned long long>(first),
                 static_cast<unsigned long long>(n));
    std::fflush(in);
    char line[128];
    while (std::fgets(line, sizeof(line), out) != nullptr) {
      if (std::strncmp(line, "ok", 2) == 0) return true;
      if (std::strncmp(line, "bad", 3) == 0) return false;
    }
    return false;
  }
  void kill9() {
    if (pid > 0) {
      (void)signal_child(pid, SIGKILL);
      (void)reap_child(pid, nullptr);
    }
    pid = -1;
  }
  ~Client() {
    if (in) std::fclose(in);  // EOF: it exits
    if (out) std::fclose(out);
    if (pid > 0) (void)reap_child(pid, nullptr);
  }
};

class CudaEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ProgressEngine::create(&pe_).ok());
    CudaEngineOptions o;
    o.driver_library = library();
    o.streams = 3;
    o.max_inflight = 64;
    std::string why;
    ASSERT_TRUE(CudaEngine::create(pe_.get(), o, &e_, &why).ok()) << why;
    ASSERT_TRUE(e_->start().ok());
    host_.assign(8 << 20, 0);
    ASSERT_TRUE(e_->register_host(host_.data(), host_.size(), &why).ok()) << why;
  }
  void TearDown() override {
    inject("none");
    if (e_) {
      (void)e_->stop();
      while (e_->state() != CtxState::kIdle) pe_->progress();
    }
  }
  // An import whose proof is what the client's memory holds at the range's start
  // (the child fills it with client_byte()), as a sender's written proof would be.
  Status import(const GpuRegionDesc& d, uint64_t* id, std::string* why) {
    uint8_t proof[16];
    for (uint64_t i = 0; i < sizeof(proof); ++i) proof[i] = client_byte(d.offset + i);
    return e_->import(d, proof, sizeof(proof), id, why);
  }
  // One copy, progressed to its completion (a minute at most); its status.
  Status copy(uint64_t region, uint64_t off, uint8_t* host, uint64_t n, bool to_gpu,
              uint64_t* sum = nullptr) {
    struct R {
      bool done = false;
      Status st;
    } r;
    Status s = e_->copy(
        region, off, host, n, to_gpu, sum,
        [](void* a, Status st) {
          static_cast<R*>(a)->done = true;
          static_cast<R*>(a)->st = st;
        },
        &r);
    if (!s.ok()) return s;
    const auto end = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    while (!r.done && std::chrono::steady_clock::now() < end) pe_->progress();
    return r.done ? r.st : Status(Code::kTimeout);
  }
  std::unique_ptr<ProgressEngine> pe_;
  std::unique_ptr<CudaEngine> e_;
  std::vector<uint8_t> host_;
};

TEST_F(CudaEngineTest, CopiesIntoAndOutOfAClientsGpuMemoryByteForByte) {
  Client c;
  ASSERT_TRUE(c.start());
  GpuRegionDesc d = c.desc;
  d.offset = 4096;
  d.bytes = (2 << 20) + 123;
  uint64_t id = 0;
  std::string why;
  ASSERT_TRUE(import(d, &id, &why).ok()) << why;
  // GPU -> host at odd offsets and sizes: the client's bytes.
  for (uint64_t off : {uint64_t{0}, uint64_t{1}, uint64_t{4095}, uint64_t{1000003}}) {
    const uint64_t n = d.bytes - off - off % 7;
    std::memset(host_.data(), 0, host_.size());
    uint64_t sum = 0;  // of the bytes that landed
    ASSERT_TRUE(copy(id, off, host_.data() + 3, n, false, &sum).ok()) << off;
    for (uint64_t i = 0; i < n; ++i)
      ASSERT_EQ(host_[3 + i], client_byte(d.offset + off + i)) << "offset " << off << " byte " << i;
    EXPECT_EQ(sum, XXH3_64bits(host_.data() + 3, n)) << off;
  }
  // host -> GPU: the client reads the agent's bytes in its own memory.
  for (uint64_t i = 0; i < d.bytes; ++i) host_[i + 17] = agent_byte(d.offset + i);
  uint64_t sum = 0;
  ASSERT_TRUE(copy(id, 0, host_.data() + 17, d.bytes, true, &sum).ok());
  EXPECT_TRUE(c.check(d.offset, d.bytes));
  EXPECT_EQ(sum, XXH3_64bits(host_.data() + 17, d.bytes));
  // Many copies in flight over the streams, completed out of the engine's order;
  // every other one also checksums what landed, on the hash threads.
  std::vector<Status> st(48, Code::kInProgress);
  std::vector<uint64_t> sums(st.size(), 0);
  for (size_t k = 0; k < st.size(); ++k)
    ASSERT_TRUE(e_->copy(
                      id, k * 4096, host_.data() + (4 << 20) + k * 4096, 4096, false,
                      k % 2 ? &sums[k] : nullptr,
                      [](void* a, Status s) { *static_cast<Status*>(a) = s; }, &st[k])
                    .ok());
  EXPECT_EQ(e_->inflight(), st.size());
  const auto end = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (e_->inflight() > 0 && std::chrono::steady_clock::now() < end) pe_->progress();
  for (size_t k = 0; k < st.size(); ++k) {
    ASSERT_TRUE(st[k].ok()) << k;
    for (uint64_t i = 0; i < 4096; i += 511)
      ASSERT_EQ(host_[(4 << 20) + k * 4096 + i], agent_byte(d.offset + k * 4096 + i));
    EXPECT_EQ(sums[k], k % 2 ? XXH3_64bits(host_.data() + (4 << 20) + k * 4096, 4096) : 0) << k;
  }
  // Aligned ranges were hashed on the GPU, the odd ones on host threads.
  EXPECT_STREQ(e_->checksum_design(), "gpu-kernel") << e_->checksum_why();
  EXPECT_GT(e_->counters().gpu_hashed, 0u);
  EXPECT_GT(e_->counters().host_hashed, 0u);
  EXPECT_TRUE(e_->release(id).ok());
  EXPECT_EQ(e_->regions(), 0u);
}

// The GPU's checksum is of the bytes where they are on the GPU: a copy that lands
// changed is seen (host threads would hash the intact source); a kernel that
// faults fails its own copy, and the engine goes on.
TEST_F(CudaEngineTest, TheGpuChecksumsWhatLandedAndAFaultingKernelFailsItsCopyOnly) {
  ASSERT_STREQ(e_->checksum_design(), "gpu-kernel") << e_->checksum_why();
  Client c;
  ASSERT_TRUE(c.start());
  GpuRegionDesc d = c.desc;
  d.offset = 0;
  d.bytes = 2 << 20;
  uint64_t id = 0;
  std::string why;
  ASSERT_TRUE(import(d, &id, &why).ok()) << why;
  const uint64_t n = (1 << 20) + 40;  // not whole blocks: the kernel's tail runs
  for (uint64_t i = 0; i < n; ++i) host_[i] = agent_byte(i);
  const CudaEngine::Counters before = e_->counters();
  uint64_t sum = 0;
  ASSERT_TRUE(copy(id, 0, host_.data(), n, true, &sum).ok());
  EXPECT_EQ(sum, XXH3_64bits(host_.data(), n));
  EXPECT_TRUE(c.check(0, n));
  sum = 0;
  ASSERT_TRUE(copy(id, 8, host_.data() + (4 << 20), 3 * 4096, false, &sum).ok());
  EXPECT_EQ(sum, XXH3_64bits(host_.data() + (4 << 20), 3 * 4096));
  EXPECT_EQ(e_->counters().gpu_hashed, before.gpu_hashed + 2);
  EXPECT_EQ(e_->counters().host_hashed, before.host_hashed);
  if (!inject("flip_once")) GTEST_SKIP() << "the faults need the double";
  ASSERT_TRUE(copy(id, 0, host_.data(), n, true, &sum).ok());
  EXPECT_NE(sum, XXH3_64bits(host_.data(), n)) << "the landed bytes differ from the host's";
  std::vector<uint8_t> landed(host_.begin(), host_.begin() + n);
  landed[0] ^= 0x80;
  EXPECT_EQ(sum, XXH3_64bits(landed.data(), n));
  ASSERT_TRUE(inject("kernel_nth=1"));
  sum = 42;
  EXPECT_EQ(copy(id, 0, host_.data(), n, true, &sum), Code::kIoFailed);
  EXPECT_EQ(sum, 42u);
  EXPECT_TRUE(e_->broken().empty());
  for (int k = 0; k < 4; ++k) {
    ASSERT_TRUE(copy(id, 0, host_.data(), n, true, &sum).ok()) << k;
    EXPECT_EQ(sum, XXH3_64bits(host_.data(), n));
  }
  EXPECT_STREQ(e_->checksum_design(), "gpu-kernel");
}

// A driver that cannot load the kernel, or a kernel whose digest differs from the
// host's xxh3 at start, leaves checksums on host threads (auto) and says why; a
// GPU checksum required (Checksum::kGpu) then keeps the engine from starting.
TEST_F(CudaEngineTest, AKernelThatDoesNotLoadOrDisagreesLeavesChecksumsOnTheHost) {
  if (!inject("none")) GTEST_SKIP() << "needs the double";
  Client c;
  ASSERT_TRUE(c.start());
  GpuRegionDesc d = c.desc;
  d.offset = 0;
  d.bytes = 2 << 20;  // the copies go past the proof at its start
  std::vector<uint8_t> host(2 << 20);
  for (size_t i = 0; i < host.size(); ++i) host[i] = agent_byte(i);
  struct Case {
    const char* fault;
    CudaEngineOptions::Checksum want;
    const char* why;
  };
  for (const Case& k : {Case{"module", CudaEngineOptions::Checksum::kAuto, "PTX"},
                        Case{"kernel_wrong", CudaEngineOptions::Checksum::kAuto, "gave"},
                        Case{"none", CudaEngineOptions::Checksum::kHost, ""}}) {
    SCOPED_TRACE(k.fault);
    ASSERT_TRUE(inject("none"));
    ASSERT_TRUE(inject(k.fault));
    CudaEngineOptions o;
    o.driver_library = library();
    o.checksum = k.want;
    std::unique_ptr<CudaEngine> e;
    std::string why;
    ASSERT_TRUE(CudaEngine::create(pe_.get(), o, &e, &why).ok()) << why;
    ASSERT_TRUE(e->start().ok());
    EXPECT_STREQ(e->checksum_design(), "host-threads");
    EXPECT_NE(e->checksum_why().find(k.why), std::string::npos) << e->checksum_why();
    ASSERT_TRUE(e->register_host(host.data(), host.size(), &why).ok()) << why;
    uint8_t proof[16];
    for (uint64_t i = 0; i < sizeof(proof); ++i) proof[i] = client_byte(i);
    uint64_t id = 0;
    const Status is = e->import(d, proof, sizeof(proof), &id, &why);
    ASSERT_TRUE(is.ok()) << is.name() << ": " << why;
    struct R {
      bool done = false;
      Status st;
    } r;
    uint64_t sum = 0;
    ASSERT_TRUE(e->copy(
                     id, 1 << 20, host.data(), 1 << 20, true, &sum,
                     [](void* a, Status st) {
                       static_cast<R*>(a)->done = true;
                       static_cast<R*>(a)->st = st;
                     },
                     &r)
                    .ok());
    while (!r.done) pe_->progress();
    EXPECT_TRUE(r.st.ok());
    EXPECT_EQ(sum, XXH3_64bits(host.data(), 1 << 20));
    EXPECT_EQ(e->counters().host_hashed, 1u);
    EXPECT_EQ(e->counters().gpu_hashed, 0u);
    (void)e->stop();
    while (e->state() != CtxState::kIdle) pe_->progress();
  }
  ASSERT_TRUE(inject("module"));
  CudaEngineOptions o;
  o.driver_library = library();
  o.checksum = CudaEngineOptions::Checksum::kGpu;
  std::unique_ptr<CudaEngine> e;
  std::string why;
  ASSERT_TRUE(CudaEngine::create(pe_.get(), o, &e, &why).ok()) << why;
  EXPECT_EQ(e->start(), Code::kNotSupported);
  EXPECT_NE(e->checksum_why().find("PTX"), std::string::npos) << e->checksum_why();
}

TEST_F(CudaEngineTest, BadImportsAndCopiesAreRefusedAndTheEngineGoesOn) {
  if (!inject("none")) GTEST_SKIP() << "needs the double";
  Client c;
  ASSERT_TRUE(c.start());
  std::string why;
  uint64_t id = 0;
  GpuRegionDesc d = c.desc;
  d.offset = kAlloc - 100;
  d.bytes = 101;  // one byte past the allocation
  EXPECT_EQ(import(d, &id, &why), Code::kInvalidValue);
  EXPECT_NE(why.find("outside its allocation"), std::string::npos) << why;
  d = c.desc;
  d.offset = 0;
  d.bytes = kAlloc;
  d.handle.reserved[0] ^= 0x55;  // not a handle
  EXPECT_EQ(import(d, &id, &why), Code::kInvalidValue);
  d = c.desc;
  d.offset = 0;
  d.bytes = kAlloc;
  d.device_uuid[3] ^= 1;  // said to be on another GPU
  EXPECT_EQ(import(d, &id, &why), Code::kNotPermitted);
  EXPECT_EQ(e_->regions(), 0u);
  EXPECT_EQ(e_->counters().refused, 3u);
  // A handle that opens, of memory that does not hold the proof: not the sender's.
  d = c.desc;
  d.offset = 0;
  d.bytes = 1 << 20;
  uint8_t wrong[16] = {};
  EXPECT_EQ(e_->import(d, wrong, sizeof(wrong), &id, &why), Code::kNotPermitted);
  EXPECT_NE(why.find("proof"), std::string::npos) << why;
  d.bytes = 15;  // shorter than a proof
  EXPECT_EQ(import(d, &id, &why), Code::kInvalidValue);
  EXPECT_EQ(e_->regions(), 0u);
  EXPECT_EQ(e_->counters().refused, 5u);
  d = c.desc;
  d.offset = 0;
  d.bytes = 1 << 20;
  ASSERT_TRUE(import(d, &id, &why).ok()) << why;
  // Copies outside the region or the registered host memory: refused at once.
  EXPECT_EQ(copy(id, (1 << 20) - 10, host_.data(), 11, false), Code::kInvalidValue);
  EXPECT_EQ(copy(id, 0, host_.data() + host_.size() - 10, 11, false), Code::kInvalidValue);
  std::vector<uint8_t> elsewhere(64);
  EXPECT_EQ(copy(id, 0, elsewhere.data(), 64, false), Code::kInvalidValue);
  EXPECT_EQ(copy(id + 99, 0, host_.data(), 64, false), Code::kInvalidValue);
  // The GPU fails a copy: that request fails, the next ones work.
  ASSERT_TRUE(inject("copy_once"));
  EXPECT_EQ(copy(id, 0, host_.data(), 4096, false), Code::kIoFailed);
  EXPECT_EQ(e_->counters().streams_replaced, 1u);
  EXPECT_TRUE(e_->broken().empty());
  // A failed copy to the GPU whose hash runs beside it fails once both are back,
  // and leaves the caller's checksum alone.
  ASSERT_TRUE(inject("copy_once"));
  uint64_t sum = 42;
  EXPECT_EQ(copy(id, 0, host_.data(), 4096, true, &sum), Code::kIoFailed);
  EXPECT_EQ(sum, 42u);
  EXPECT_EQ(e_->counters().streams_replaced, 2u);
  EXPECT_EQ(e_->inflight(), 0u);
  for (int k = 0; k < 6; ++k) EXPECT_TRUE(copy(id, 0, host_.data(), 4096, false).ok()) << k;
  EXPECT_EQ(host_[100], client_byte(100));
  // The client is killed: its region is released; the engine serves another client.
  c.kill9();
  EXPECT_TRUE(e_->release(id).ok());
  EXPECT_EQ(e_->release(id), Code::kNotFound);
  Client other;
  ASSERT_TRUE(other.start());
  d = other.desc;
  d.offset = 0;
  d.bytes = kAlloc;
  ASSERT_TRUE(import(d, &id, &why).ok()) << why;
  EXPECT_TRUE(copy(id, 77, host_.data(), 1000, false).ok());
  EXPECT_EQ(host_[0], client_byte(77));
}

// The client side, run only as a child of the tests above: allocates GPU memory,
// fills it with client_byte(), prints its IPC handle and device UUID, then checks
// ranges on request until its stdin closes.
TEST(CudaEngineClient, Serve) {
  if (std::getenv("DPUKV_CUDA_CLIENT") == nullptr) GTEST_SKIP() << "a child of CudaEngineTest";
  std::unique_ptr<Driver> d;
  std::string why;
  ASSERT_TRUE(Driver::open_library(library(), &d, &why).ok()) << why;
  CUdevice dev;
  CUcontext ctx;
  ASSERT_EQ(d->device_get(&dev, 0), kCudaSuccess);
  ASSERT_EQ(d->primary_ctx_retain(&ctx, dev), kCudaSuccess);
  ASSERT_EQ(d->ctx_set_current(ctx), kCudaSuccess);
  CUdeviceptr mem = 0;
  ASSERT_EQ(d->mem_alloc(&mem, kAlloc), kCudaSuccess);
  std::vector<uint8_t> buf(kAlloc);
  for (uint64_t i = 0; i < kAlloc; ++i) buf[i] = client_byte(i);
  CUstream s;
  ASSERT_EQ(d->stream_create(&s, kStreamNonBlocking), kCudaSuccess);
  ASSERT_EQ(d->memcpy_htod_async(mem, buf.data(), kAlloc, s), kCudaSuccess);
  ASSERT_EQ(d->stream_synchronize(s), kCudaSuccess);
  CUipcMemHandle h;
  ASSERT_EQ(d->ipc_get_mem_handle(&h, mem), kCudaSuccess);
  CUuuid u;
  ASSERT_EQ(d->device_get_uuid(&u, dev), kCudaSuccess);
  std::printf("HANDLE ");
  for (char b : h.reserved) std::printf("%02x", static_cast<uint8_t>(b));
  std::printf(" ");
  for (char b : u.bytes) std::printf("%02x", static_cast<uint8_t>(b));
  std::printf("\n");
  std::fflush(stdout);
  char line[128];
  while (std::fgets(line, sizeof(line), stdin) != nullptr) {
    unsigned long long first = 0, n = 0;
    if (std::sscanf(line, "check %llu %llu", &first, &n) != 2) continue;
    ASSERT_EQ(d->memcpy_dtoh_async(buf.data(), mem + first, n, s), kCudaSuccess);
    ASSERT_EQ(d->stream_synchronize(s), kCudaSuccess);
    bool good = true;
    for (uint64_t i = 0; i < n && good; ++i) good = buf[i] == agent_byte(first + i);
    std::printf(good ? "ok\n" : "bad\n");
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace dpukv
