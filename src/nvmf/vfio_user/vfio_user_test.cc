// The emulated NVMe controller as a real process (`dpukv nvme target`) with this
// test process as its vfio-user client, driving it through the user-space driver:
// register flows, every admin and NVM command, the right status for bad input,
// interrupts, malformed protocol messages, dead clients, resets.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

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

namespace dpukv::nvme {
namespace {
namespace vu = vfio_user;

pid_t spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  std::string bin = DPUKV_BIN;
  argv.push_back(bin.data());
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, bin.c_str(), nullptr, nullptr, argv.data(), environ), 0);
  return pid;
}

uint16_t sc(const Cqe& e) {
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
  void attach(DriverOptions o = {}) {
    o.memory_bytes = 16u << 20;
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

TEST_F(NvmeTest, IdentifyDescribesControllerAndNamespace) {
  start_target({"--serial", "SN-TEST-42"});
  attach();
  uint8_t id[kIdentifySize];
  uint16_t st = 0;
  ASSERT_TRUE(drv_->identify(kCnsController, 0, id, &st).ok());
  EXPECT_EQ(st, kSuccess);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(id + 4), 10), "SN-TEST-42");
  EXPECT_EQ(id[512], 0x66);
  EXPECT_EQ(id[513], 0x44);
  uint32_t ver;
  std::memcpy(&ver, id + 80, 4);
  EXPECT_EQ(ver, 0x00010400u);
  EXPECT_EQ(drv_->namespaces(), std::vector<uint32_t>{1});
  EXPECT_EQ(drv_->block_size(1), 4096u);
  EXPECT_EQ(drv_->num_blocks(1), (64u << 20) / 4096);
  // Namespace id descriptors carry the NGUID that Identify Namespace reports.
  uint8_t ns[kIdentifySize], desc[kIdentifySize];
  ASSERT_TRUE(drv_->identify(kCnsNamespace, 1, ns, &st).ok());
  ASSERT_TRUE(drv_->identify(kCnsNsDescriptors, 1, desc, &st).ok());
  EXPECT_EQ(desc[0], 2);
  EXPECT_EQ(desc[1], 16);
  EXPECT_EQ(std::memcmp(desc + 4, ns + 104, 16), 0);
  // Inactive but valid nsid: zeroes; nsid 0: invalid namespace; unknown CNS: invalid field.
  ASSERT_TRUE(drv_->identify(kCnsNamespace, 5, ns, &st).ok());
  EXPECT_EQ(st, kSuccess);
  EXPECT_EQ(ns[0] | ns[1] | ns[2], 0);
  ASSERT_TRUE(drv_->identify(kCnsNamespace, 0, ns, &st).ok());
  EXPECT_EQ(st, kInvalidNamespace);
  ASSERT_TRUE(drv_->identify(0x55, 0, ns, &st).ok());
  EXPECT_EQ(st, kInvalidField);
}

TEST_F(NvmeTest, WritesAndReadsBackEveryPrpShape) {
  start_target();
  attach();
  // 4 KiB (PRP1), 8 KiB (PRP2 as data), 64 KiB and 1 MiB (PRP lists).
  uint64_t lba = 3;
  for (uint32_t blocks : {1u, 2u, 16u, 256u}) {
    DmaBuffer w = buf(blocks * 4096ull), r = buf(blocks * 4096ull);
    fill(w, blocks);
    EXPECT_EQ(sc(io(kNvmWrite, lba, blocks, &w)), kSuccess);
    EXPECT_EQ(sc(io(kNvmRead, lba, blocks, &r)), kSuccess);
    EXPECT_EQ(std::memcmp(w.host, r.host, w.len), 0) << blocks << " blocks";
    lba += blocks + 5;
  }
  // A buffer that starts mid-page (dword aligned): PRP1 with an offset.
  DmaBuffer w = buf(3 * 4096), r = buf(3 * 4096);
  fill(w, 99);
  DmaBuffer wo{w.host + 512, w.iova + 512, 8192}, ro{r.host + 1028, r.iova + 1028, 8192};
  EXPECT_EQ(sc(io(kNvmWrite, 1000, 2, &wo)), kSuccess);
  EXPECT_EQ(sc(io(kNvmRead, 1000, 2, &ro)), kSuccess);
  EXPECT_EQ(std::memcmp(wo.host, ro.host, 8192), 0);
  // The last block of the namespace is reachable; one past it is not.
  uint64_t last = drv_->num_blocks(1) - 1;
  DmaBuffer one = buf(4096);
  EXPECT_EQ(sc(io(kNvmRead, last, 1, &one)), kSuccess);
  EXPECT_EQ(sc(io(kNvmRead, last, 2, &r)), kLbaOutOfRange);
  EXPECT_EQ(sc(io(kNvmRead, ~uint64_t{0} - 1, 2, &r)), kLbaOutOfRange);  // no wrap-around
}

TEST_F(NvmeTest, FiveTwelveByteBlocks) {
  start_target({"--block-size", "512"});
  attach();
  EXPECT_EQ(drv_->block_size(1), 512u);
  DmaBuffer w = buf(4096), r = buf(4096);
  fill(w, 5);
  DmaBuffer w3{w.host, w.iova, 1536}, r3{r.host, r.iova, 1536};
  EXPECT_EQ(sc(io(kNvmWrite, 7, 3, &w3)), kSuccess);
  EXPECT_EQ(sc(io(kNvmRead, 7, 3, &r3)), kSuccess);
  EXPECT_EQ(std::memcmp(w.host, r.host, 1536), 0);
}

