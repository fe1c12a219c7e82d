// The controller core alone, under a transport of this test's (a fabrics
// controller with no socket): registers through enable and reset, admin commands
// answered into the request's own buffer, an unknown opcode refused and logged in
// the error log, and I/O to a malloc namespace inside and past its end.
#include "nvmf/core/controller_core.h"

#include <gtest/gtest.h>
#include <sys/uio.h>

#include <cstring>
#include <memory>
#include <vector>

#include "nvmf/bdev/bdev_malloc.h"

namespace dpukv::nvme {
namespace {

class TestController final : public ControllerCore {
 public:
  explicit TestController(const ControllerConfig& c) : ControllerCore(c) {}
  ~TestController() override { drain_inflight(); }

  struct Done {
    uint8_t opc;
    uint16_t status;
  };
  std::vector<Done> done;

  // Runs one command with buf as its data; its status once it completed.
  uint16_t run(const Sqe& cmd, uint16_t qid, void* buf, size_t len) {
    Request* r = alloc_request();
    EXPECT_NE(r, nullptr);
    r->cmd = cmd;
    r->cmd.flags |= 1u << 6;  // PSDT 01: an SGL, as every fabrics command carries
    r->qid = qid;
    io_ = {buf, len};
    r->iov = len ? &io_ : nullptr;
    r->iovcnt = len ? 1 : 0;
    const size_t before = done.size();
    execute(r);
    for (int i = 0; i < 100000 && done.size() == before; ++i) poll_bdevs();
    EXPECT_EQ(done.size(), before + 1) << "the command never completed";
    return done.size() > before ? done.back().status : 0xffff;
  }

 private:
  void complete(Request* r, uint16_t status) override {
    done.push_back({r->cmd.opc, status});
    release(r);
  }
  iovec io_{};
};

ControllerConfig fabrics_config() {
  ControllerConfig c;
  c.fabrics = true;
  c.serial = "CORE-TEST-SN";
  c.model = "core test";
  return c;
}

constexpr uint32_t kCcEnabled = kCcEn | (6u << 16) | (4u << 20);  // IOSQES 64 B, IOCQES 16 B

TEST(ControllerCore, EnableSetsReadyAndResetClearsIt) {
  TestController c(fabrics_config());
  EXPECT_FALSE(c.ready());
  c.write_reg(kRegCc, 4, kCcEnabled);
  EXPECT_TRUE(c.ready());
  EXPECT_EQ(c.read_reg(kRegCsts, 4) & kCstsRdy, kCstsRdy);
  c.write_reg(kRegCc, 4, 0);
  EXPECT_FALSE(c.ready());
  EXPECT_EQ(c.read_reg(kRegCc, 4), 0u);
}

TEST(ControllerCore, IdentifyAnswersIntoTheRequestsBuffer) {
  TestController c(fabrics_config());
  c.write_reg(kRegCc, 4, kCcEnabled);
  std::vector<uint8_t> page(4096, 0xee);
  Sqe id{};
  id.opc = kAdminIdentify;
  id.cdw10 = kCnsController;
  ASSERT_EQ(c.run(id, 0, page.data(), page.size()), kSuccess);
  uint16_t vid;
  std::memcpy(&vid, page.data(), sizeof(vid));
  EXPECT_EQ(vid, fabrics_config().vendor_id);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(page.data() + 4), 12), "CORE-TEST-SN");
  EXPECT_EQ(page[4 + 12], ' ') << "SN is padded with spaces";
  EXPECT_EQ(c.stats().admin_commands, 1u);
}

TEST(ControllerCore, AnUnknownOpcodeIsRefusedAndLogged) {
  TestController c(fabrics_config());
  c.write_reg(kRegCc, 4, kCcEnabled);
  Sqe bad{};
  bad.opc = 0x7e;  // no such admin command
  bad.cid = 0x1234;
  EXPECT_EQ(c.run(bad, 0, nullptr, 0), kInvalidOpcode);
  EXPECT_EQ(c.stats().errors, 1u);
  // The error log's newest entry names it: error count 1, the command's id.
  std::vector<uint8_t> log(64, 0);
  Sqe get{};
  get.opc = kAdminGetLogPage;
  get.cdw10 = kLogError | ((64 / 4 - 1) << 16);  // one 64-byte entry
  ASSERT_EQ(c.run(get, 0, log.data(), log.size()), kSuccess);
  uint64_t count;
  uint16_t cid;
  std::memcpy(&count, log.data(), sizeof(count));
  std::memcpy(&cid, log.data() + 10, sizeof(cid));
  EXPECT_EQ(count, 1u);
  EXPECT_EQ(cid, 0x1234);
}

TEST(ControllerCore, IoReachesItsNamespaceAndStopsAtItsEnd) {
  TestController c(fabrics_config());
  std::unique_ptr<Bdev> b;
  ASSERT_TRUE(create_malloc_bdev("m0", 64, 512, &b).ok());
  ASSERT_TRUE(c.add_namespace(1, std::shared_ptr<Bdev>(std::move(b))).ok());
  c.write_reg(kRegCc, 4, kCcEnabled);
  std::vector<uint8_t> out(2048), in(2048, 0);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7);
  Sqe w{};
  w.opc = kNvmWrite;
  w.nsid = 1;
  w.cdw10 = 60;  // SLBA: the last four blocks
  w.cdw12 = 3;   // NLB, 0-based
  ASSERT_EQ(c.run(w, 1, out.data(), out.size()), kSuccess);
  Sqe r = w;
  r.opc = kNvmRead;
  ASSERT_EQ(c.run(r, 1, in.data(), in.size()), kSuccess);
  EXPECT_EQ(in, out);
  r.cdw10 = 61;  // four blocks from 61 run past block 63
  EXPECT_EQ(c.run(r, 1, in.data(), in.size()), kLbaOutOfRange);
  EXPECT_EQ(c.stats().reads, 1u);
  EXPECT_EQ(c.stats().writes, 1u);
}

}  // namespace
}  // namespace dpukv::nvme
