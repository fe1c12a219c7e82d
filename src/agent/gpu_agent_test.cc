// The agent's GPU path end to end: an agent process with its CUDA engine, this
// process as a client exporting GPU memory (and, for the killed-client test, a
// child process of it). In CI both sides load the CUDA driver TEST DOUBLE
// (tests/cuda_double/); scripts/gpu_check.sh runs the same tests on NVIDIA's driver,
// where the fault tests, which need the double, skip.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "cuda_double/cuda_test_support.h"
#include "protocol/agent_wire.h"
#include "runtime/child_process.h"
#include "runtime/cuda_driver.h"
#include "runtime/log.h"

namespace dpukv {
namespace {

using namespace cuda;  // NOLINT(google-build-using-namespace): the driver's names

bool double_driver() {
  return cuda_test::library() == DPUKV_CUDA_DOUBLE;
}

// The agent binary: the build's, or DPUKV_BIN (a bundle on a GPU machine).
std::string agent_bin() {
  const char* b = std::getenv("DPUKV_BIN");
  return b != nullptr && *b != '\0' ? b : DPUKV_BIN;
}

// Device memory of this process, filled and read through the driver's copies.
class DeviceMemory {
 public:
  explicit DeviceMemory(size_t bytes) : bytes_(bytes) {
    std::string why;
    EXPECT_TRUE(Driver::open_library(cuda_test::library(), &drv_, &why).ok()) << why;
    if (!drv_) return;
    EXPECT_EQ(drv_->device_get(&dev_, 0), kCudaSuccess);
    EXPECT_EQ(drv_->primary_ctx_retain(&ctx_, dev_), kCudaSuccess);
    EXPECT_EQ(drv_->ctx_set_current(ctx_), kCudaSuccess);
    EXPECT_EQ(drv_->mem_alloc(&ptr_, bytes), kCudaSuccess);
  }
  ~DeviceMemory() {
    if (ptr_ != 0) (void)drv_->mem_free(ptr_);
    if (ctx_ != nullptr) (void)drv_->primary_ctx_release(dev_);
  }
  CUdeviceptr ptr() const { return ptr_; }
  void write(size_t off, const std::vector<uint8_t>& b) {
    ASSERT_EQ(drv_->memcpy_htod_async(ptr_ + off, b.data(), b.size(), nullptr), kCudaSuccess);
    ASSERT_EQ(drv_->stream_synchronize(nullptr), kCudaSuccess);
  }
  std::vector<uint8_t> read(size_t off, size_t n) {
    std::vector<uint8_t> b(n);
    EXPECT_EQ(drv_->memcpy_dtoh_async(b.data(), ptr_ + off, n, nullptr), kCudaSuccess);
    EXPECT_EQ(drv_->stream_synchronize(nullptr), kCudaSuccess);
    return b;
  }
  Driver& driver() { return *drv_; }

 private:
  std::unique_ptr<Driver> drv_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUdeviceptr ptr_ = 0;
  size_t bytes_;
};

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> b(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& v : b) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v = static_cast<uint8_t>(x);
  }
  return b;
}

ChunkKey key(uint64_t i) {
  return key_from_block_id(KeyContext{model_id("gpu-test"), 1, 0, 0}, i);
}

// A raw GPU_PROOF request: the session's proof for its next export.
std::vector<uint8_t> gpu_proof(Client* c) {
  agent::AgentHeader hdr{};
  hdr.op = static_cast<uint16_t>(agent::Op::kGpuProof);
  hdr.version = agent::kProtocolVersion;
  hdr.request_id = 776;
  std::vector<uint8_t> resp;
  EXPECT_TRUE(c->raw_request(&hdr, sizeof(hdr), &resp).ok());
  EXPECT_EQ(resp.size(), sizeof(hdr) + agent::kGpuProofBytes);
  if (resp.size() < sizeof(hdr)) return {};
  return std::vector<uint8_t>(resp.begin() + sizeof(hdr), resp.end());
}