TEST_F(NvmeTest, InvalidIoCommandsGetTheRightStatus) {
  start_target();
  attach();
  DmaBuffer b = buf(8192);
  EXPECT_EQ(sc(io(kNvmRead, 0, 1, &b, /*nsid=*/2)), kInvalidNamespace);
  EXPECT_EQ(sc(io(kNvmRead, 0, 1, &b, /*nsid=*/0)), kInvalidNamespace);
  Sqe c{};
  c.cid = 9;
  c.nsid = 1;
  c.opc = 0x7f;
  EXPECT_EQ(sc(raw_io(c)), kInvalidOpcode);
  c.opc = kNvmRead;
  c.prp1 = b.iova + 2;  // not dword aligned
  EXPECT_EQ(sc(raw_io(c)), kPrpOffsetInvalid);
  c.prp1 = 0x10;  // outside every DMA window
  EXPECT_EQ(sc(raw_io(c)), kDataTransferError);
  c.prp1 = b.iova;
  c.cdw12 = 1;  // 8 KiB: PRP2 must be page aligned
  c.prp2 = b.iova + 4096 + 8;
  EXPECT_EQ(sc(raw_io(c)), kPrpOffsetInvalid);
  c.cdw12 = 511;  // 2 MiB > MDTS
  EXPECT_EQ(sc(raw_io(c)), kInvalidField);
  c.cdw12 = 0;
  c.flags = 0x40;  // PSDT: SGL, not supported
  EXPECT_EQ(sc(raw_io(c)), kInvalidField);
  c.flags = 0x01;  // fused
  EXPECT_EQ(sc(raw_io(c)), kInvalidField);
  // A PRP list entry that points outside the host's memory.
  DmaBuffer list = buf(4096);
  uint64_t entries[2] = {b.iova + 4096, 0xdead0000};
  std::memcpy(list.host, entries, sizeof entries);
  c.flags = 0;
  c.prp1 = b.iova;
  c.prp2 = list.iova;
  c.cdw12 = 2;  // 12 KiB: PRP1 + 2 list entries
  EXPECT_EQ(sc(raw_io(c)), kDataTransferError);
  // Error log records the failures, newest first.
  DmaBuffer log = buf(4096);
  Sqe g{};
  g.opc = kAdminGetLogPage;
  g.nsid = kNsidAll;
  g.cdw10 = kLogError | ((512 / 4 - 1) << 16);
  EXPECT_EQ(sc(admin(g, &log)), kSuccess);
  uint64_t count;
  uint16_t status;
  std::memcpy(&count, log.host, 8);
  std::memcpy(&status, log.host + 12, 2);
  EXPECT_GE(count, 9u);
  EXPECT_EQ(status >> 1, kDataTransferError);
}

TEST_F(NvmeTest, WriteZeroesDeallocateAndFlush) {
  start_target();
  attach();
  DmaBuffer w = buf(4 * 4096), r = buf(4 * 4096);
  fill(w, 1);
  ASSERT_EQ(sc(io(kNvmWrite, 100, 4, &w)), kSuccess);
  EXPECT_EQ(sc(io(kNvmWriteZeroes, 101, 1, nullptr)), kSuccess);
  ASSERT_EQ(sc(io(kNvmRead, 100, 4, &r)), kSuccess);
  std::vector<uint8_t> zero(4096, 0);
  EXPECT_EQ(std::memcmp(r.host, w.host, 4096), 0);
  EXPECT_EQ(std::memcmp(r.host + 4096, zero.data(), 4096), 0);
  EXPECT_EQ(std::memcmp(r.host + 8192, w.host + 8192, 8192), 0);
  // Dataset Management, deallocate: two ranges, one of them empty.
  DmaBuffer ranges = buf(4096);
  struct {
    uint32_t attr, nlb;
    uint64_t slba;
  } rg[2] = {{0, 1, 102}, {0, 0, 0}};
  std::memcpy(ranges.host, rg, sizeof rg);
  Sqe d{};
  d.opc = kNvmDsm;
  d.cid = 3;
  d.nsid = 1;
  d.cdw10 = 1;        // 2 ranges
  d.cdw11 = 1u << 2;  // AD
  d.prp1 = ranges.iova;
  EXPECT_EQ(sc(raw_io(d)), kSuccess);
  ASSERT_EQ(sc(io(kNvmRead, 100, 4, &r)), kSuccess);
  EXPECT_EQ(std::memcmp(r.host + 8192, zero.data(), 4096), 0);
  EXPECT_EQ(std::memcmp(r.host + 12288, w.host + 12288, 4096), 0);
  rg[0].slba = drv_->num_blocks(1);  // out of range
  std::memcpy(ranges.host, rg, sizeof rg);
  EXPECT_EQ(sc(raw_io(d)), kLbaOutOfRange);
  EXPECT_EQ(sc(io(kNvmFlush, 0, 1, nullptr)), kSuccess);
  EXPECT_EQ(sc(io(kNvmFlush, 0, 1, nullptr, kNsidAll)), kSuccess);
}

