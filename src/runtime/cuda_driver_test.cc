// The CUDA driver boundary against the driver test double (tests/cuda_double/, a
// libcuda.so.1 of the same subset; DPUKV_CUDA_DRIVER names another, e.g. NVIDIA's
// on a GPU machine, where scripts/gpu_check.sh runs this same test): loading and
// its failures, device and context, asynchronous copies at odd offsets and sizes
// finished through events, GPU memory opened from another process through an IPC
// handle, and each injected fault as the value the caller sees.
#include "runtime/cuda_driver.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_double/cuda_test_support.h"
#include "runtime/child_process.h"

namespace dpukv::cuda {
namespace {

using cuda_test::inject;
using cuda_test::library;

std::string hex(const void* p, size_t n) {
  std::string s;
  char b[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof(b), "%02x", static_cast<const uint8_t*>(p)[i]);
    s += b;
  }
  return s;
}

void unhex(const std::string& s, void* p) {
  for (size_t i = 0; i + 1 < s.size(); i += 2)
    static_cast<uint8_t*>(p)[i / 2] = static_cast<uint8_t>(std::stoi(s.substr(i, 2), nullptr, 16));
}

class CudaDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    ASSERT_TRUE(Driver::open_library(library(), &d_, &why).ok()) << why;
    ASSERT_EQ(d_->device_get(&dev_, 0), kCudaSuccess);
    ASSERT_EQ(d_->primary_ctx_retain(&ctx_, dev_), kCudaSuccess);
    ASSERT_EQ(d_->ctx_set_current(ctx_), kCudaSuccess);
    ASSERT_EQ(d_->stream_create(&stream_, kStreamNonBlocking), kCudaSuccess);
    ASSERT_EQ(d_->event_create(&event_, kEventDisableTiming), kCudaSuccess);
  }
  void TearDown() override {
    if (!d_) return;
    inject("none");
    (void)d_->event_destroy(event_);
    (void)d_->stream_destroy(stream_);
    (void)d_->primary_ctx_release(dev_);
  }
  // Records the event after what is queued and polls it as the agent's progress
  // engine does (no blocking call), for at most a minute.
  CUresult finish() {
    if (CUresult r = d_->event_record(event_, stream_); r != kCudaSuccess) return r;
    const auto end = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    CUresult r;
    while ((r = d_->event_query(event_)) == kCudaErrorNotReady &&
           std::chrono::steady_clock::now() < end)
      std::this_thread::yield();
    return r;
  }
  // A child process of this test running one of the CudaDriverChild tests with env.
  int child(const char* test, std::vector<std::string> env) {
    const pid_t pid = cuda_test::spawn_test(test, std::move(env), nullptr);
    int status = 0;
    if (pid < 0 || !reap_child(pid, &status)) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  std::unique_ptr<Driver> d_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUstream stream_ = nullptr;
  CUevent event_ = nullptr;
};

TEST(CudaDriver, AMissingDriverIsNotSupportedAndSaysWhy) {
  std::unique_ptr<Driver> d;
  std::string why;
  EXPECT_EQ(Driver::open_library("/nonexistent/libcuda.so.1", &d, &why), Code::kNotSupported);
  EXPECT_EQ(d, nullptr);
  EXPECT_NE(why.find("/nonexistent/libcuda.so.1"), std::string::npos) << why;
  EXPECT_NE(why.find("DPUKV_CUDA_DRIVER"), std::string::npos) << why;
  // A library that is not a CUDA driver: a missing symbol is named.
  EXPECT_EQ(Driver::open_library("libc.so.6", &d, &why), Code::kNotSupported);
  EXPECT_NE(why.find("has no cu"), std::string::npos) << why;
}