// A raw GPU_EXPORT request, as any client could send it; its status and text.
Status gpu_export_raw(Client* c, const agent::GpuExportEntry& e, std::string* text) {
  agent::AgentHeader hdr{};
  hdr.op = static_cast<uint16_t>(agent::Op::kGpuExport);
  hdr.version = agent::kProtocolVersion;
  hdr.count = 1;
  hdr.request_id = 777;
  std::vector<uint8_t> msg(sizeof(hdr) + sizeof(e));
  std::memcpy(msg.data(), &hdr, sizeof(hdr));
  std::memcpy(msg.data() + sizeof(hdr), &e, sizeof(e));
  std::vector<uint8_t> resp;
  EXPECT_TRUE(c->raw_request(msg.data(), static_cast<uint32_t>(msg.size()), &resp).ok());
  if (resp.size() < sizeof(hdr)) return Status(Code::kCorrupted);
  text->assign(resp.begin() + sizeof(hdr), resp.end());
  return Status(static_cast<Code>(resp[offsetof(agent::AgentHeader, status)]));
}

class GpuAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log_set_level(LogSource::kLib, LogLevel::kError);
    // The client side loads the same driver as the agent.
    setenv("DPUKV_CUDA_DRIVER", cuda_test::library().c_str(), 1);
    socket_ = "/tmp/dpukv-gpu-agent-" + std::to_string(getpid()) + ".sock";
  }
  void TearDown() override { stop_agent(); }

  // fault: DPUKV_CUDA_DOUBLE_FAULT for the agent (read at its cuInit).
  void start_agent(const std::string& fault = "", std::vector<std::string> extra = {},
                   const std::string& driver = cuda_test::library()) {
    const std::string bin = agent_bin();
    std::vector<std::string> args = {bin, "--log-level", "error", "agent",
                                     // Ends with this test even if it dies before
                                     // TearDown (a ctest timeout, a closed pipe).
                                     "--parent-pid", std::to_string(getpid()), "--socket", socket_,
                                     "--memory-bytes", "64M", "--max-chunk-size", "1M",
                                     "--metrics-port", "0", "--cuda-driver", driver};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<std::string> env;
    if (!fault.empty()) env.push_back("DPUKV_CUDA_DOUBLE_FAULT=" + fault);
    agent_ = cuda_test::spawn_with_env(bin, args, env, nullptr);
    ASSERT_GT(agent_, 0) << "cannot start " << bin;
    client_ = connect();
    ASSERT_NE(client_, nullptr) << "agent did not come up";
  }
  void stop_agent() {
    if (agent_ <= 0) return;
    signal_child(agent_, SIGTERM);
    int status = 0;
    reap_child(agent_, &status);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "agent did not stop cleanly";
    agent_ = -1;
  }
  std::unique_ptr<Client> connect() {
    ClientOptions o;
    o.socket_path = socket_;
    o.connect_timeout_ms = 20000;
    o.reconnect_interval_ms = 0;
    std::unique_ptr<Client> c;
    return Client::connect(o, &c).ok() ? std::move(c) : nullptr;
  }
  std::string stat(const char* name) {
    std::string j;
    EXPECT_TRUE(client_->stats_json(&j).ok());
    const std::string k = std::string("\"") + name + "\":";
    const size_t p = j.find(k);
    if (p == std::string::npos) return "";
    const size_t e = j.find_first_of(",}", p + k.size());
    return j.substr(p + k.size(), e - p - k.size());
  }
  Status one(bool store, const Staging& s, const ChunkKey& k, uint64_t off, uint64_t len) {
    Status st;
    Status r = store ? client_->store(s, &k, &off, &len, 1, &st)
                     : client_->retrieve(s, &k, &off, &len, 1, &st);
    (void)r;
    return st;
  }
  std::string socket_;
  pid_t agent_ = -1;
  std::unique_ptr<Client> client_;
};