TEST_F(NvmeTest, RegisterFlows) {
  start_target();
  attach();
  uint64_t cap = drv_->read64(kRegCap);
  EXPECT_EQ(cap & 0xffff, 1023u);    // MQES
  EXPECT_TRUE(cap & (1ull << 16));   // CQR
  EXPECT_EQ((cap >> 32) & 0xf, 0u);  // DSTRD
  EXPECT_TRUE(cap & (1ull << 37));   // NVM command set
  EXPECT_EQ(drv_->read32(kRegVs), 0x00010400u);
  EXPECT_TRUE(drv_->read32(kRegCsts) & kCstsRdy);
  // Disable: RDY drops and every I/O queue is gone; enable again works.
  ASSERT_TRUE(drv_->reset_controller().ok());
  EXPECT_EQ(drv_->read32(kRegCsts) & kCstsRdy, 0u);
  ASSERT_TRUE(drv_->initialize().ok());
  DmaBuffer b = buf(4096);
  EXPECT_EQ(sc(io(kNvmRead, 0, 1, &b)), kSuccess);
  // Shutdown, normal then abrupt: SHST reports complete.
  ASSERT_TRUE(drv_->shutdown(false).ok());
  EXPECT_EQ(drv_->read32(kRegCsts) & kCstsShstMask, kCstsShstComplete);
  ASSERT_TRUE(drv_->reset_controller().ok());
  ASSERT_TRUE(drv_->initialize().ok());
  ASSERT_TRUE(drv_->shutdown(true).ok());
  ASSERT_TRUE(drv_->reset_controller().ok());
  // An unsupported page size at enable is a controller fatal status.
  ASSERT_TRUE(drv_->write32(kRegCc, kCcEn | (8u << 7) | 6u << 16 | 4u << 20).ok());
  EXPECT_TRUE(drv_->read32(kRegCsts) & kCstsCfs);
  EXPECT_FALSE(drv_->read32(kRegCsts) & kCstsRdy);
  ASSERT_TRUE(drv_->write32(kRegCc, 0).ok());
  ASSERT_TRUE(drv_->initialize().ok());
  // INTMS/INTMC set and clear the mask.
  ASSERT_TRUE(drv_->write32(kRegIntms, 0x5).ok());
  EXPECT_EQ(drv_->read32(kRegIntms), 0x5u);
  ASSERT_TRUE(drv_->write32(kRegIntmc, 0x1).ok());
  EXPECT_EQ(drv_->read32(kRegIntmc), 0x4u);
  // Function-level reset through the PCIe capability: registers back to reset values.
  ASSERT_TRUE(drv_->function_level_reset().ok());
  EXPECT_EQ(drv_->read32(kRegCc), 0u);
  EXPECT_EQ(drv_->read32(kRegCsts), 0u);
  ASSERT_TRUE(drv_->initialize().ok());
  EXPECT_EQ(sc(io(kNvmRead, 0, 1, &b)), kSuccess);
  // vfio-user DEVICE_RESET does the same.
  ASSERT_TRUE(drv_->client().reset().ok());
  EXPECT_EQ(drv_->read32(kRegCsts) & kCstsRdy, 0u);
  ASSERT_TRUE(drv_->initialize().ok());
  EXPECT_EQ(sc(io(kNvmRead, 0, 1, &b)), kSuccess);
}