TEST_F(CudaDriverTest, CopiesAtOddOffsetsAndSizesFinishThroughEvents) {
  CUuuid uuid;
  ASSERT_EQ(d_->device_get_uuid(&uuid, dev_), kCudaSuccess);
  CUdeviceptr dev = 0;
  const size_t size = (1 << 20) + 4099;
  ASSERT_EQ(d_->mem_alloc(&dev, size), kCudaSuccess);
  CUdeviceptr base = 0;
  size_t range = 0;
  ASSERT_EQ(d_->mem_get_address_range(&base, &range, dev + 12345), kCudaSuccess);
  EXPECT_EQ(base, dev);
  EXPECT_EQ(range, size);
  std::vector<uint8_t> src(size), dst(size, 0);
  for (size_t i = 0; i < size; ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  ASSERT_EQ(d_->mem_host_register(src.data(), size, kMemHostRegisterPortable), kCudaSuccess);
  for (size_t off : {size_t{0}, size_t{1}, size_t{4095}, size_t{777777}}) {
    const size_t n = size - off - (off % 3);
    ASSERT_EQ(d_->memcpy_htod_async(dev + off, src.data() + off, n, stream_), kCudaSuccess);
    ASSERT_EQ(d_->memcpy_dtoh_async(dst.data() + off, dev + off, n, stream_), kCudaSuccess);
    ASSERT_EQ(finish(), kCudaSuccess);
    ASSERT_EQ(std::memcmp(dst.data() + off, src.data() + off, n), 0) << "offset " << off;
  }
  // Outside the allocation: refused at once, nothing queued.
  EXPECT_EQ(d_->memcpy_htod_async(dev + size - 10, src.data(), 11, stream_),
            kCudaErrorInvalidValue);
  EXPECT_EQ(Driver::to_status(kCudaErrorInvalidValue), Code::kInvalidValue);
  EXPECT_EQ(d_->mem_host_register(src.data() + 4096, 4096, 0),
            kCudaErrorHostMemoryAlreadyRegistered);
  EXPECT_EQ(d_->mem_host_unregister(src.data()), kCudaSuccess);
  EXPECT_EQ(d_->mem_host_unregister(src.data()), kCudaErrorHostMemoryNotRegistered);
  EXPECT_EQ(d_->mem_free(dev), kCudaSuccess);
  EXPECT_EQ(d_->error_name(kCudaErrorIllegalAddress), "CUDA_ERROR_ILLEGAL_ADDRESS");
}

TEST_F(CudaDriverTest, InjectedFaultsAreTheCallersValues) {
  if (!inject("none")) GTEST_SKIP() << "not the test double: faults cannot be injected";
  CUdeviceptr dev = 0;
  ASSERT_EQ(d_->mem_alloc(&dev, 1 << 16), kCudaSuccess);
  std::vector<uint8_t> host(1 << 16, 0x5a);
  ASSERT_TRUE(inject("register"));
  EXPECT_EQ(d_->mem_host_register(host.data(), host.size(), 0), kCudaErrorOutOfMemory);
  ASSERT_TRUE(inject("none,copy_once"));
  // A copy that fails when it runs: its event says so (and the stream stays failed,
  // as a context does after an illegal address).
  ASSERT_EQ(d_->memcpy_htod_async(dev, host.data(), host.size(), stream_), kCudaSuccess);
  const CUresult r = finish();
  EXPECT_EQ(r, kCudaErrorIllegalAddress);
  EXPECT_EQ(Driver::to_status(r), Code::kIoFailed);
  EXPECT_EQ(d_->memcpy_htod_async(dev, host.data(), 16, stream_), kCudaErrorIllegalAddress);
  EXPECT_EQ(d_->mem_free(dev), kCudaSuccess);
}

TEST(CudaDriver, AFailedInitIsNotSupportedAndSaysWhy) {
  if (!inject("init")) GTEST_SKIP() << "not the test double";
  std::unique_ptr<Driver> d;
  std::string why;
  EXPECT_EQ(Driver::open_library(library(), &d, &why), Code::kNotSupported);
  EXPECT_NE(why.find("CUDA_ERROR_NO_DEVICE"), std::string::npos) << why;
  EXPECT_TRUE(inject("none"));
}

// GPU memory of this process, opened by another one through its IPC handle (the
// agent importing a client's staging): written there, read here. A handle of a
// process that is gone, or of another device, is refused.
TEST_F(CudaDriverTest, AnotherProcessOpensTheMemoryThroughItsIpcHandle) {
  if (!inject("none")) GTEST_SKIP() << "needs the double's child processes";
  CUdeviceptr dev = 0;
  const size_t size = 3 << 20;
  ASSERT_EQ(d_->mem_alloc(&dev, size), kCudaSuccess);
  CUipcMemHandle h;
  ASSERT_EQ(d_->ipc_get_mem_handle(&h, dev), kCudaSuccess);
  CUdeviceptr same = 0;
  EXPECT_EQ(d_->ipc_open_mem_handle(&same, h, kIpcMemLazyEnablePeerAccess),
            kCudaErrorInvalidContext);  // not in the process that made it
  ASSERT_EQ(child("CudaDriverChild.WritesThroughAHandle", {"DPUKV_HANDLE=" + hex(&h, sizeof(h))}),
            0);
  std::vector<uint8_t> back(size);
  ASSERT_EQ(d_->memcpy_dtoh_async(back.data(), dev, size, stream_), kCudaSuccess);
  ASSERT_EQ(finish(), kCudaSuccess);
  for (size_t i = 0; i < size; i += 4093) ASSERT_EQ(back[i], static_cast<uint8_t>(i * 7 + 1)) << i;
  // Another device (the child's double has another UUID): refused.
  EXPECT_EQ(child("CudaDriverChild.WritesThroughAHandle",
                  {"DPUKV_HANDLE=" + hex(&h, sizeof(h)), "DPUKV_EXPECT=101",
                   "DPUKV_CUDA_DOUBLE_FAULT=uuid=00112233445566778899aabbccddeeff"}),
            0);
  // A handle whose process is gone: the child made it and exited.
  std::string path = ::testing::TempDir() + "dpukv-cuda-handle-" + std::to_string(getpid());
  ASSERT_EQ(child("CudaDriverChild.MakesAHandleAndExits", {"DPUKV_HANDLE_FILE=" + path}), 0);
  FILE* f = std::fopen(path.c_str(), "r");
  ASSERT_NE(f, nullptr);
  char text[256] = {};
  ASSERT_NE(std::fgets(text, sizeof(text), f), nullptr);
  std::fclose(f);
  std::remove(path.c_str());
  CUipcMemHandle dead;
  unhex(std::string(text, 128), &dead);
  CUdeviceptr p = 0;
  EXPECT_EQ(d_->ipc_open_mem_handle(&p, dead, kIpcMemLazyEnablePeerAccess),
            kCudaErrorInvalidHandle);
  EXPECT_EQ(d_->mem_free(dev), kCudaSuccess);
}

// Run only as children of the test above (they read what it passes).
TEST(CudaDriverChild, WritesThroughAHandle) {
  const char* hx = std::getenv("DPUKV_HANDLE");
  if (hx == nullptr) GTEST_SKIP() << "a child of AnotherProcessOpensTheMemoryThroughItsIpcHandle";
  const char* expect = std::getenv("DPUKV_EXPECT");
  std::unique_ptr<Driver> d;
  std::string why;
  ASSERT_TRUE(Driver::open_library(library(), &d, &why).ok()) << why;
  CUipcMemHandle h;
  unhex(hx, &h);
  CUdeviceptr dev = 0;
  const CUresult r = d->ipc_open_mem_handle(&dev, h, kIpcMemLazyEnablePeerAccess);
  if (expect != nullptr) {
    ASSERT_EQ(r, std::atoi(expect));
    return;
  }
  ASSERT_EQ(r, kCudaSuccess);
  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_EQ(d->mem_get_address_range(&base, &size, dev), kCudaSuccess);
  std::vector<uint8_t> src(size);
  for (size_t i = 0; i < size; ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  CUstream s;
  ASSERT_EQ(d->stream_create(&s, kStreamNonBlocking), kCudaSuccess);
  ASSERT_EQ(d->memcpy_htod_async(dev, src.data(), size, s), kCudaSuccess);
  ASSERT_EQ(d->stream_synchronize(s), kCudaSuccess);
  ASSERT_EQ(d->stream_destroy(s), kCudaSuccess);
  ASSERT_EQ(d->ipc_close_mem_handle(dev), kCudaSuccess);
}

TEST(CudaDriverChild, MakesAHandleAndExits) {
  const char* path = std::getenv("DPUKV_HANDLE_FILE");
  if (path == nullptr) GTEST_SKIP() << "a child of AnotherProcessOpensTheMemoryThroughItsIpcHandle";
  std::unique_ptr<Driver> d;
  std::string why;
  ASSERT_TRUE(Driver::open_library(library(), &d, &why).ok()) << why;
  CUdeviceptr dev = 0;
  ASSERT_EQ(d->mem_alloc(&dev, 4096), kCudaSuccess);
  CUipcMemHandle h;
  ASSERT_EQ(d->ipc_get_mem_handle(&h, dev), kCudaSuccess);
  FILE* f = std::fopen(path, "w");
  ASSERT_NE(f, nullptr);
  std::fprintf(f, "%s\n", hex(&h, sizeof(h)).c_str());
  std::fclose(f);
}

}  // namespace
}  // namespace dpukv::cuda