TEST_F(GpuAgentTest, GpuAndHostStagingMoveTheSameBytesAtOddOffsetsAndSizes) {
  start_agent();
  ASSERT_TRUE(client_->agent_gpu()) << stat("gpu_path");
  constexpr size_t kBytes = 8 << 20;
  DeviceMemory dev(kBytes);
  GpuStaging g;
  std::string why;
  // The export names a range inside the allocation, not its start.
  ASSERT_TRUE(client_->export_gpu(dev.ptr() + 4096, kBytes - 4096, 0, &g, &why).ok()) << why;
  Staging host;
  ASSERT_TRUE(client_->alloc_staging(4 << 20, &host).ok());
  const std::vector<std::pair<uint64_t, uint64_t>> cases = {
      {0, 1}, {1, 4095}, {3, 65537}, {12345, 1 << 20}, {(4 << 20) + 7, 333333}, {8192, 300000}};
  uint64_t i = 0;
  for (const auto& [off, len] : cases) {
    SCOPED_TRACE("offset " + std::to_string(off) + " length " + std::to_string(len));
    const std::vector<uint8_t> b = pattern(len, static_cast<uint32_t>(++i));
    // GPU -> cache -> GPU, at another offset.
    dev.write(4096 + off, b);
    ASSERT_EQ(one(true, g.staging(), key(i), off, len), Code::kSuccess);
    const uint64_t back = (6 << 20) + (off % 8 == 0 ? 0 : 3);
    ASSERT_EQ(one(false, g.staging(), key(i), back, len), Code::kSuccess);
    EXPECT_EQ(dev.read(4096 + back, len), b);
    // GPU-stored -> host staging, and host-stored -> GPU.
    ASSERT_EQ(one(false, host, key(i), 5, len), Code::kSuccess);
    EXPECT_EQ(std::vector<uint8_t>(host.data + 5, host.data + 5 + len), b);
    const std::vector<uint8_t> h = pattern(len, static_cast<uint32_t>(100 + i));
    std::memcpy(host.data + 11, h.data(), len);
    ASSERT_EQ(one(true, host, key(1000 + i), 11, len), Code::kSuccess);
    ASSERT_EQ(one(false, g.staging(), key(1000 + i), back, len), Code::kSuccess);
    EXPECT_EQ(dev.read(4096 + back, len), h);
  }
  // A room smaller than the chunk, a range past the export, a miss.
  EXPECT_EQ(one(false, g.staging(), key(4), 0, 100), Code::kTooBig);
  EXPECT_EQ(one(true, g.staging(), key(77), kBytes - 4096 - 10, 11), Code::kInvalidValue);
  EXPECT_EQ(one(false, g.staging(), key(999999), 0, 4096), Code::kNotFound);
  EXPECT_EQ(stat("gpu_on"), "1");
  // Per case: the GPU store, and the two retrieves into GPU memory.
  EXPECT_EQ(stat("gpu_copies"), std::to_string(3 * cases.size()));
  EXPECT_EQ(stat("checksum_failures"), "0");
  // The agent's kernel passed its check at start (on a GPU too: gpu_check.sh) and
  // verified the aligned copies; odd addresses and short chunks went to host threads.
  EXPECT_NE(stat("gpu_path").find("checksums on the GPU"), std::string::npos) << stat("gpu_path");
  EXPECT_NE(stat("gpu_checksums_gpu"), "0");
  EXPECT_NE(stat("gpu_checksums_host"), "0");
  EXPECT_EQ(stat("landed_mismatches"), "0");
  ASSERT_TRUE(client_->release_gpu(g).ok());
  EXPECT_EQ(stat("gpu_regions"), "0");
  // A released export is no longer this client's memory.
  EXPECT_EQ(one(true, g.staging(), key(78), 0, 10), Code::kNotPermitted);
}

// Exports are checked as memfd exports are, and a refused one leaves the session
// serving.
// Issue 34.8: a GPU export then a host export each passed the per-client cap (the
// agent counted only host memory for the second); now host and GPU staging count
// together in either order, and over all clients (max_staging_total).
TEST_F(GpuAgentTest, HostAndGpuStagingCountTogetherInEitherOrder) {
  start_agent("", {"--max-staging-size", "64M", "--max-staging-total", "96M"});
  ASSERT_TRUE(client_->agent_gpu()) << stat("gpu_path");
  DeviceMemory dev(64 << 20);
  GpuStaging g;
  std::string why;
  ASSERT_TRUE(client_->export_gpu(dev.ptr(), 64 << 20, 0, &g, &why).ok()) << why;
  Staging s;
  EXPECT_EQ(client_->alloc_staging(64 << 20, &s), Code::kTooBig);  // GPU first, then host
  ASSERT_TRUE(client_->release_gpu(g).ok());

  auto second = connect();
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(second->alloc_staging(64 << 20, &s).ok());
  const ChunkKey k = key(1);
  const uint64_t off = 0, len = 4096;
  ASSERT_TRUE(second->store(s, &k, &off, &len, 1, nullptr).ok());
  EXPECT_EQ(second->export_gpu(dev.ptr(), 64 << 20, 0, &g, &why), Code::kTooBig);  // host first
  EXPECT_NE(why.find("per-client"), std::string::npos) << why;

  // All clients together: 64 of host staging above, 64 of GPU staging here pass 96.
  EXPECT_EQ(client_->export_gpu(dev.ptr(), 64 << 20, 0, &g, &why), Code::kTooBig);
  EXPECT_NE(why.find("all clients"), std::string::npos) << why;
  ASSERT_TRUE(client_->export_gpu(dev.ptr(), 16 << 20, 0, &g, &why).ok()) << why;
  // And a host export past it closes that client: its next call fails.
  auto third = connect();
  ASSERT_NE(third, nullptr);
  Staging s3;
  ASSERT_TRUE(third->alloc_staging(32 << 20, &s3).ok());  // 64 + 16 + 32 > 96
  EXPECT_FALSE(third->store(s3, &k, &off, &len, 1, nullptr).ok());
  const ChunkKey k2 = key(2);
  EXPECT_TRUE(second->store(s, &k2, &off, &len, 1, nullptr).ok());  // the others go on
}