TEST_F(NvmeTest, QueueCreationAndDeletionAreValidated) {
  start_target();
  DriverOptions o;
  o.io_queues = 2;  // two granted; the test frees pair 2 and rebuilds it by hand
  attach(o);
  DmaBuffer q = buf(64 * 64);
  auto create_cq = [&](uint32_t qid, uint32_t entries, uint32_t flags, uint16_t iv, uint64_t prp) {
    Sqe c{};
    c.opc = kAdminCreateCq;
    c.prp1 = prp;
    c.cdw10 = (entries - 1) << 16 | qid;
    c.cdw11 = flags | uint32_t{iv} << 16;
    return sc(admin(c));
  };
  auto create_sq = [&](uint32_t qid, uint32_t entries, uint16_t cqid, uint64_t prp) {
    Sqe c{};
    c.opc = kAdminCreateSq;
    c.prp1 = prp;
    c.cdw10 = (entries - 1) << 16 | qid;
    c.cdw11 = 1u | uint32_t{cqid} << 16;
    return sc(admin(c));
  };
  auto del = [&](uint8_t opc, uint32_t qid) {
    Sqe c{};
    c.opc = opc;
    c.cdw10 = qid;
    return sc(admin(c));
  };
  ASSERT_EQ(del(kAdminDeleteSq, 2), kSuccess);
  ASSERT_EQ(del(kAdminDeleteCq, 2), kSuccess);
  EXPECT_EQ(create_cq(0, 16, 1, 0, q.iova), kInvalidQueueId);
  EXPECT_EQ(create_cq(1, 16, 1, 0, q.iova), kInvalidQueueId);  // exists (the driver's)
  EXPECT_EQ(create_cq(2, 1, 1, 0, q.iova), kInvalidQueueSize);
  EXPECT_EQ(create_cq(2, 1025, 1, 0, q.iova), kInvalidQueueSize);
  EXPECT_EQ(create_cq(2, 16, 0, 0, q.iova), kInvalidField);  // not contiguous
  EXPECT_EQ(create_cq(2, 16, 3, 32, q.iova), kInvalidInterruptVector);
  EXPECT_EQ(create_cq(2, 16, 1, 0, q.iova + 64), kPrpOffsetInvalid);
  EXPECT_EQ(create_cq(2, 16, 1, 0, 0x1000), kDataTransferError);
  EXPECT_EQ(create_cq(3, 16, 1, 0, q.iova), kInvalidQueueId);  // beyond the queues granted
  EXPECT_EQ(create_cq(2, 16, 1, 0, q.iova), kSuccess);
  EXPECT_EQ(create_sq(2, 16, 3, q.iova + 4096), kCqInvalid);
  EXPECT_EQ(create_sq(2, 16, 0, q.iova + 4096), kCqInvalid);
  DmaBuffer sq = buf(16 * 64);
  EXPECT_EQ(create_sq(2, 16, 2, sq.iova), kSuccess);
  EXPECT_EQ(del(kAdminDeleteCq, 2), kInvalidQueueDeletion);  // an SQ still uses it
  EXPECT_EQ(del(kAdminDeleteSq, 2), kSuccess);
  EXPECT_EQ(del(kAdminDeleteSq, 2), kInvalidQueueId);
  EXPECT_EQ(del(kAdminDeleteCq, 2), kSuccess);
  EXPECT_EQ(del(kAdminDeleteCq, 0), kInvalidQueueId);
  // Number of Queues after queues exist: command sequence error.
  Sqe f{};
  f.opc = kAdminSetFeatures;
  f.cdw10 = kFeatNumQueues;
  f.cdw11 = 0x00030003;
  EXPECT_EQ(sc(admin(f)), make_status(kSctGeneric, 0x0c));
  Sqe u{};
  u.opc = 0x7e;
  EXPECT_EQ(sc(admin(u)), kInvalidOpcode);
}

TEST_F(NvmeTest, FeaturesLogsAbortKeepAliveAndAsyncEvents) {
  start_target();
  attach();
  auto get = [&](uint8_t fid, uint32_t sel = 0, uint32_t cdw11 = 0) {
    Sqe c{};
    c.opc = kAdminGetFeatures;
    c.cdw10 = fid | sel << 8;
    c.cdw11 = cdw11;
    return admin(c);
  };
  auto set = [&](uint8_t fid, uint32_t v, bool save = false) {
    Sqe c{};
    c.opc = kAdminSetFeatures;
    c.cdw10 = fid | (save ? 1u << 31 : 0u);
    c.cdw11 = v;
    return sc(admin(c));
  };
  EXPECT_EQ(get(kFeatNumQueues).dw0, 0u);  // one I/O queue pair granted to the driver
  for (uint8_t fid : {kFeatArbitration, kFeatErrorRecovery, kFeatIntCoalescing, kFeatKeepAlive,
                      kFeatAsyncEventConfig, kFeatWriteAtomicity}) {
    EXPECT_EQ(set(fid, 0x1234 & (fid == kFeatWriteAtomicity ? 1u : 0xffffu)), kSuccess) << int(fid);
    Cqe e = get(fid);
    EXPECT_EQ(sc(e), kSuccess);
    EXPECT_EQ(e.dw0, 0x1234u & (fid == kFeatWriteAtomicity ? 1u : 0xffffu)) << int(fid);
    EXPECT_EQ(get(fid, 1).dw0, 0u) << "default of " << int(fid);
  }
  EXPECT_EQ(set(kFeatVolatileWc, 0), kSuccess);
  EXPECT_EQ(get(kFeatVolatileWc).dw0, 0u);
  EXPECT_EQ(get(kFeatVolatileWc, 1).dw0, 1u);
  EXPECT_EQ(get(kFeatArbitration, 3).dw0, 0x4u);  // changeable, not saveable
  EXPECT_EQ(set(kFeatArbitration, 1, true), kFeatureNotSaveable);
  EXPECT_EQ(set(kFeatPowerMgmt, 1), kInvalidField);  // only power state 0
  EXPECT_EQ(set(0x7d, 1), kInvalidField);
  EXPECT_EQ(sc(get(kFeatIntVectorConfig, 0, 40)), kInvalidField);
  EXPECT_EQ(get(kFeatTempThreshold).dw0, 343u);
  // Keep Alive and Abort.
  Sqe k{};
  k.opc = kAdminKeepAlive;
  EXPECT_EQ(sc(admin(k)), kSuccess);
  Sqe a{};
  a.opc = kAdminAbort;
  a.cdw10 = 1 | 5u << 16;
  Cqe ae = admin(a);
  EXPECT_EQ(sc(ae), kSuccess);
  EXPECT_EQ(ae.dw0 & 1, 1u);  // not aborted: nothing was pending
  // Logs: SMART counts I/O, firmware slot names the revision, unknown log fails.
  DmaBuffer b = buf(4096), log = buf(4096);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(sc(io(kNvmRead, 0, 1, &b)), kSuccess);
  ASSERT_EQ(sc(io(kNvmWrite, 0, 1, &b)), kSuccess);
  Sqe g{};
  g.opc = kAdminGetLogPage;
  g.nsid = kNsidAll;
  g.cdw10 = kLogSmart | (512 / 4 - 1) << 16;
  ASSERT_EQ(sc(admin(g, &log)), kSuccess);
  uint64_t reads, writes;
  uint16_t temp;
  std::memcpy(&temp, log.host + 1, 2);
  std::memcpy(&reads, log.host + 64, 8);
  std::memcpy(&writes, log.host + 80, 8);
  EXPECT_EQ(reads, 3u);
  EXPECT_EQ(writes, 1u);
  EXPECT_EQ(temp, 313u);
  g.cdw10 = kLogFirmwareSlot | (512 / 4 - 1) << 16;
  ASSERT_EQ(sc(admin(g, &log)), kSuccess);
  EXPECT_EQ(log.host[0], 1);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(log.host + 8), 3), "0.1");
  g.cdw10 = 0x70 | 3u << 16;
  EXPECT_EQ(sc(admin(g, &log)), kInvalidLogPage);
  g.cdw10 = kLogSmart | 3u << 16;
  g.cdw12 = 2;  // offset not dword aligned
  EXPECT_EQ(sc(admin(g, &log)), kInvalidField);
  // Asynchronous events: a temperature threshold below the current temperature
  // completes an outstanding AER with a SMART event naming the SMART log.
  ASSERT_EQ(set(kFeatAsyncEventConfig, 0x02), kSuccess);
  Sqe aer{};
  aer.opc = kAdminAsyncEvent;
  aer.cid = 30;
  ASSERT_TRUE(drv_->submit_raw(0, aer).ok());
  EXPECT_EQ(set(kFeatTempThreshold, 300), kSuccess);
  auto stray = drv_->take_stray_admin();
  ASSERT_EQ(stray.size(), 1u);
  EXPECT_EQ(stray[0].cid, 30);
  EXPECT_EQ(sc(stray[0]), kSuccess);
  EXPECT_EQ(stray[0].dw0,
            uint32_t{kAerSmart} | uint32_t{kAerInfoTemperature} << 8 | uint32_t{kLogSmart} << 16);
  g.cdw12 = 0;
  g.cdw10 = kLogSmart | (512 / 4 - 1) << 16;
  ASSERT_EQ(sc(admin(g, &log)), kSuccess);
  EXPECT_EQ(log.host[0] & 0x02, 0x02);  // critical warning: temperature
  // More AERs than AERL + 1: the fifth fails with the limit status.
  for (uint16_t i = 0; i < 4; ++i) {
    aer.cid = static_cast<uint16_t>(20 + i);
    ASSERT_TRUE(drv_->submit_raw(0, aer).ok());
  }
  aer.cid = 24;
  ASSERT_TRUE(drv_->submit_raw(0, aer).ok());
  ASSERT_EQ(sc(admin(k)), kSuccess);
  stray = drv_->take_stray_admin();
  ASSERT_EQ(stray.size(), 1u);
  EXPECT_EQ(stray[0].cid, 24);
  EXPECT_EQ(sc(stray[0]), kAerLimitExceeded);
}

