// The emulated NVMe controller driven through the user-space vfio-user driver:
// identify, every admin and NVM command with the right status for bad input,
// register flows, queue management, features, logs and asynchronous events.
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>

#include "testing/vfio_user_test_fixture.h"

namespace dpukv::nvme {
namespace {

using namespace vfio_user_test;

TEST_F(NvmeTest, IdentifyDescribesControllerAndNamespace) {
  start_target({"--serial", "SN-TEST-42"});
  ASSERT_NO_FATAL_FAILURE(attach());
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
  ASSERT_NO_FATAL_FAILURE(attach());
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
  ASSERT_NO_FATAL_FAILURE(attach());
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
  ASSERT_NO_FATAL_FAILURE(attach());
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
  ASSERT_NO_FATAL_FAILURE(attach());
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
  ASSERT_NO_FATAL_FAILURE(attach());
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
  ASSERT_NO_FATAL_FAILURE(attach(o));
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
  // A CQID within the grant but not created: Completion Queue Invalid; CQID 0
  // or one beyond the grant names no I/O CQ at all: Invalid Queue Identifier.
  EXPECT_EQ(create_sq(2, 16, 2, q.iova + 4096), kCqInvalid);
  EXPECT_EQ(create_cq(2, 16, 1, 0, q.iova), kSuccess);
  EXPECT_EQ(create_sq(2, 16, 3, q.iova + 4096), kInvalidQueueId);
  EXPECT_EQ(create_sq(2, 16, 0, q.iova + 4096), kInvalidQueueId);
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
  ASSERT_NO_FATAL_FAILURE(attach());
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

}  // namespace
}  // namespace dpukv::nvme
