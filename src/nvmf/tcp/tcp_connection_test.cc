// One NVMe/TCP queue pair alone, on a socketpair, under a target of the test's
// (core/target_side.h): the ICReq answered with the transport's limits, and each
// kind of bad PDU answered with a C2HTermReq naming the error and the field, the
// offending header echoed, and the connection closed. The target with real TCP
// sockets and hosts is nvmf_test.cc's.
#include "nvmf/tcp/tcp_connection.h"

#include <gtest/gtest.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "nvme/tcp_wire.h"

namespace dpukv::nvme {
namespace {

using namespace tcp;  // the PDU layouts

class TestTarget final : public TargetSide {
 public:
  TargetStats& counters() override { return stats; }
  Subsystem* connect_target(const std::string&) override { return nullptr; }
  std::vector<uint8_t> discovery_log(const std::string&) const override { return {}; }
  void release_queue(FabricsController*, uint16_t) override {}
  TcpTransportOptions opts;
  TargetStats stats;
};

class TcpConnectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    host_ = sv[1];
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    ASSERT_GE(ep_, 0);
    target_.opts.max_h2c_data = 64 * 1024;
    conn_ = std::make_unique<TcpConnection>(&target_, &target_.opts, ep_, sv[0], "tcp:test");
  }
  void TearDown() override {
    conn_.reset();
    ::close(host_);
    ::close(ep_);
  }
  // The host sends bytes; the connection reads them and flushes its answer.
  void host_sends(const void* p, size_t n) {
    ASSERT_EQ(::send(host_, p, n, 0), static_cast<ssize_t>(n));
    conn_->on_readable();
    conn_->flush();
  }
  std::vector<uint8_t> host_reads() {
    std::vector<uint8_t> b(4096);
    const ssize_t n = ::recv(host_, b.data(), b.size(), MSG_DONTWAIT);
    b.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return b;
  }
  static IcReq icreq() {
    IcReq r{};
    r.ch = CommonHeader{kIcReq, 0, sizeof r, 0, sizeof r};
    r.dgst = kDigestHeader;
    return r;
  }
  // The C2HTermReq the connection sent, checked for its shape; the echoed header.
  std::vector<uint8_t> expect_term(uint16_t fes, uint32_t fei) {
    const std::vector<uint8_t> got = host_reads();
    EXPECT_GE(got.size(), sizeof(TermReq));
    if (got.size() < sizeof(TermReq)) return {};
    TermReq tr;
    std::memcpy(&tr, got.data(), sizeof tr);
    // Packed fields are copied out: gtest binds references, which must be aligned.
    const uint8_t type = tr.ch.type;
    const uint32_t plen = tr.ch.plen, got_fei = tr.fei;
    const uint16_t got_fes = tr.fes;
    EXPECT_EQ(type, kC2HTermReq);
    EXPECT_EQ(plen, got.size());
    EXPECT_EQ(got_fes, fes);
    EXPECT_EQ(got_fei, fei);
    EXPECT_TRUE(conn_->closed());
    EXPECT_EQ(target_.stats.term_reqs_sent, 1u);
    return {got.begin() + sizeof tr, got.end()};
  }

  TestTarget target_;
  int host_ = -1, ep_ = -1;
  std::unique_ptr<TcpConnection> conn_;
};

TEST_F(TcpConnectionTest, AnIcReqIsAnsweredWithTheTransportsLimits) {
  EXPECT_FALSE(conn_->ready());
  const IcReq req = icreq();
  host_sends(&req, sizeof req);
  const std::vector<uint8_t> got = host_reads();
  ASSERT_EQ(got.size(), sizeof(IcResp));
  IcResp resp;
  std::memcpy(&resp, got.data(), sizeof resp);
  const uint8_t type = resp.ch.type, dgst = resp.dgst;
  const uint32_t plen = resp.ch.plen, maxh2cdata = resp.maxh2cdata;
  const uint16_t pfv = resp.pfv;
  EXPECT_EQ(type, kIcResp);
  EXPECT_EQ(plen, sizeof(IcResp));
  EXPECT_EQ(pfv, 0);
  EXPECT_EQ(dgst, kDigestHeader) << "the digests the host asked for";
  EXPECT_EQ(maxh2cdata, 64u * 1024);
  EXPECT_TRUE(conn_->ready());
  EXPECT_FALSE(conn_->closed());
}

TEST_F(TcpConnectionTest, APduBeforeTheIcReqEndsTheConnection) {
  CapsuleCmd cmd{};
  cmd.ch = CommonHeader{kCapsuleCmd, 0, sizeof cmd, 0, sizeof cmd};
  host_sends(&cmd, sizeof cmd);
  const std::vector<uint8_t> echoed = expect_term(kFesPduSequence, 0);
  ASSERT_GE(echoed.size(), sizeof(CommonHeader));
  EXPECT_EQ(echoed[0], kCapsuleCmd) << "the offending header comes back";
}

TEST_F(TcpConnectionTest, AnIcReqOfAnotherVersionIsRefusedNamingTheField) {
  IcReq req = icreq();
  req.pfv = 1;
  host_sends(&req, sizeof req);
  expect_term(kFesUnsupportedParameter, 8);  // PFV is at byte 8
  EXPECT_FALSE(conn_->ready());
}

TEST_F(TcpConnectionTest, AHeaderLongerThanItsPduOrThanTheLimitIsInvalid) {
  CommonHeader ch{kIcReq, 0, 200, 0, 128};  // hlen beyond plen
  host_sends(&ch, sizeof ch);
  expect_term(kFesInvalidHeader, 2);
}

TEST_F(TcpConnectionTest, APduLargerThanTheTransportTakesIsRefusedBeforeItIsRead) {
  CommonHeader ch{kIcReq, 0, sizeof(IcReq), 0, 16u << 20};  // 16 MiB: beyond any limit here
  host_sends(&ch, sizeof ch);
  expect_term(kFesInvalidHeader, 4);  // PLEN
}

}  // namespace
}  // namespace dpukv::nvme