TEST_F(NvmeTest, InvalidDoorbellRaisesAnErrorEvent) {
  start_target();
  attach();
  Sqe aer{};
  aer.opc = kAdminAsyncEvent;
  aer.cid = 31;
  ASSERT_TRUE(drv_->submit_raw(0, aer).ok());
  drv_->ring_doorbell_raw(8 * 1, 5000);  // SQ 1 tail beyond its 256 entries
  Sqe k{};
  k.opc = kAdminKeepAlive;
  std::vector<Cqe> stray;
  for (int i = 0; i < 200 && stray.empty(); ++i) {
    ASSERT_EQ(sc(admin(k)), kSuccess);
    stray = drv_->take_stray_admin();
  }
  ASSERT_EQ(stray.size(), 1u);
  EXPECT_EQ(stray[0].dw0 & 0xff, uint32_t{kAerError});
  EXPECT_EQ((stray[0].dw0 >> 8) & 0xff, uint32_t{kAerInfoInvalidDoorbellValue});
  // A doorbell of a queue that does not exist, written by message: also refused.
  uint32_t v = 1;
  ASSERT_TRUE(drv_->client().region_write(vu::kBar0, kDoorbellBase + 8 * 9, &v, 4).ok());
  // The queue still works once the host writes a sane tail.
  drv_->ring_doorbell_raw(8 * 1, 0);
  DmaBuffer b = buf(4096);
  EXPECT_EQ(sc(io(kNvmRead, 0, 1, &b)), kSuccess);
}

TEST_F(NvmeTest, FullCompletionQueueHoldsBackFetching) {
  start_target();
  DriverOptions o;
  o.queue_entries = 8;
  attach(o);
  // 7 commands in an 8-entry SQ/CQ pair: the CQ holds at most 7 completions.
  DmaBuffer b = buf(4096);
  for (uint16_t i = 0; i < 7; ++i) {
    Sqe c{};
    c.opc = kNvmRead;
    c.cid = i;
    c.nsid = 1;
    ASSERT_TRUE(drv_->submit(0, c, &b, 4096, nullptr).ok());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Cqe e[8];
  int n = drv_->reap(0, e, 8);
  ASSERT_EQ(n, 7);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(e[i].cid, i);
    EXPECT_EQ(sc(e[i]), kSuccess);
    EXPECT_EQ(e[i].sq_id, 1);
  }
  EXPECT_EQ(e[6].sq_head, 7);
  // Wrap the queues several times: phase tags flip and everything completes.
  for (int round = 0; round < 5; ++round) {
    for (uint16_t i = 0; i < 7; ++i) {
      Sqe c{};
      c.opc = kNvmRead;
      c.cid = i;
      c.nsid = 1;
      ASSERT_TRUE(drv_->submit(0, c, &b, 4096, nullptr).ok());
    }
    int got = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (got < 7 && std::chrono::steady_clock::now() < deadline) got += drv_->reap(0, e, 8);
    ASSERT_EQ(got, 7) << "round " << round;
  }
}

