// The fixture of the vfio-user controller tests: the emulated NVMe controller as
// a real process (`dpukv nvme target`), this test process its vfio-user client
// through the user-space driver.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "nvme/vfio_user_driver.h"
#include "nvmf/vfio_user/emulation_manager.h"
#include "nvmf/vfio_user/nvme_pci_function.h"
#include "runtime/child_process.h"
#include "runtime/log.h"

extern char** environ;

namespace dpukv::nvme::vfio_user_test {
namespace vu = vfio_user;

// The target as a child that dies with this test process (a test that crashes
// leaves no target behind holding ctest's output pipe open).
inline pid_t spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  std::string bin = DPUKV_BIN;
  argv.push_back(bin.data());
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(127);
    execve(bin.c_str(), argv.data(), environ);
    _exit(127);
  }
  EXPECT_GT(pid, 0) << "fork: " << std::strerror(errno);
  return pid;
}

inline uint16_t sc(const Cqe& e) {
  return status_of_cqe(e.status);
}

class NvmeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log_set_level(LogSource::kLib, LogLevel::kError);
    socket_ = "/tmp/dpukv-nvme-test-" + std::to_string(getpid()) + ".sock";
  }
  void TearDown() override {
    drv_.reset();
    stop_target();
    std::filesystem::remove(file_);
  }
  void start_target(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--lib-log-level", "critical", "nvme",   "target",
                                     "--socket",        socket_,    "--size", "64M"};
    args.insert(args.end(), extra.begin(), extra.end());
    target_ = spawn(args);
  }
  void stop_target() {
    if (target_ > 0) {
      signal_child(target_, SIGTERM);
      int status = 0;
      waitpid(target_, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "target did not exit cleanly: " << status;
      target_ = -1;
    }
  }
  // Call as ASSERT_NO_FATAL_FAILURE(attach()): a test must not go on without a
  // driver. The target may take long to listen on a busy machine.
  void attach(DriverOptions o = {}) {
    o.memory_bytes = 16u << 20;
    o.connect_timeout_ms = std::max(o.connect_timeout_ms, 60000);
    ASSERT_TRUE(VfioUserDriver::attach(socket_, o, &drv_).ok());
  }
  // One I/O command on queue 0, waited for.
  Cqe io(uint8_t opc, uint64_t lba, uint32_t nlb, const DmaBuffer* buf, uint32_t nsid = 1,
         uint32_t cdw12_extra = 0) {
    Sqe c{};
    c.opc = opc;
    c.cid = 7;
    c.nsid = nsid;
    c.cdw10 = static_cast<uint32_t>(lba);
    c.cdw11 = static_cast<uint32_t>(lba >> 32);
    c.cdw12 = (nlb - 1) | cdw12_extra;
    uint32_t bs = drv_->block_size(1);
    EXPECT_TRUE(drv_->submit(0, c, buf, uint64_t{nlb} * bs, nullptr).ok());
    Cqe e{};
    EXPECT_TRUE(drv_->wait_one(0, &e, 5000).ok());
    return e;
  }
  Cqe raw_io(const Sqe& c) {
    EXPECT_TRUE(drv_->submit_raw(1, c).ok());
    Cqe e{};
    EXPECT_TRUE(drv_->wait_one(0, &e, 5000).ok());
    return e;
  }
  Cqe admin(Sqe c, const DmaBuffer* data = nullptr) {
    Cqe e{};
    EXPECT_TRUE(drv_->admin(c, &e, data).ok());
    return e;
  }
  DmaBuffer buf(size_t n) {
    DmaBuffer b;
    EXPECT_TRUE(drv_->alloc(n, &b).ok());
    return b;
  }
  void fill(DmaBuffer& b, uint32_t seed) {
    std::mt19937 rng(seed);
    for (size_t i = 0; i < b.len; i += 4) {
      uint32_t v = rng();
      std::memcpy(b.host + i, &v, 4);
    }
  }

  std::string socket_;
  std::string file_ = "/tmp/dpukv-nvme-test-file-" + std::to_string(getpid());
  pid_t target_ = -1;
  std::unique_ptr<VfioUserDriver> drv_;
};

}  // namespace dpukv::nvme::vfio_user_test
