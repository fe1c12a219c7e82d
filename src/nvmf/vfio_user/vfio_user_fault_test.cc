// The emulated NVMe controller under faults: invalid doorbells, a full
// completion queue, queues deleted under I/O, interrupts and masking, malformed
// protocol messages, killed clients, restarts, unmapped queue memory, hotplug.
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>

#include "nvmf/bdev/bdev_malloc.h"
#include "testing/vfio_user_test_fixture.h"

namespace dpukv::nvme {
namespace {

using namespace vfio_user_test;

TEST_F(NvmeTest, InvalidDoorbellRaisesAnErrorEvent) {
  start_target();
  ASSERT_NO_FATAL_FAILURE(attach());
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
  ASSERT_NO_FATAL_FAILURE(attach(o));
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
  ASSERT_NO_FATAL_FAILURE(attach());
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
  ASSERT_NO_FATAL_FAILURE(attach(o));
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

// The driver's PCI set-up as SPDK's host does it (INTx disabled: a target may
// count INTx as an interrupt mode), and a controller that reports fatal status
// ends a wait at once instead of after its timeout.
TEST_F(NvmeTest, DriverDisablesIntxAndStopsWaitingOnFatalStatus) {
  start_target();
  ASSERT_NO_FATAL_FAILURE(attach());
  uint16_t cmd = 0;
  ASSERT_TRUE(drv_->client().region_read(vu::kConfig, 0x04, &cmd, 2).ok());
  EXPECT_EQ(cmd & 0x0406, 0x0406) << "memory space, bus master, INTx disable";
  // Make the controller fatal: enable it with its admin queues outside the
  // host's memory.
  ASSERT_TRUE(drv_->reset_controller().ok());
  ASSERT_TRUE(drv_->write64(kRegAsq, 0x7000000000ull).ok());
  ASSERT_TRUE(drv_->write32(kRegCc, drv_->read32(kRegCc) | kCcEn).ok());
  EXPECT_TRUE(drv_->read32(kRegCsts) & kCstsCfs);
  Sqe c{};
  c.opc = kAdminKeepAlive;
  Cqe e{};
  EXPECT_EQ(drv_->admin(c, &e, nullptr, 600000).code(), Code::kIoFailed);
}

TEST_F(NvmeTest, MalformedMessagesGetErrorsAndTheServerKeepsServing) {
  start_target();
  ASSERT_NO_FATAL_FAILURE(attach());
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
  ASSERT_NO_FATAL_FAILURE(attach());
  EXPECT_EQ(sc(io(kNvmRead, 0, 1, &b)), kSuccess);
}

TEST_F(NvmeTest, CommandsBeforeVersionAreRefusedAndSecondClientIsTurnedAway) {
  start_target();
  ASSERT_NO_FATAL_FAILURE(attach());
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
    ASSERT_NO_FATAL_FAILURE(attach());
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
  ASSERT_NO_FATAL_FAILURE(attach());
  DmaBuffer w = buf(16 * 4096), r = buf(16 * 4096);
  fill(w, 1234);
  ASSERT_EQ(sc(io(kNvmWrite, 77, 16, &w)), kSuccess);
  ASSERT_EQ(sc(io(kNvmFlush, 0, 1, nullptr)), kSuccess);
  drv_.reset();
  stop_target();
  start_target({"--bdev", "file", "--file", file_});
  ASSERT_NO_FATAL_FAILURE(attach());
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

// A host may take its memory away while queues exist (SPDK's host unmaps after
// a shutdown, with CC.EN still 1): the queues are parked, not failed, and a
// command rung meanwhile runs once the memory is mapped again.
TEST_F(NvmeTest, UnmappedQueueMemoryParksTheQueuesUntilMappedAgain) {
  start_target();
  ASSERT_NO_FATAL_FAILURE(attach());
  DmaBuffer w, r;
  ASSERT_TRUE(drv_->alloc(4096, &w).ok());
  ASSERT_TRUE(drv_->alloc(4096, &r).ok());
  for (size_t i = 0; i < 4096; ++i) w.host[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_TRUE(drv_->unmap_memory().ok());
  EXPECT_FALSE(drv_->read32(kRegCsts) & kCstsCfs);
  EXPECT_TRUE(drv_->read32(kRegCsts) & kCstsRdy);
  Sqe c{};
  c.opc = kNvmWrite;
  c.nsid = 1;
  c.cdw10 = 77;
  uint16_t cid = 0;
  ASSERT_TRUE(drv_->submit(0, c, &w, 4096, &cid).ok());  // its SQ is parked
  Cqe e{};
  EXPECT_EQ(drv_->reap(0, &e, 1), 0) << "nothing fetched from unmapped memory";
  ASSERT_TRUE(drv_->map_memory().ok());
  ASSERT_TRUE(drv_->wait_one(0, &e, 5000).ok());
  EXPECT_EQ(e.cid, cid);
  EXPECT_EQ(status_of_cqe(e.status), kSuccess);
  c.opc = kNvmRead;
  ASSERT_TRUE(drv_->submit(0, c, &r, 4096, nullptr).ok());
  ASSERT_TRUE(drv_->wait_one(0, &e, 5000).ok());
  EXPECT_EQ(status_of_cqe(e.status), kSuccess);
  EXPECT_EQ(std::memcmp(w.host, r.host, 4096), 0);
  // The detach SPDK's host does: shutdown, unmap with CC.EN 1, close. The next
  // host finds a working controller.
  ASSERT_TRUE(drv_->shutdown(false).ok());
  ASSERT_TRUE(drv_->unmap_memory().ok());
  EXPECT_FALSE(drv_->read32(kRegCsts) & kCstsCfs);
  drv_.reset();
  ASSERT_NO_FATAL_FAILURE(attach());
  ASSERT_TRUE(drv_->alloc(4096, &r).ok());
  ASSERT_TRUE(drv_->submit(0, c, &r, 4096, nullptr).ok());
  ASSERT_TRUE(drv_->wait_one(0, &e, 5000).ok());
  EXPECT_EQ(status_of_cqe(e.status), kSuccess);
  EXPECT_EQ(std::memcmp(w.host, r.host, 4096), 0);
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