TEST_F(NvmeTest, DeletingQueuesUnderIo) {
  start_target({"--bdev", "file", "--file", file_});
  attach();
  DmaBuffer b = buf(32 * 8192);
  for (int round = 0; round < 3; ++round) {
    for (uint16_t i = 0; i < 32; ++i) {
      Sqe c{};
      c.opc = kNvmWrite;
      c.cid = i;
      c.nsid = 1;
      c.cdw10 = i * 2u;
      c.cdw12 = 1;
      DmaBuffer s{b.host + i * 8192u, b.iova + i * 8192u, 8192};
      ASSERT_TRUE(drv_->submit(0, c, &s, 8192, nullptr).ok());
    }
    // Delete the SQ while its commands are on the medium or not yet fetched, then
    // the CQ: both succeed, nothing is lost from the admin queue's view.
    Sqe d{};
    d.opc = kAdminDeleteSq;
    d.cdw10 = 1;
    EXPECT_EQ(sc(admin(d)), kSuccess);
    d.opc = kAdminDeleteCq;
    EXPECT_EQ(sc(admin(d)), kSuccess);
    // What completed before the deletion is whole and named once.
    Cqe e[32];
    int n = drv_->reap(0, e, 32);
    std::vector<bool> seen(32);
    for (int i = 0; i < n; ++i) {
      ASSERT_LT(e[i].cid, 32);
      EXPECT_FALSE(seen[e[i].cid]);
      seen[e[i].cid] = true;
      EXPECT_EQ(sc(e[i]), kSuccess);
    }
    ASSERT_TRUE(drv_->initialize().ok());
    EXPECT_EQ(sc(io(kNvmRead, 0, 1, &b)), kSuccess);
  }
}

TEST_F(NvmeTest, MsixInterruptsAndMasking) {
  start_target();
  DriverOptions o;
  o.interrupts = true;
  attach(o);
  DmaBuffer b = buf(4096);
  uint32_t before = drv_->interrupts_seen();
  EXPECT_EQ(sc(io(kNvmRead, 0, 1, &b)), kSuccess);
  EXPECT_GT(drv_->interrupts_seen(), before);
  // Masked vector: the completion is posted, the interrupt waits in the PBA.
  ASSERT_TRUE(drv_->client().mask_irq(1, true).ok());
  Sqe c{};
  c.opc = kNvmRead;
  c.cid = 1;
  c.nsid = 1;
  ASSERT_TRUE(drv_->submit(0, c, &b, 4096, nullptr).ok());
  EXPECT_EQ(drv_->wait_interrupt(0, 200).code(), Code::kTimeout);
  uint64_t pba = 0;
  ASSERT_TRUE(drv_->client().region_read(vu::kBar0, kMsixPbaOffset, &pba, 8).ok());
  EXPECT_EQ(pba & 2, 2u);
  ASSERT_TRUE(drv_->client().mask_irq(1, false).ok());
  EXPECT_TRUE(drv_->wait_interrupt(0, 2000).ok());
  Cqe e;
  EXPECT_EQ(drv_->reap(0, &e, 1), 1);
}