TEST_F(GpuAgentTest, BadExportsAreRefusedAndTheSessionGoesOn) {
  start_agent();
  DeviceMemory dev(1 << 20);
  GpuStaging g;
  std::string why;
  ASSERT_TRUE(client_->export_gpu(dev.ptr(), 1 << 20, 0, &g, &why).ok()) << why;
  // Through the client's own checks: past the allocation, not device memory.
  EXPECT_EQ(client_->export_gpu(dev.ptr() + 4096, 1 << 20, 0, &g, &why), Code::kInvalidValue);
  EXPECT_NE(why.find("allocation"), std::string::npos) << why;
  std::vector<uint8_t> not_device(4096);
  EXPECT_EQ(client_->export_gpu(reinterpret_cast<uint64_t>(not_device.data()), 4096, 0, &g, &why),
            Code::kInvalidValue);

  // What a client could send regardless: raw requests.
  DeviceMemory other(1 << 20);
  CUipcMemHandle h;
  ASSERT_EQ(other.driver().ipc_get_mem_handle(&h, other.ptr()), kCudaSuccess);
  CUuuid uuid;
  ASSERT_EQ(other.driver().device_get_uuid(&uuid, 0), kCudaSuccess);
  // As a client must: a proof first, written where the range starts (when that is
  // inside `other`), then the export.
  auto send = [&](agent::GpuExportEntry e, std::string* text) {
    const std::vector<uint8_t> proof = gpu_proof(client_.get());
    if (e.offset < (1 << 20) - proof.size()) other.write(e.offset, proof);
    return gpu_export_raw(client_.get(), e, text);
  };
  auto good = [&] {
    agent::GpuExportEntry e{};
    e.map_id = agent::kGpuMapBit | 500;
    e.bytes = 1 << 20;
    std::memcpy(e.device_uuid, uuid.bytes, 16);
    std::memcpy(e.handle, h.reserved, 64);
    return e;
  };
  std::string text;
  agent::GpuExportEntry e = good();
  e.device_uuid[0] ^= 0xff;
  EXPECT_EQ(send(e, &text), Code::kNotPermitted);
  EXPECT_NE(text.find("device UUID"), std::string::npos) << text;
  int refused = 1;
  if (double_driver()) {
    // Handles that name nothing. NVIDIA's handle is opaque (which bytes matter is
    // the driver's), so only the double's layout says what a flipped byte breaks.
    e = good();
    e.handle[20] ^= 0x5a;  // (here: another size)
    EXPECT_EQ(send(e, &text), Code::kInvalidValue);
    e = good();
    e.handle[27] ^= 0x5a;  // (here: another allocation)
    EXPECT_EQ(send(e, &text), Code::kInvalidValue);
    refused += 2;
  } else {
    // Any driver: the handle of an allocation freed since.
    CUipcMemHandle dead;
    {
      DeviceMemory gone(1 << 20);
      ASSERT_EQ(gone.driver().ipc_get_mem_handle(&dead, gone.ptr()), kCudaSuccess);
    }
    e = good();
    std::memcpy(e.handle, dead.reserved, 64);
    EXPECT_EQ(send(e, &text), Code::kInvalidValue);
    EXPECT_NE(text.find("does not open"), std::string::npos) << text;
    refused += 1;
  }
  // A range past the allocation as the driver sizes it: NVIDIA's rounds an
  // allocation up (2 MiB here), the double's does not.
  CUdeviceptr alloc_base = 0;
  size_t alloc_bytes = 0;
  ASSERT_EQ(other.driver().mem_get_address_range(&alloc_base, &alloc_bytes, other.ptr()),
            kCudaSuccess);
  ASSERT_GE(alloc_bytes, size_t{1} << 20);
  e = good();
  e.offset = alloc_bytes - e.bytes + 4096;
  EXPECT_EQ(send(e, &text), Code::kInvalidValue);
  EXPECT_NE(text.find("outside its allocation"), std::string::npos) << text;
  refused += 1;
  e = good();
  e.map_id = 500;  // not a GPU map id
  EXPECT_EQ(send(e, &text), Code::kInvalidValue);
  e = good();
  e.map_id = g.id;  // already exported
  EXPECT_EQ(send(e, &text), Code::kInvalidValue);
  refused += 2;
  EXPECT_EQ(stat("gpu_exports_refused"), std::to_string(refused));
  // Issue 34.12: a second release of an export is the caller's mistake, said as such
  // (it was NOT_FOUND, which the Python bindings read as "no agent").
  GpuStaging twice;
  ASSERT_TRUE(client_->export_gpu(other.ptr(), 1 << 20, 0, &twice, &why).ok()) << why;
  EXPECT_TRUE(client_->release_gpu(twice).ok());
  EXPECT_EQ(client_->release_gpu(twice), Code::kInvalidValue);

  // Another client cannot name this client's GPU memory.
  auto other_client = connect();
  ASSERT_NE(other_client, nullptr);
  const ChunkKey k = key(1);
  const uint64_t off = 0, len = 100;
  Status st;
  (void)other_client->store(g.staging(), &k, &off, &len, 1, &st);
  EXPECT_EQ(st, Code::kNotPermitted);
  // And the session that sent all that still serves.
  dev.write(0, pattern(100, 9));
  EXPECT_EQ(one(true, g.staging(), k, 0, 100), Code::kSuccess);
  EXPECT_EQ(one(false, g.staging(), k, 4096, 100), Code::kSuccess);
  EXPECT_EQ(dev.read(4096, 100), pattern(100, 9));
}