TEST_F(NvmeTest, MalformedMessagesGetErrorsAndTheServerKeepsServing) {
  start_target();
  attach();
  VfioUserClient& c = drv_->client();
  vu::Header h{};
  std::vector<uint8_t> body;
  auto send_raw = [&](std::vector<uint8_t> msg) {
    vu::Header r{};
    EXPECT_TRUE(c.raw(msg.data(), msg.size(), &r, &body).ok());
    return r;
  };
  auto msg = [&](uint16_t cmd, std::vector<uint8_t> payload, uint32_t size_adj = 0,
                 uint32_t flags = 0) {
    h.msg_id = 77;
    h.command = cmd;
    h.msg_size = static_cast<uint32_t>(sizeof h + payload.size()) + size_adj;
    h.flags = flags;
    std::vector<uint8_t> m(sizeof h + payload.size());
    std::memcpy(m.data(), &h, sizeof h);
    if (!payload.empty()) std::memcpy(m.data() + sizeof h, payload.data(), payload.size());
    return m;
  };
  vu::Header r = send_raw(msg(99, {}));
  EXPECT_TRUE(r.flags & vu::kFlagError);
  EXPECT_EQ(r.error_no, static_cast<uint32_t>(ENOTSUP));
  EXPECT_EQ(r.msg_id, 77);
  r = send_raw(msg(vu::kRegionRead, std::vector<uint8_t>(8)));  // short payload
  EXPECT_EQ(r.error_no, static_cast<uint32_t>(EINVAL));
  vu::RegionAccess a{0x4000, vu::kBar0, 4};  // beyond BAR0
  std::vector<uint8_t> p(sizeof a);
  std::memcpy(p.data(), &a, sizeof a);
  EXPECT_EQ(send_raw(msg(vu::kRegionRead, p)).error_no, static_cast<uint32_t>(EINVAL));
  a = vu::RegionAccess{0x14, vu::kBar0, 3};  // odd access size
  std::memcpy(p.data(), &a, sizeof a);
  EXPECT_EQ(send_raw(msg(vu::kRegionRead, p)).error_no, static_cast<uint32_t>(EINVAL));
  a = vu::RegionAccess{0xffe, vu::kConfig, 4};  // crosses the end of config space
  std::memcpy(p.data(), &a, sizeof a);
  EXPECT_EQ(send_raw(msg(vu::kRegionRead, p)).error_no, static_cast<uint32_t>(EINVAL));
  a = vu::RegionAccess{0, 42, 4};
  std::memcpy(p.data(), &a, sizeof a);
  EXPECT_EQ(send_raw(msg(vu::kRegionRead, p)).error_no, static_cast<uint32_t>(EINVAL));
  EXPECT_EQ(send_raw(msg(vu::kVersion, std::vector<uint8_t>(4))).error_no,
            static_cast<uint32_t>(EINVAL));  // twice
  EXPECT_EQ(send_raw(msg(vu::kDeviceGetInfo, std::vector<uint8_t>(16), 0, vu::kFlagReply)).error_no,
            static_cast<uint32_t>(EINVAL));  // a reply sent as a command
  // DMA_MAP without an fd, over an existing window, and DMA_UNMAP of nothing.
  EXPECT_FALSE(c.dma_map(0x1000, 4096, -1, 0, vu::kDmaRead_).ok());
  EXPECT_EQ(c.last_errno(), ENOTSUP);
  int efd = eventfd(0, EFD_CLOEXEC);
  EXPECT_FALSE(c.dma_map(VfioUserDriver::kIovaBase, 4096, efd, 0, vu::kDmaRead_).ok());
  EXPECT_EQ(c.last_errno(), EEXIST);
  ::close(efd);
  EXPECT_FALSE(c.dma_unmap(0x5000, 4096).ok());
  EXPECT_EQ(c.last_errno(), ENOENT);
  // SET_IRQS: a range beyond the vectors, and two action flags at once.
  vu::IrqSet s{sizeof s, vu::kIrqDataNone | vu::kIrqActionMask, vu::kIrqMsix, 30, 5};
  std::vector<uint8_t> sp(sizeof s);
  std::memcpy(sp.data(), &s, sizeof s);
  EXPECT_EQ(send_raw(msg(vu::kDeviceSetIrqs, sp)).error_no, static_cast<uint32_t>(EINVAL));
  s = vu::IrqSet{sizeof s, vu::kIrqDataNone | vu::kIrqActionMask | vu::kIrqActionUnmask,
                 vu::kIrqMsix, 0, 1};
  std::memcpy(sp.data(), &s, sizeof s);
  EXPECT_EQ(send_raw(msg(vu::kDeviceSetIrqs, sp)).error_no, static_cast<uint32_t>(EINVAL));
  vu::RegionInfo ri{};
  EXPECT_FALSE(c.region_info(vu::kNumRegions, &ri).ok());
  // Still serving: I/O works.
  DmaBuffer b = buf(4096);
  EXPECT_EQ(sc(io(kNvmRead, 0, 1, &b)), kSuccess);
  // A message size the server cannot frame drops only that connection.
  {
    std::unique_ptr<VfioUserClient> other;
    drv_.reset();  // one client at a time
    ASSERT_TRUE(VfioUserClient::connect(socket_, 5000, &other).ok());
    std::vector<uint8_t> bad = msg(vu::kDeviceGetInfo, {}, 0);
    uint32_t huge = 1u << 30;
    std::memcpy(bad.data() + 4, &huge, 4);
    vu::Header rr{};
    EXPECT_FALSE(other->raw(bad.data(), bad.size(), &rr, &body).ok());
  }
  attach();
  EXPECT_EQ(sc(io(kNvmRead, 0, 1, &b)), kSuccess);
}

TEST_F(NvmeTest, CommandsBeforeVersionAreRefusedAndSecondClientIsTurnedAway) {
  start_target();
  attach();
  // A second client while the first is connected: closed by the server.
  std::unique_ptr<VfioUserClient> second;
  EXPECT_FALSE(VfioUserClient::connect(socket_, 300, &second).ok());
  DmaBuffer b = buf(4096);
  EXPECT_EQ(sc(io(kNvmRead, 0, 1, &b)), kSuccess);
}