// A copy the GPU fails fails its request; the chunk (on retrieve) stays valid and
// the agent goes on.
TEST_F(GpuAgentTest, AFailedCopyFailsItsRequestOnly) {
  if (!double_driver()) GTEST_SKIP() << "needs the test double's fault injection";
  // The agent's first copies are its start-up check's (one a stream, 4), then the
  // export's proof read; the sixth fails.
  start_agent("copy_nth=6");
  DeviceMemory dev(1 << 20);
  GpuStaging g;
  std::string why;
  ASSERT_TRUE(client_->export_gpu(dev.ptr(), 1 << 20, 0, &g, &why).ok()) << why;
  dev.write(0, pattern(5000, 1));
  EXPECT_EQ(one(true, g.staging(), key(1), 0, 5000), Code::kIoFailed);  // the failed copy
  EXPECT_EQ(stat("chunks"), "0");                                       // nothing half-stored
  EXPECT_EQ(one(true, g.staging(), key(1), 0, 5000), Code::kSuccess);
  EXPECT_EQ(one(false, g.staging(), key(1), 8192, 5000), Code::kSuccess);
  EXPECT_EQ(dev.read(8192, 5000), pattern(5000, 1));
  EXPECT_EQ(stat("gpu_copy_failures"), "1");
  stop_agent();

  // On retrieve: the chunk was stored from host memory; the GPU copy out fails once.
  start_agent("copy_nth=6");
  Staging host;
  ASSERT_TRUE(client_->alloc_staging(1 << 20, &host).ok());
  const std::vector<uint8_t> b = pattern(7000, 2);
  std::memcpy(host.data, b.data(), b.size());
  ASSERT_EQ(one(true, host, key(2), 0, 7000), Code::kSuccess);
  ASSERT_TRUE(client_->export_gpu(dev.ptr(), 1 << 20, 0, &g, &why).ok()) << why;
  EXPECT_EQ(one(false, g.staging(), key(2), 0, 7000), Code::kIoFailed);
  EXPECT_EQ(one(false, g.staging(), key(2), 0, 7000), Code::kSuccess);
  EXPECT_EQ(dev.read(0, 7000), b);
  EXPECT_EQ(stat("checksum_failures"), "0");
}