TEST_F(NvmeTest, KilledClientMidIoLeavesTheServerReady) {
  start_target({"--bdev", "file", "--file", file_});
  for (int round = 0; round < 3; ++round) {
    pid_t child = fork();
    if (child == 0) {
      std::unique_ptr<VfioUserDriver> d;
      DriverOptions o;
      o.memory_bytes = 16u << 20;
      if (!VfioUserDriver::attach(socket_, o, &d).ok()) _exit(3);
      DmaBuffer b;
      if (!d->alloc(64 * 4096, &b).ok()) _exit(4);
      for (uint64_t i = 0;; ++i) {  // writes until killed, up to 32 in flight
        Sqe c{};
        c.opc = kNvmWrite;
        c.cid = static_cast<uint16_t>(i % 32);
        c.nsid = 1;
        c.cdw10 = static_cast<uint32_t>(i % 1000);
        c.cdw12 = 1;
        DmaBuffer s{b.host + (i % 32) * 8192, b.iova + (i % 32) * 8192, 8192};
        (void)d->submit(0, c, &s, 8192, nullptr);
        if (i >= 31) {
          Cqe e;
          while (d->reap(0, &e, 1) == 0) {
          }
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_TRUE(signal_child(child, SIGKILL));
    reap_child(child, nullptr);
    attach();
    DmaBuffer w = buf(4096), r = buf(4096);
    fill(w, static_cast<uint32_t>(round));
    EXPECT_EQ(sc(io(kNvmWrite, 2000, 1, &w)), kSuccess);
    EXPECT_EQ(sc(io(kNvmRead, 2000, 1, &r)), kSuccess);
    EXPECT_EQ(std::memcmp(w.host, r.host, 4096), 0);
    drv_.reset();
  }
}

TEST_F(NvmeTest, FileNamespaceKeepsDataAcrossRestarts) {
  start_target({"--bdev", "file", "--file", file_});
  attach();
  DmaBuffer w = buf(16 * 4096), r = buf(16 * 4096);
  fill(w, 1234);
  ASSERT_EQ(sc(io(kNvmWrite, 77, 16, &w)), kSuccess);
  ASSERT_EQ(sc(io(kNvmFlush, 0, 1, nullptr)), kSuccess);
  drv_.reset();
  stop_target();
  start_target({"--bdev", "file", "--file", file_});
  attach();
  r = buf(16 * 4096);
  w = buf(16 * 4096);
  fill(w, 1234);
  ASSERT_EQ(sc(io(kNvmRead, 77, 16, &r)), kSuccess);
  EXPECT_EQ(std::memcmp(w.host, r.host, w.len), 0);
  EXPECT_EQ(sc(io(kNvmWriteZeroes, 78, 1, nullptr)), kSuccess);
  ASSERT_EQ(sc(io(kNvmRead, 77, 16, &r)), kSuccess);
  std::vector<uint8_t> zero(4096, 0);
  EXPECT_EQ(std::memcmp(r.host + 4096, zero.data(), 4096), 0);
}

TEST_F(NvmeTest, UnmappingQueueMemoryIsFatalNotACrash) {
  start_target();
  attach();
  ASSERT_TRUE(drv_->client().dma_unmap(VfioUserDriver::kIovaBase, 16u << 20).ok());
  EXPECT_TRUE(drv_->read32(kRegCsts) & kCstsCfs);
  EXPECT_FALSE(drv_->read32(kRegCsts) & kCstsRdy);
}

// The emulation manager in this process: functions created and destroyed at
// run time walk the hotplug states, and a connected client sees the unplug.
TEST(EmulationManagerTest, HotplugStates) {
  log_set_level(LogSource::kLib, LogLevel::kError);
  std::unique_ptr<EmulationManager> m;
  ASSERT_TRUE(EmulationManager::create(ManagerOptions{}, &m).ok());
  std::unique_ptr<Bdev> b;
  ASSERT_TRUE(create_malloc_bdev("m0", 1024, 4096, &b).ok());
  std::shared_ptr<Bdev> shared = std::move(b);
  std::string base = "/tmp/dpukv-emu-" + std::to_string(getpid());
  FunctionSpec spec;
  spec.namespaces = {shared};
  spec.socket_path = base + "-a.sock";
  std::string a, bid;
  ASSERT_TRUE(m->create_function(spec, &a).ok());
  spec.socket_path = base + "-b.sock";
  spec.id = "fn-b";
  ASSERT_TRUE(m->create_function(spec, &bid).ok());
  EXPECT_EQ(bid, "fn-b");
  EXPECT_EQ(m->create_function(spec, &bid).code(), Code::kBadState);  // same id and path
  auto fns = m->list_functions();
  ASSERT_EQ(fns.size(), 2u);
  for (const auto& f : fns) EXPECT_EQ(f.state, HotplugState::kPowerOn);
  std::unique_ptr<VfioUserDriver> d;
  DriverOptions o;
  o.memory_bytes = 8u << 20;
  ASSERT_TRUE(VfioUserDriver::attach(base + "-a.sock", o, &d).ok());
  fns = m->list_functions();
  EXPECT_TRUE(fns[0].client_connected);
  EXPECT_EQ(fns[0].io_queues, 1u);
  ASSERT_TRUE(m->destroy_function(a).ok());
  EXPECT_EQ(d->read32(kRegCsts), 0xffffffffu);  // the device is gone
  EXPECT_EQ(m->destroy_function(a).code(), Code::kNotFound);
  fns = m->list_functions();
  ASSERT_EQ(fns.size(), 1u);
  EXPECT_EQ(fns[0].id, "fn-b");
  EXPECT_FALSE(std::filesystem::exists(base + "-a.sock"));
}

}  // namespace
}  // namespace dpukv::nvme