// Where checksums run is the agent's choice at start: --gpu-checksum host keeps
// them on host threads; gpu refuses to start an agent whose driver cannot run the
// kernel (and says why), rather than verifying on the host unasked.
TEST_F(GpuAgentTest, TheChecksumDesignIsChosenAtStartAndSaid) {
  start_agent("", {"--gpu-checksum", "host"});
  DeviceMemory dev(1 << 20);
  GpuStaging g;
  std::string why;
  ASSERT_TRUE(client_->export_gpu(dev.ptr(), 1 << 20, 0, &g, &why).ok()) << why;
  dev.write(0, pattern(65536, 5));
  ASSERT_EQ(one(true, g.staging(), key(5), 0, 65536), Code::kSuccess);
  ASSERT_EQ(one(false, g.staging(), key(5), 65536, 65536), Code::kSuccess);
  EXPECT_EQ(dev.read(65536, 65536), pattern(65536, 5));
  EXPECT_NE(stat("gpu_path").find("checksums on host threads"), std::string::npos)
      << stat("gpu_path");
  EXPECT_EQ(stat("gpu_checksums_gpu"), "0");
  EXPECT_EQ(stat("gpu_checksums_host"), "2");
  stop_agent();
  if (!double_driver()) return;  // the rest needs the double's faults
  // A driver that does not load the kernel: auto verifies on host threads and says why.
  start_agent("module");
  EXPECT_NE(stat("gpu_path").find("CUDA_ERROR_INVALID_PTX"), std::string::npos) << stat("gpu_path");
  stop_agent();
  const std::string bin = agent_bin();
  const std::vector<std::string> args = {bin,
                                         "--log-level",
                                         "error",
                                         "agent",
                                         "--parent-pid",
                                         std::to_string(getpid()),
                                         "--socket",
                                         socket_,
                                         "--memory-bytes",
                                         "64M",
                                         "--metrics-port",
                                         "0",
                                         "--cuda-driver",
                                         cuda_test::library(),
                                         "--gpu-checksum",
                                         "gpu"};
  const pid_t p = cuda_test::spawn_with_env(bin, args, {"DPUKV_CUDA_DOUBLE_FAULT=module"}, nullptr);
  ASSERT_GT(p, 0);
  int status = 0;
  reap_child(p, &status);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << "started without its kernel";
}

// Issue 34.6: a CUDA IPC handle names an allocation, not who may use it, and the
// agent opened any handle a client sent: a forged one (here: the handle of another
// process's memory, as its pid, fd and id would be guessed) read and overwrote that
// process's memory. Now an export must prove the sender holds the memory.
TEST(GpuAgentChild, HoldsDeviceMemory) {
  if (std::getenv("DPUKV_GPU_VICTIM") == nullptr) GTEST_SKIP() << "run by AForgedHandle...";
  DeviceMemory mine(1 << 20);
  mine.write(0, pattern(1 << 20, 77));
  CUipcMemHandle h;
  ASSERT_EQ(mine.driver().ipc_get_mem_handle(&h, mine.ptr()), kCudaSuccess);
  for (char b : h.reserved) std::printf("%02x", static_cast<uint8_t>(b));
  std::printf("\n");
  std::fflush(stdout);
  char line[8];
  while (std::fgets(line, sizeof(line), stdin) != nullptr) {
  }
  // Stdin closed: the parent is done. Its bytes must be as they were.
  EXPECT_EQ(mine.read(0, 1 << 20), pattern(1 << 20, 77)) << "another process wrote here";
}

TEST_F(GpuAgentTest, AForgedHandleOfAnotherProcesssMemoryIsRefused) {
  start_agent();
  int out[2], in[2];
  ASSERT_EQ(pipe(out), 0);
  ASSERT_EQ(pipe(in), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  posix_spawn_file_actions_addclose(&fa, in[1]);
  const pid_t victim =
      cuda_test::spawn_test("GpuAgentChild.HoldsDeviceMemory", {"DPUKV_GPU_VICTIM=1"}, &fa);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  ::close(in[0]);
  ASSERT_GT(victim, 0);
  // The handle, as the attacker learned or guessed it.
  // Its handle is the line of 128 hex digits among gtest's.
  std::string hex, line;
  char c;
  while (hex.empty() && ::read(out[0], &c, 1) == 1) {
    if (c != '\n') {
      line += c;
      continue;
    }
    if (line.size() == 128 && line.find_first_not_of("0123456789abcdef") == std::string::npos)
      hex = line;
    line.clear();
  }
  ASSERT_EQ(hex.size(), 128u) << "the victim printed no handle";
  agent::GpuExportEntry e{};
  e.map_id = agent::kGpuMapBit | 900;
  e.bytes = 1 << 20;
  CUuuid uuid;
  DeviceMemory own(1 << 20);  // the attacker's driver, for its device's UUID
  ASSERT_EQ(own.driver().device_get_uuid(&uuid, 0), kCudaSuccess);
  std::memcpy(e.device_uuid, uuid.bytes, 16);
  for (size_t i = 0; i < 64; ++i)
    e.handle[i] = static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));

  std::string text;
  // Without a proof: refused before the handle is opened.
  EXPECT_EQ(gpu_export_raw(client_.get(), e, &text), Code::kNotPermitted);
  EXPECT_NE(text.find("no proof"), std::string::npos) << text;
  // With this session's proof, which the victim's memory does not hold (the
  // attacker can write it only into memory of its own).
  const std::vector<uint8_t> proof = gpu_proof(client_.get());
  own.write(0, proof);
  EXPECT_EQ(gpu_export_raw(client_.get(), e, &text), Code::kNotPermitted);
  EXPECT_NE(text.find("not the sender's memory"), std::string::npos) << text;
  // So the map id names nothing: no copy into or out of the victim's memory.
  const GpuStaging forged{0, 1 << 20, 0, e.map_id};
  EXPECT_EQ(one(true, forged.staging(), key(1), 0, 4096), Code::kNotPermitted);
  EXPECT_EQ(one(false, forged.staging(), key(1), 0, 4096), Code::kNotPermitted);
  EXPECT_EQ(stat("gpu_exports"), "0");
  // The session goes on, and its own memory, with its proof, is taken.
  GpuStaging g;
  std::string why;
  ASSERT_TRUE(client_->export_gpu(own.ptr(), 1 << 20, 0, &g, &why).ok()) << why;
  EXPECT_EQ(own.read(0, proof.size()), proof) << "the export did not put the range's bytes back";
  ::close(in[1]);                       // the victim checks its bytes and exits
  while (::read(out[0], &c, 1) == 1) {  // its report (a closed pipe would kill it first)
  }
  ::close(out[0]);
  int status = 0;
  reap_child(victim, &status);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the victim's bytes changed";
}

// The other side of KilledClientIsReleased: exports GPU memory, keeps retrieves in
// flight, and is killed by the parent.
TEST(GpuAgentChild, RetrievesUntilKilled) {
  const char* sock = std::getenv("DPUKV_GPU_CHILD_SOCKET");
  if (sock == nullptr) GTEST_SKIP() << "run by KilledClientIsReleased";
  ClientOptions o;
  o.socket_path = sock;
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::connect(o, &c).ok());
  DeviceMemory dev(16 << 20);
  GpuStaging g;
  ASSERT_TRUE(c->export_gpu(dev.ptr(), 16 << 20, 0, &g).ok());
  std::vector<ChunkKey> keys;
  std::vector<uint64_t> offs, lens;
  for (uint64_t i = 0; i < 16; ++i) {
    keys.push_back(key(i));
    offs.push_back(i << 20);
    lens.push_back(1 << 20);
  }
  std::vector<Status> st(16);
  ASSERT_TRUE(c->store(g.staging(), keys.data(), offs.data(), lens.data(), 16, st.data()).ok());
  std::printf("stored\n");
  std::fflush(stdout);
  for (;;) {
    Client::Ticket t;
    ASSERT_TRUE(
        c->submit_retrieve(g.staging(), keys.data(), offs.data(), lens.data(), 16, st.data(), &t)
            .ok());
    (void)c->wait(t);
  }
}

TEST_F(GpuAgentTest, KilledClientIsReleasedAndTheAgentKeepsServing) {
  start_agent();
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  const pid_t child = cuda_test::spawn_test("GpuAgentChild.RetrievesUntilKilled",
                                            {"DPUKV_GPU_CHILD_SOCKET=" + socket_}, &fa);
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  ASSERT_GT(child, 0);
  // Wait for its stores, then for its retrieves to be copying.
  std::string got;
  char buf[256];
  ssize_t n;
  while (got.find("stored") == std::string::npos && (n = read(out[0], buf, sizeof(buf))) > 0)
    got.append(buf, static_cast<size_t>(n));
  close(out[0]);
  ASSERT_NE(got.find("stored"), std::string::npos) << "the child failed: " << got;
  const uint64_t copies = std::stoull(stat("gpu_copies"));
  while (std::stoull(stat("gpu_copies")) < copies + 8) std::this_thread::yield();
  ASSERT_TRUE(signal_child(child, SIGKILL));
  reap_child(child, nullptr);
  // The agent closes the dead client's GPU memory (after the copies in flight).
  while (stat("gpu_regions") != "0" || stat("clients") != "0")
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // And serves this client, its chunks intact.
  DeviceMemory dev(1 << 20);
  GpuStaging g;
  ASSERT_TRUE(client_->export_gpu(dev.ptr(), 1 << 20, 0, &g).ok());
  EXPECT_EQ(one(false, g.staging(), key(3), 0, 1 << 20), Code::kSuccess);
  EXPECT_EQ(stat("checksum_failures"), "0");
}

// Without a driver the agent serves host memory, says why, and refuses GPU exports.
TEST_F(GpuAgentTest, WithoutADriverTheAgentServesHostMemoryAndSaysWhy) {
  start_agent("", {}, "/nonexistent/libcuda.so.1");
  EXPECT_FALSE(client_->agent_gpu());
  EXPECT_EQ(stat("gpu_on"), "0");
  EXPECT_NE(stat("gpu_path").find("off: "), std::string::npos) << stat("gpu_path");
  EXPECT_NE(stat("gpu_path").find("/nonexistent/libcuda.so.1"), std::string::npos);
  DeviceMemory dev(1 << 20);
  GpuStaging g;
  std::string why;
  EXPECT_EQ(client_->export_gpu(dev.ptr(), 1 << 20, 0, &g, &why), Code::kNotSupported);
  EXPECT_NE(why.find("no GPU path"), std::string::npos) << why;
  Staging host;
  ASSERT_TRUE(client_->alloc_staging(1 << 20, &host).ok());
  std::memset(host.data, 7, 100);
  EXPECT_EQ(one(true, host, key(1), 0, 100), Code::kSuccess);
  EXPECT_EQ(one(false, host, key(1), 200, 100), Code::kSuccess);
  EXPECT_EQ(host.data[250], 7);
}

// With --compress, GPU stores go in unencoded; an encoded chunk (stored from host
// memory) is NOT_SUPPORTED into GPU memory, and the caller uses host staging.
TEST_F(GpuAgentTest, CompressedChunksAreNotSupportedIntoGpuMemory) {
  start_agent("", {"--compress"});
  DeviceMemory dev(1 << 20);
  GpuStaging g;
  ASSERT_TRUE(client_->export_gpu(dev.ptr(), 1 << 20, 0, &g).ok());
  dev.write(0, pattern(65536, 3));
  EXPECT_EQ(one(true, g.staging(), key(1), 0, 65536), Code::kSuccess);
  EXPECT_EQ(one(false, g.staging(), key(1), 65536, 65536), Code::kSuccess);
  EXPECT_EQ(dev.read(65536, 65536), pattern(65536, 3));
  Staging host;
  ASSERT_TRUE(client_->alloc_staging(1 << 20, &host).ok());
  std::memset(host.data, 0, 65536);  // zeros encode well
  ASSERT_EQ(one(true, host, key(2), 0, 65536), Code::kSuccess);
  EXPECT_EQ(one(false, g.staging(), key(2), 0, 65536), Code::kNotSupported);
  EXPECT_EQ(one(false, host, key(2), 0, 65536), Code::kSuccess);
}

// An agent restarted under a live client: the client exports its GPU memory again.
TEST_F(GpuAgentTest, ARestartedAgentGetsTheGpuExportAgain) {
  start_agent();
  DeviceMemory dev(1 << 20);
  GpuStaging g;
  ASSERT_TRUE(client_->export_gpu(dev.ptr(), 1 << 20, 0, &g).ok());
  auto live = connect();  // the client that lives through the restart
  ASSERT_NE(live, nullptr);
  GpuStaging lg;
  ASSERT_TRUE(live->export_gpu(dev.ptr(), 1 << 20, 0, &lg).ok());
  client_.reset();
  stop_agent();
  start_agent();
  dev.write(0, pattern(3000, 4));
  const ChunkKey k = key(1);
  const uint64_t off = 0, back = 4096, len = 3000;
  Status st = Code::kConnectionReset;
  // The first call after the restart may find the old connection closed; the
  // next one reconnects (and re-exports) at once (reconnect_interval_ms 0).
  for (int i = 0; i < 3 && st != Code::kSuccess; ++i)
    (void)live->store(lg.staging(), &k, &off, &len, 1, &st);
  ASSERT_EQ(st, Code::kSuccess);
  ASSERT_TRUE(live->retrieve(lg.staging(), &k, &back, &len, 1, &st).ok());
  EXPECT_EQ(dev.read(4096, 3000), pattern(3000, 4));
}

}  // namespace
}  // namespace dpukv
