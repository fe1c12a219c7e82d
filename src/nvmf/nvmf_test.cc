// The NVMe/TCP target as a real process (`dpukv nvme target --transport tcp`)
// with this process (and forked children) as hosts over real TCP sockets:
// Connect and its refusals, Property Get/Set, I/O with in-capsule data, R2T and
// C2H, digests, malformed PDUs answered with termination requests while other
// hosts keep working, keep-alive expiry, a host killed mid-write.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/cache_engine.h"
#include "nvme/tcp_host.h"
#include "nvme/tcp_wire.h"
#include "nvme/vfio_user_driver.h"
#include "runtime/buf.h"
#include "runtime/child_process.h"
#include "runtime/log.h"
#include "runtime/mem_region.h"
#include "runtime/progress_engine.h"

extern char** environ;

namespace dpukv::nvme {
namespace {

using namespace tcp;

constexpr const char* kNqn = "nqn.2026-11.io.dpukv:test";
uint16_t sc(const Cqe& e) {
  return status_of_cqe(e.status);
}

class NvmfTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log_set_level(LogSource::kLib, LogLevel::kError);
    port_file_ = "/tmp/dpukv-nvmf-test-" + std::to_string(getpid()) + ".port";
    std::filesystem::remove(port_file_);
  }
  void TearDown() override {
    host_.reset();
    stop_target();
    std::filesystem::remove(port_file_);
  }
  void start_target(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {
        "--lib-log-level", "critical",    "nvme",     "target", "--transport", "tcp",    "--listen",
        "127.0.0.1:0",     "--port-file", port_file_, "--nqn",  kNqn,          "--size", "64M"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    std::string bin = DPUKV_BIN;
    argv.push_back(bin.data());
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ASSERT_EQ(posix_spawn(&target_, bin.c_str(), nullptr, nullptr, argv.data(), environ), 0);
    for (int i = 0; i < 500 && !std::filesystem::exists(port_file_); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::ifstream f(port_file_);
    f >> port_;
    ASSERT_GT(port_, 0);
  }
  void stop_target() {
    if (target_ <= 0) return;
    signal_child(target_, SIGTERM);
    int status = 0;
    waitpid(target_, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "target exit " << status;
    target_ = -1;
  }
  // A host that retries until the target takes it (a minute: a busy machine), then
  // reads a block.
  void connect_and_read_within_a_minute() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!NvmeTcpHost::connect(opts(), &host_).ok())
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the target never took a host";
    std::vector<uint8_t> buf(4096);
    EXPECT_EQ(sc(io(*host_, kNvmRead, 0, 1, buf.data())), kSuccess);
  }
  TcpHostOptions opts() {
    TcpHostOptions o;
    o.port = static_cast<uint16_t>(port_);
    o.subnqn = kNqn;
    return o;
  }
  Cqe io(NvmeTcpHost& h, uint8_t opc, uint64_t lba, uint32_t nlb, uint8_t* buf, uint32_t q = 0) {
    Sqe c{};
    c.opc = opc;
    c.cid = 5;
    c.nsid = 1;
    c.cdw10 = static_cast<uint32_t>(lba);
    c.cdw11 = static_cast<uint32_t>(lba >> 32);
    c.cdw12 = nlb - 1;
    uint32_t len = (opc == kNvmRead || opc == kNvmWrite) ? nlb * h.block_size(1) : 0;
    EXPECT_TRUE(h.submit(q, c, buf, len, opc == kNvmWrite).ok());
    Cqe e{};
    EXPECT_TRUE(h.wait_one(q, &e, 5000).ok());
    return e;
  }

 public:
  static std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
    std::vector<uint8_t> v(n);
    std::mt19937 rng(seed);
    for (auto& b : v) b = static_cast<uint8_t>(rng());
    return v;
  }

 protected:
  void write_read_verify(NvmeTcpHost& h, uint32_t blocks, uint64_t lba, uint32_t seed) {
    auto w = pattern(blocks * 4096ull, seed);
    std::vector<uint8_t> r(w.size());
    ASSERT_EQ(sc(io(h, kNvmWrite, lba, blocks, w.data())), kSuccess) << blocks;
    ASSERT_EQ(sc(io(h, kNvmRead, lba, blocks, r.data())), kSuccess) << blocks;
    EXPECT_EQ(std::memcmp(w.data(), r.data(), w.size()), 0) << blocks << " blocks";
  }

  std::string port_file_;
  int port_ = 0;
  pid_t target_ = -1;
  std::unique_ptr<NvmeTcpHost> host_;
};

// A TCP connection to the target's port, nothing sent; -1 on failure.
int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the peer closes fd within timeout_ms (generous: a busy machine).
bool closed_by_peer(int fd, int timeout_ms = 60000) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) != 1) return false;
  char b[64];
  return recv(fd, b, sizeof b, MSG_DONTWAIT) == 0;
}

// Issue 34.9: a connection that never sent its ICReq stayed forever (and a
// listener had no cap): 2,000 silent connections held 130 MiB of the target.
TEST_F(NvmfTest, ConnectionsWithoutAnIcReqAreClosedAtTheirDeadline) {
  start_target({"--icreq-timeout-ms", "300"});
  const int silent = raw_connect(port_);
  const int half = raw_connect(port_);  // half a PDU header, then nothing
  ASSERT_GE(silent, 0);
  ASSERT_GE(half, 0);
  const uint8_t part[8] = {tcp::kIcReq, 0, 128, 0, 128, 0, 0, 0};
  ASSERT_EQ(send(half, part, sizeof part, 0), static_cast<ssize_t>(sizeof part));
  EXPECT_TRUE(closed_by_peer(silent));
  EXPECT_TRUE(closed_by_peer(half));
  close(silent);
  close(half);
  // A host that sends its ICReq at once is served as before.
  ASSERT_TRUE(NvmeTcpHost::connect(opts(), &host_).ok());
  std::vector<uint8_t> buf(4096);
  EXPECT_EQ(sc(io(*host_, kNvmRead, 0, 1, buf.data())), kSuccess);
}

// Sends the capsule on a raw connection and expects a C2HTermReq with this status.
void expect_raw_termination(int fd, const CapsuleCmd& cc, uint16_t fes) {
  ASSERT_EQ(send(fd, &cc, sizeof cc, 0), static_cast<ssize_t>(sizeof cc));
  TermReq t{};
  ASSERT_EQ(recv(fd, &t, sizeof t, MSG_WAITALL), static_cast<ssize_t>(sizeof t));
  EXPECT_EQ(t.ch.type, kC2HTermReq);
  EXPECT_EQ(t.fes, fes);
}

// A TCP connection that has sent a valid ICReq and read the ICResp; -1 on failure.
int connect_after_icreq(int port) {
  const int fd = raw_connect(port);
  if (fd < 0) return -1;
  IcReq req{};
  req.ch = CommonHeader{kIcReq, 0, sizeof req, 0, sizeof req};
  IcResp resp{};
  if (send(fd, &req, sizeof req, 0) != static_cast<ssize_t>(sizeof req) ||
      recv(fd, &resp, sizeof resp, MSG_WAITALL) != static_cast<ssize_t>(sizeof resp) ||
      resp.ch.type != kIcResp) {
    close(fd);
    return -1;
  }
  return fd;
}

// Issue 45.3: after a valid ICReq, a host that went silent, or sent half a
// capsule, was kept forever (1,024 of them filled the listener), and a capsule
// header claiming 128 KiB made the target hold that much for it before the host
// had proved anything.
TEST_F(NvmfTest, EveryStageAfterTheIcReqHasADeadline) {
  start_target({"--connect-timeout-ms", "300", "--pdu-timeout-ms", "300"});
  const int silent = connect_after_icreq(port_);
  const int half = connect_after_icreq(port_);
  ASSERT_GE(silent, 0);
  ASSERT_GE(half, 0);
  // A Connect capsule's header (plen: header and its 1 KiB of data), then nothing.
  CapsuleCmd cc{};
  cc.ch = CommonHeader{kCapsuleCmd, 0, sizeof cc, sizeof cc, sizeof cc + 1024};
  cc.sqe.opc = kFabricsOpcode;
  ASSERT_EQ(send(half, &cc, sizeof cc, 0), static_cast<ssize_t>(sizeof cc));
  EXPECT_TRUE(closed_by_peer(silent)) << "a silent host after its ICReq was kept";
  EXPECT_TRUE(closed_by_peer(half)) << "half a capsule was waited for forever";
  close(silent);
  close(half);
  // Before its Connect a host gets no large buffer: a capsule claiming 128 KiB is
  // a header error at once.
  const int big = connect_after_icreq(port_);
  ASSERT_GE(big, 0);
  cc.ch = CommonHeader{kCapsuleCmd, 0, sizeof cc, sizeof cc, 128u << 10};
  expect_raw_termination(big, cc, kFesInvalidHeader);
  close(big);
  // A host that goes on at once is served as before, its I/O larger than 1 KiB.
  ASSERT_TRUE(NvmeTcpHost::connect(opts(), &host_).ok());
  write_read_verify(*host_, 32, 0, 45);
}

// Issue 45.4-5: KATO 0 kept a controller (4.8 MiB) forever; KATO 0xFFFFFFFF plus
// the grace wrapped in 32 bits and ended the association after 1.2 s.
TEST_F(NvmfTest, KatoZeroEndsWhenIdleAndTheLargestKatoDoesNotWrap) {
  start_target({"--no-kato-timeout-ms", "400"});
  TcpHostOptions huge = opts();
  huge.kato_ms = 0xFFFFFFFFu;
  std::unique_ptr<NvmeTcpHost> h;
  ASSERT_TRUE(NvmeTcpHost::connect(huge, &h).ok());
  TcpHostOptions none = opts();
  none.kato_ms = 0;
  ASSERT_TRUE(NvmeTcpHost::connect(none, &host_).ok());
  // Idle past the no-KATO limit and past the grace (1 s) the old sum wrapped to.
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  write_read_verify(*h, 1, 1, 1);  // the largest KATO keeps its association
  std::vector<uint8_t> b(4096);
  Sqe c{};
  c.opc = kNvmRead;
  c.cid = 1;
  c.nsid = 1;
  Cqe e;
  (void)host_->submit(0, c, b.data(), 4096, false);
  EXPECT_EQ(host_->wait_one(0, &e, 5000).code(), Code::kConnectionReset)
      << "an idle association with KATO 0 was kept";
}

TEST_F(NvmfTest, AListenerKeepsAtMostItsConnectionsAndServesWhenThereIsRoom) {
  start_target({"--max-connections", "4"});
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i) fds.push_back(raw_connect(port_));
  const int fifth = raw_connect(port_);
  ASSERT_GE(fifth, 0);
  EXPECT_TRUE(closed_by_peer(fifth)) << "a fifth connection was kept";
  close(fifth);
  // A host is told why (issue 45.8): FULL, not a bare reset that reads "no target there?".
  TcpHostOptions o = opts();
  o.timeout_ms = 3000;
  std::unique_ptr<NvmeTcpHost> refused;
  EXPECT_EQ(NvmeTcpHost::connect(o, &refused).code(), Code::kFull);
  for (int fd : fds) {
    ASSERT_GE(fd, 0);
    close(fd);
  }
  // Room again once the target has seen them go (a host retries as Linux's does).
  connect_and_read_within_a_minute();
}

// At the descriptor limit accept fails with EMFILE and leaves the listener
// readable: the poll group spun at 96 % and discovery and RPCs hung. Now the
// listener pauses, and the target serves again once descriptors are free.
TEST_F(NvmfTest, OutOfDescriptorsTheTargetDoesNotSpinAndRecovers) {
  rlimit was{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &was), 0);
  rlimit low = was;
  low.rlim_cur = 64;  // the target's; this process's limit is put back at once
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  start_target();
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &was), 0);
  std::vector<int> fds;
  for (int i = 0; i < 100; ++i) {
    const int fd = raw_connect(port_);  // the kernel queues what the target cannot take
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
  }
  auto cpu_ticks = [&] {
    std::ifstream f("/proc/" + std::to_string(target_) + "/stat");
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::istringstream in(s.substr(s.rfind(')') + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && in >> field; ++i) {
      if (i == 14) utime = std::stoull(field);
      if (i == 15) stime = std::stoull(field);
    }
    return utime + stime;
  };
  const auto t0 = std::chrono::steady_clock::now();
  const unsigned long long c0 = cpu_ticks();
  std::this_thread::sleep_for(std::chrono::seconds(2));  // a rate: CPU over wall time
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu =
      static_cast<double>(cpu_ticks() - c0) / static_cast<double>(sysconf(_SC_CLK_TCK));
  std::printf("target CPU while out of descriptors: %.3f of a core\n", cpu / wall);
  EXPECT_LT(cpu / wall, 0.3) << "the target spun at " << cpu / wall << " of a core";
  for (int fd : fds) close(fd);
  connect_and_read_within_a_minute();
}

// Issue 34.10: the host waited for ICResp with a blocking recv, so `dpukv nvme
// discover` against a port that accepts and says nothing (and an agent whose
// --nvme-tier named one) hung forever. Every wait now has the host's timeout.
TEST(NvmeTcpHost, APortThatNeverAnswersTimesOut) {
  const int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(l, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(listen(l, 16), 0);  // the kernel completes connections; nobody answers
  socklen_t len = sizeof sa;
  ASSERT_EQ(getsockname(l, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  TcpHostOptions o;
  o.port = ntohs(sa.sin_port);
  o.subnqn = kNqn;
  o.timeout_ms = 300;
  std::unique_ptr<NvmeTcpHost> h;
  EXPECT_EQ(NvmeTcpHost::connect(o, &h), Code::kTimeout);
  o.addr = "localhost";  // a name, resolved
  EXPECT_EQ(NvmeTcpHost::connect(o, &h), Code::kTimeout);
  o.addr = "no-such-host.invalid";
  EXPECT_EQ(NvmeTcpHost::connect(o, &h), Code::kNotFound);

  // The command line says which it was.
  auto run = [](const std::string& args) {
    std::string out;
    FILE* p = popen((std::string(DPUKV_BIN) + " nvme discover " + args + " 2>&1").c_str(), "r");
    char buf[512];
    while (p != nullptr && std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
    const int status = p != nullptr ? pclose(p) : -1;
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, out);
  };
  auto [rc, out] = run("--connect 127.0.0.1:" + std::to_string(o.port));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("no answer in time"), std::string::npos) << out;
  std::tie(rc, out) = run("--connect junk.invalid");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("cannot resolve 'junk.invalid'"), std::string::npos) << out;
  close(l);
}

TEST_F(NvmfTest, ConnectIdentifyAndIoOfEverySize) {
  start_target();
  ASSERT_TRUE(NvmeTcpHost::connect(opts(), &host_).ok());
  EXPECT_GE(host_->cntlid(), 1);
  EXPECT_EQ(host_->namespaces(), std::vector<uint32_t>{1});
  EXPECT_EQ(host_->block_size(1), 4096u);
  EXPECT_EQ(host_->in_capsule_bytes(), 8192u);
  EXPECT_EQ(host_->max_transfer(), 128u * 1024);
  uint8_t id[kIdentifySize];
  uint16_t st;
  ASSERT_TRUE(host_->identify(kCnsController, 0, id, &st).ok());
  EXPECT_EQ(std::string(reinterpret_cast<char*>(id + 768)), kNqn);
  uint32_t sgls;
  std::memcpy(&sgls, id + 536, 4);
  EXPECT_TRUE(sgls & 1);
  // 4 and 8 KiB writes travel in the capsule; 12 KiB and up by R2T/H2CData;
  // reads come back as C2HData.
  uint64_t lba = 0;
  for (uint32_t blocks : {1u, 2u, 3u, 16u, 32u}) {
    write_read_verify(*host_, blocks, lba, blocks);
    lba += blocks;
  }
  // Errors travel back in response capsules.
  std::vector<uint8_t> b(4096);
  EXPECT_EQ(sc(io(*host_, kNvmRead, host_->num_blocks(1), 1, b.data())), kLbaOutOfRange);
  Sqe c{};
  c.opc = kNvmRead;
  c.cid = 9;
  c.nsid = 7;
  c.cdw12 = 0;
  ASSERT_TRUE(host_->submit(0, c, b.data(), 4096, false).ok());
  Cqe e;
  ASSERT_TRUE(host_->wait_one(0, &e, 5000).ok());
  EXPECT_EQ(sc(e), kInvalidNamespace);
  EXPECT_EQ(sc(io(*host_, kNvmFlush, 0, 1, nullptr)), kSuccess);
  EXPECT_EQ(sc(io(*host_, kNvmWriteZeroes, 0, 1, nullptr)), kSuccess);
  std::vector<uint8_t> zero(4096), r(4096, 1);
  ASSERT_EQ(sc(io(*host_, kNvmRead, 0, 1, r.data())), kSuccess);
  EXPECT_EQ(r, zero);
}

TEST_F(NvmfTest, DigestsProtectHeadersAndData) {
  start_target();
  TcpHostOptions o = opts();
  o.header_digest = o.data_digest = true;
  ASSERT_TRUE(NvmeTcpHost::connect(o, &host_).ok());
  for (uint32_t blocks : {1u, 3u, 32u}) write_read_verify(*host_, blocks, 100 + blocks, 7 * blocks);
}

TEST_F(NvmfTest, PropertiesOverTheAdminQueue) {
  start_target();
  ASSERT_TRUE(NvmeTcpHost::connect(opts(), &host_).ok());
  uint64_t v = 0;
  uint16_t st = 0;
  ASSERT_TRUE(host_->property_get(kRegCap, 8, &v, &st).ok());
  EXPECT_EQ(st, kSuccess);
  EXPECT_EQ(v & 0xffff, 127u);  // MQES: queue depth 128
  ASSERT_TRUE(host_->property_get(kRegVs, 4, &v, &st).ok());
  EXPECT_EQ(v, 0x00010400u);
  ASSERT_TRUE(host_->property_get(kRegCsts, 4, &v, &st).ok());
  EXPECT_TRUE(v & kCstsRdy);
  ASSERT_TRUE(host_->property_set(kRegVs, 4, 0, &st).ok());
  EXPECT_EQ(st, kInvalidField);  // read-only
  ASSERT_TRUE(host_->property_get(kRegCap, 4, &v, &st).ok());
  EXPECT_EQ(st, kInvalidField);  // CAP is 8 bytes wide
  ASSERT_TRUE(host_->property_get(0x1000, 4, &v, &st).ok());
  EXPECT_EQ(st, kInvalidField);
}

TEST_F(NvmfTest, ConnectRefusals) {
  start_target({"--allow-host", "nqn.2026-11.io.dpukv:host-a"});
  TcpHostOptions o = opts();
  uint16_t st = 0;
  std::unique_ptr<NvmeTcpHost> h;
  o.hostnqn = "nqn.2026-11.io.dpukv:host-b";
  ASSERT_TRUE(NvmeTcpHost::connect_admin_only(o, &st, &h).ok());
  EXPECT_EQ(st, kConnectInvalidHost);
  o.hostnqn = "nqn.2026-11.io.dpukv:host-a";
  o.subnqn = "nqn.2026-11.io.dpukv:nonexistent";
  ASSERT_TRUE(NvmeTcpHost::connect_admin_only(o, &st, &h).ok());
  EXPECT_EQ(st, kConnectInvalidParameters);
  o.subnqn = kNqn;
  ASSERT_TRUE(NvmeTcpHost::connect(o, &host_).ok());
  write_read_verify(*host_, 2, 10, 3);
}

// Sends one malformed PDU on a fresh connection and expects a termination
// request with the given fatal error status; a second host keeps working.
class MalformedPdu : public NvmfTest {
 protected:
  void expect_termination(const std::vector<uint8_t>& pdu, uint16_t fes, bool after_icreq = true,
                          bool digests = false) {
    TcpHostOptions o = opts();
    o.header_digest = digests;
    std::unique_ptr<NvmeTcpHost> bad;
    uint16_t st = 0;
    if (after_icreq) {
      ASSERT_TRUE(NvmeTcpHost::connect_admin_only(o, &st, &bad).ok());
      ASSERT_EQ(st, kSuccess);
    }
    ASSERT_TRUE(bad->send_raw(NvmeTcpHost::kAdmin, pdu.data(), pdu.size()).ok());
    uint8_t type = 0;
    uint16_t got = 0;
    ASSERT_TRUE(bad->recv_pdu(NvmeTcpHost::kAdmin, &type, &got, 3000).ok());
    EXPECT_EQ(type, kC2HTermReq);
    EXPECT_EQ(got, fes);
    write_read_verify(*host_, 1, 42, fes);  // the good host is unaffected
  }
};

TEST_F(MalformedPdu, EachGetsTheRightTermination) {
  start_target();
  ASSERT_TRUE(NvmeTcpHost::connect(opts(), &host_).ok());
  // Unknown PDU type.
  CommonHeader bad_type{0x0f, 0, 8, 0, 8};
  std::vector<uint8_t> p(sizeof bad_type);
  std::memcpy(p.data(), &bad_type, sizeof bad_type);
  expect_termination(p, kFesInvalidHeader);
  // A capsule with the wrong header length.
  CapsuleCmd cc{};
  cc.ch = CommonHeader{kCapsuleCmd, 0, 70, 0, sizeof cc};
  p.assign(sizeof cc, 0);
  std::memcpy(p.data(), &cc, sizeof cc);
  expect_termination(p, kFesInvalidHeader);
  // plen beyond any PDU the target accepts.
  cc.ch = CommonHeader{kCapsuleCmd, 0, 72, 0, 64u << 20};
  std::memcpy(p.data(), &cc, sizeof cc);
  expect_termination(p, kFesInvalidHeader);
  // H2CData for a transfer tag with no R2T outstanding.
  DataHeader d{};
  d.ch = CommonHeader{kH2CData, kFlagLastPdu, sizeof d, sizeof d, sizeof d + 16};
  d.ttag = 3;
  d.datal = 16;
  p.assign(sizeof d + 16, 0xab);
  std::memcpy(p.data(), &d, sizeof d);
  expect_termination(p, kFesPduSequence);
  // A second ICReq.
  IcReq ic{};
  ic.ch = CommonHeader{kIcReq, 0, 128, 0, 128};
  p.assign(128, 0);
  std::memcpy(p.data(), &ic, sizeof ic);
  expect_termination(p, kFesPduSequence);
  // A header digest that does not match.
  cc = CapsuleCmd{};
  cc.ch = CommonHeader{kCapsuleCmd, kFlagHdgst, 72, 0, 76};
  cc.sqe.opc = kAdminKeepAlive;
  p.assign(76, 0);
  std::memcpy(p.data(), &cc, sizeof cc);
  expect_termination(p, kFesHeaderDigest, true, true);
}

TEST_F(MalformedPdu, DataBeyondTheR2TAndBeforeIcReq) {
  start_target();
  ASSERT_TRUE(NvmeTcpHost::connect(opts(), &host_).ok());
  // Before ICReq: a capsule is a sequence error.
  {
    const int fd = raw_connect(port_);
    ASSERT_GE(fd, 0);
    CapsuleCmd cc{};
    cc.ch = CommonHeader{kCapsuleCmd, 0, 72, 0, 72};
    expect_raw_termination(fd, cc, kFesPduSequence);
    close(fd);
  }
  // An R2T for 16 KiB, then H2CData claiming bytes past it.
  TcpHostOptions o = opts();
  std::unique_ptr<NvmeTcpHost> bad;
  ASSERT_TRUE(NvmeTcpHost::connect(o, &bad).ok());
  Sqe c{};
  c.opc = kNvmWrite;
  c.cid = 1;
  c.nsid = 1;
  c.cdw12 = 3;
  c.flags = 0x40;
  SglDescriptor sgl{0, 16384, {}, kSglTransportDataBlock};
  std::memcpy(reinterpret_cast<uint8_t*>(&c) + 24, &sgl, sizeof sgl);
  CapsuleCmd cc{CommonHeader{kCapsuleCmd, 0, 72, 0, 72}, c};
  ASSERT_TRUE(bad->send_raw(0, &cc, sizeof cc).ok());
  uint8_t type;
  uint16_t fes;
  ASSERT_TRUE(bad->recv_pdu(0, &type, &fes, 3000).ok());
  ASSERT_EQ(type, kR2T);
  DataHeader d{};
  d.ch = CommonHeader{kH2CData, kFlagLastPdu, sizeof d, sizeof d, sizeof d + 4096};
  d.cccid = 1;
  d.ttag = 0;  // first slot
  d.datao = 16384 - 1024;
  d.datal = 4096;
  std::vector<uint8_t> p(sizeof d + 4096, 0);
  std::memcpy(p.data(), &d, sizeof d);
  ASSERT_TRUE(bad->send_raw(0, p.data(), p.size()).ok());
  ASSERT_TRUE(bad->recv_pdu(0, &type, &fes, 3000).ok());
  EXPECT_EQ(type, kC2HTermReq);
  EXPECT_TRUE(fes == kFesDataOutOfRange) << fes;
  write_read_verify(*host_, 4, 50, 11);
}

TEST_F(NvmfTest, DataDigestErrorFailsOnlyTheCommand) {
  start_target();
  TcpHostOptions o = opts();
  o.data_digest = true;
  ASSERT_TRUE(NvmeTcpHost::connect(o, &host_).ok());
  // An in-capsule write whose data digest is wrong.
  std::vector<uint8_t> pdu(72 + 4096 + 4, 0x11);
  Sqe c{};
  c.opc = kNvmWrite;
  c.cid = 2;
  c.nsid = 1;
  c.flags = 0x40;
  SglDescriptor sgl{0, 4096, {}, kSglDataBlockOffset};
  std::memcpy(reinterpret_cast<uint8_t*>(&c) + 24, &sgl, sizeof sgl);
  CapsuleCmd cc{CommonHeader{kCapsuleCmd, kFlagDdgst, 72, 72, static_cast<uint32_t>(pdu.size())},
                c};
  std::memcpy(pdu.data(), &cc, sizeof cc);
  ASSERT_TRUE(host_->send_raw(0, pdu.data(), pdu.size()).ok());
  Cqe e;
  ASSERT_TRUE(host_->wait_one(0, &e, 3000).ok());
  EXPECT_EQ(sc(e), kTransientTransportError);
  write_read_verify(*host_, 1, 0, 5);  // the connection goes on
}

TEST_F(NvmfTest, KeepAliveTimeoutEndsTheAssociation) {
  start_target();
  TcpHostOptions o = opts();
  o.kato_ms = 300;
  ASSERT_TRUE(NvmeTcpHost::connect(o, &host_).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));  // no Keep Alive sent
  Cqe e;
  std::vector<uint8_t> b(4096);
  Sqe c{};
  c.opc = kNvmRead;
  c.cid = 1;
  c.nsid = 1;
  (void)host_->submit(0, c, b.data(), 4096, false);
  EXPECT_EQ(host_->wait_one(0, &e, 2000).code(), Code::kConnectionReset);
  // A host that keeps the association alive keeps it.
  std::unique_ptr<NvmeTcpHost> h2;
  ASSERT_TRUE(NvmeTcpHost::connect(o, &h2).ok());
  for (int i = 0; i < 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    Sqe k{};
    k.opc = kAdminKeepAlive;
    ASSERT_TRUE(h2->admin(k, &e).ok());
    EXPECT_EQ(sc(e), kSuccess);
  }
  write_read_verify(*h2, 1, 3, 3);
}

// SPDK's host adopts the KATO Get Features reports and then sends no Keep Alive
// while I/O flows: the KATO in force is reported (the Connect's), TBKAS says any
// command keeps the association, and I/O on an I/O queue alone does.
TEST_F(NvmfTest, KatoInForceIsReportedAndIoKeepsTheAssociation) {
  start_target();
  TcpHostOptions o = opts();
  o.kato_ms = 300;
  ASSERT_TRUE(NvmeTcpHost::connect(o, &host_).ok());
  Cqe e;
  Sqe g{};
  g.opc = kAdminGetFeatures;
  g.cdw10 = kFeatKeepAlive;
  ASSERT_TRUE(host_->admin(g, &e).ok());
  EXPECT_EQ(sc(e), kSuccess);
  EXPECT_EQ(e.dw0, 300u);
  uint8_t id[kIdentifySize];
  uint16_t st = 0;
  ASSERT_TRUE(host_->identify(kCnsController, 0, id, &st).ok());
  EXPECT_NE(id[96] & (1u << 6), 0u) << "CTRATT: traffic-based keep alive";
  // I/O only, past the KATO and the target's grace (300 + 1000 ms), twice over.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2600);
  for (uint32_t i = 0; std::chrono::steady_clock::now() < until; ++i)
    write_read_verify(*host_, 1, i % 8, i);
  Sqe k{};
  k.opc = kAdminKeepAlive;
  ASSERT_TRUE(host_->admin(k, &e).ok());
  EXPECT_EQ(sc(e), kSuccess);
  // Set Features changes the KATO in force (0: none).
  Sqe f{};
  f.opc = kAdminSetFeatures;
  f.cdw10 = kFeatKeepAlive;
  f.cdw11 = 0;
  ASSERT_TRUE(host_->admin(f, &e).ok());
  ASSERT_TRUE(host_->admin(g, &e).ok());
  EXPECT_EQ(e.dw0, 0u);
}

// What SPDK's compliance suite checks of the admin command set: Identify
// Namespace of NSID FFFFFFFFh without namespace management, Number of Queues
// granting SQs and CQs apart, Host Behavior Support kept and read back.
TEST_F(NvmfTest, AdminCommandsAsTheComplianceSuiteChecksThem) {
  start_target();
  ASSERT_TRUE(NvmeTcpHost::connect(opts(), &host_).ok());
  uint8_t id[kIdentifySize];
  uint16_t st = 0;
  ASSERT_TRUE(host_->identify(kCnsNamespace, kNsidAll, id, &st).ok());
  EXPECT_EQ(st, kInvalidNamespace);
  ASSERT_TRUE(host_->identify(kCnsNamespace, 1, id, &st).ok());
  EXPECT_EQ(st, kSuccess);
  Cqe e;
  Sqe nq{};
  nq.opc = kAdminSetFeatures;
  nq.cdw10 = kFeatNumQueues;
  nq.cdw11 = 3u | 1u << 16;  // 4 SQs, 2 CQs (0's based)
  ASSERT_TRUE(host_->admin(nq, &e).ok());
  EXPECT_EQ(sc(e), kSuccess);
  EXPECT_EQ(e.dw0, 3u | 1u << 16) << "each count granted as asked";
  nq.cdw11 = 1000u | 1000u << 16;  // beyond the limit: the limit (8 I/O queues)
  ASSERT_TRUE(host_->admin(nq, &e).ok());
  EXPECT_EQ(e.dw0, 7u | 7u << 16);
  Sqe gq{};
  gq.opc = kAdminGetFeatures;
  gq.cdw10 = kFeatNumQueues;
  ASSERT_TRUE(host_->admin(gq, &e).ok());
  EXPECT_EQ(e.dw0, 7u | 7u << 16);

  std::vector<uint8_t> hb(512, 0), back(512, 0xee);
  hb[0] = 1;  // ACRE
  Sqe sh{};
  sh.opc = kAdminSetFeatures;
  sh.cdw10 = kFeatHostBehavior;
  ASSERT_TRUE(host_->admin(sh, &e, hb.data(), 512, false).ok());
  EXPECT_EQ(sc(e), kSuccess);
  Sqe gh{};
  gh.opc = kAdminGetFeatures;
  gh.cdw10 = kFeatHostBehavior;
  ASSERT_TRUE(host_->admin(gh, &e, back.data(), 512, true).ok());
  EXPECT_EQ(sc(e), kSuccess);
  EXPECT_EQ(back, hb);
  hb[1] = 2;  // ETDAS is 0 or 1
  ASSERT_TRUE(host_->admin(sh, &e, hb.data(), 512, false).ok());
  EXPECT_EQ(sc(e), kInvalidField);
  ASSERT_TRUE(host_->admin(gh, &e, back.data(), 512, true).ok());
  EXPECT_EQ(back[0], 1) << "a refused Set Features leaves the value as it was";
  EXPECT_EQ(back[1], 0);
}

// The discovery subsystem answers on the target's listener: a discovery
// controller (CNTRLTYPE 2, no I/O queues) whose log lists the subsystem's
// address as nvme-cli and SPDK read it.
TEST_F(NvmfTest, DiscoveryLogListsTheSubsystemsAddress) {
  start_target();
  uint64_t genctr = 0;
  std::vector<DiscoveryEntry> entries;
  ASSERT_TRUE(NvmeTcpHost::discover(opts(), &genctr, &entries).ok());
  ASSERT_EQ(entries.size(), 1u);
  const DiscoveryEntry& e = entries[0];
  EXPECT_EQ(e.trtype, 3);   // TCP
  EXPECT_EQ(e.adrfam, 1);   // IPv4
  EXPECT_EQ(e.subtype, 2);  // NVM subsystem
  EXPECT_EQ(e.cntlid, 0xffff);
  EXPECT_EQ(e.sectype, 0) << "no TLS on this listener";
  EXPECT_EQ(e.subnqn, kNqn);
  EXPECT_EQ(e.traddr, "127.0.0.1");
  EXPECT_EQ(e.trsvcid, std::to_string(port_));
  EXPECT_GT(genctr, 0u);
  // A discovery controller has no I/O queues to connect.
  TcpHostOptions d = opts();
  d.subnqn = kDiscoveryNqn;
  EXPECT_FALSE(NvmeTcpHost::connect(d, &host_).ok());
  // And the subsystem still serves I/O through the same listener.
  ASSERT_TRUE(NvmeTcpHost::connect(opts(), &host_).ok());
  write_read_verify(*host_, 2, 40, 7);
}

TEST_F(NvmfTest, SeveralHostsSeveralQueues) {
  start_target();
  TcpHostOptions o = opts();
  o.io_queues = 2;
  std::unique_ptr<NvmeTcpHost> a, b;
  ASSERT_TRUE(NvmeTcpHost::connect(o, &a).ok());
  o.hostnqn = "nqn.2026-11.io.dpukv:second";
  ASSERT_TRUE(NvmeTcpHost::connect(o, &b).ok());
  EXPECT_NE(a->cntlid(), b->cntlid());
  std::thread ta([&] {
    for (int i = 0; i < 50; ++i)
      write_read_verify(*a, 2, 1000 + (i % 2) * 10, static_cast<uint32_t>(i));
  });
  for (int i = 0; i < 50; ++i) {
    auto w = pattern(8192, 900 + i);
    std::vector<uint8_t> r(8192);
    ASSERT_EQ(sc(io(*b, kNvmWrite, 2000, 2, w.data(), 1)), kSuccess);
    ASSERT_EQ(sc(io(*b, kNvmRead, 2000, 2, r.data(), 1)), kSuccess);
    ASSERT_EQ(w, r);
  }
  ta.join();
}

// A host killed while writing: every write it saw acknowledged is on the medium
// whole; the target goes on serving.
TEST_F(NvmfTest, HostKilledMidWrite) {
  start_target();
  auto* acked = static_cast<uint32_t*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(acked, MAP_FAILED);
  pid_t child = fork();
  if (child == 0) {
    std::unique_ptr<NvmeTcpHost> h;
    if (!NvmeTcpHost::connect(opts(), &h).ok()) _exit(3);
    std::vector<std::vector<uint8_t>> bufs;
    for (uint32_t i = 0; i < 16; ++i) bufs.push_back(pattern(64 * 1024, 1000 + i));
    for (uint32_t i = 0;; ++i) {  // 64 KiB writes (R2T), 8 in flight, slot i % 16
      uint32_t slot = i % 16;
      Sqe c{};
      c.opc = kNvmWrite;
      c.cid = static_cast<uint16_t>(slot);
      c.nsid = 1;
      c.cdw10 = slot * 16;
      c.cdw12 = 15;
      if (!h->submit(0, c, bufs[slot].data(), 65536, true).ok()) _exit(4);
      if (i >= 7) {
        Cqe e;
        if (!h->wait_one(0, &e, 5000).ok()) _exit(5);
        if (status_of_cqe(e.status) == kSuccess) {
          __atomic_store_n(&acked[e.cid], 1u, __ATOMIC_RELEASE);
          __atomic_add_fetch(&acked[16], 1u, __ATOMIC_RELEASE);  // acknowledged so far
        }
      }
    }
  }
  // Killed mid-stream: once 64 writes are acknowledged (a condition, not a time:
  // a busy machine only makes it come later), with 8 more in flight.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (__atomic_load_n(&acked[16], __ATOMIC_ACQUIRE) < 64 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_GE(__atomic_load_n(&acked[16], __ATOMIC_ACQUIRE), 64u) << "the host acknowledged too few";
  ASSERT_TRUE(signal_child(child, SIGKILL));
  reap_child(child, nullptr);
  ASSERT_TRUE(NvmeTcpHost::connect(opts(), &host_).ok());
  int verified = 0;
  for (uint32_t slot = 0; slot < 16; ++slot) {
    if (!acked[slot]) continue;
    std::vector<uint8_t> r(65536);
    ASSERT_EQ(sc(io(*host_, kNvmRead, slot * 16, 16, r.data())), kSuccess);
    EXPECT_EQ(r, pattern(65536, 1000 + slot)) << "slot " << slot;
    ++verified;
  }
  EXPECT_GT(verified, 0);
  munmap(acked, 4096);
}

// The cache engine's NVMe tier: chunks the memory tier lets go are written to a
// namespace of an NVMe/TCP target (a separate process) and reloaded from it.
TEST_F(NvmfTest, CacheEngineSpillsToAnNvmeTier) {
  start_target();
  std::string dir = "/tmp/dpukv-nvme-tier-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::unique_ptr<ProgressEngine> pe;
  ASSERT_TRUE(ProgressEngine::create(&pe).ok());
  CacheOptions co;
  co.memory_bytes = 4u << 20;  // four 1 MiB chunks
  co.max_chunk_bytes = 1u << 20;
  co.max_chunks = 256;
  co.max_requests = 16;
  co.disk_dir = dir;
  co.disk_bytes = 32u << 20;
  co.nvme_address = "127.0.0.1:" + std::to_string(port_);
  co.nvme_nqn = kNqn;
  std::unique_ptr<CacheEngine> cache;
  ASSERT_TRUE(CacheEngine::create(pe.get(), co, &cache).ok());
  ASSERT_TRUE(cache->start().ok());
  std::unique_ptr<MemRegion> mem;
  ASSERT_TRUE(MemRegion::create(2u << 20, MemRegionOptions{}, &mem).ok());
  std::unique_ptr<Mmap> map;
  ASSERT_TRUE(
      Mmap::create(mem->data(), mem->size(), kAccessLocalReadWrite, mem->fd(), 0, &map).ok());
  ASSERT_TRUE(map->start().ok());
  std::unique_ptr<BufInventory> inv;
  ASSERT_TRUE(BufInventory::create(8, &inv).ok());
  auto* staging = static_cast<uint8_t*>(mem->data());
  auto wait = [&](Status* st) {
    for (int i = 0; *st == Code::kInProgress && i < 50'000'000; ++i) pe->progress();
    return *st;
  };
  auto done = [](void* arg, Status st) { *static_cast<Status*>(arg) = st; };
  auto key = [](uint64_t i) { return key_from_block_id(KeyContext{7, 1, 0, 3}, i); };
  for (uint32_t i = 0; i < 16; ++i) {
    auto w = pattern(1u << 20, 500 + i);
    std::memcpy(staging, w.data(), w.size());
    Buf* b;
    ASSERT_TRUE(inv->get_by_data(map.get(), staging, w.size(), &b).ok());
    Status st = Code::kInProgress;
    ASSERT_TRUE(cache->store(key(i), b, done, &st).ok());
    ASSERT_TRUE(wait(&st).ok()) << "store " << i;
    (void)b->dec_refcount();
  }
  for (uint32_t i = 0; i < 16; ++i) {
    Buf* b;
    ASSERT_TRUE(inv->get_by_addr(map.get(), staging, 2u << 20, &b).ok());
    Status st = Code::kInProgress;
    ASSERT_TRUE(cache->retrieve(key(i), b, done, &st).ok());
    ASSERT_TRUE(wait(&st).ok()) << "retrieve " << i;
    EXPECT_EQ(b->data_len(), 1u << 20);
    EXPECT_EQ(std::memcmp(staging, pattern(1u << 20, 500 + i).data(), 1u << 20), 0)
        << "chunk " << i;
    (void)b->dec_refcount();
  }
  CacheStats s = cache->stats();
  EXPECT_GE(s.spills, 12u);
  EXPECT_GE(s.reloads, 1u);
  EXPECT_EQ(s.checksum_failures, 0u);
  EXPECT_EQ(s.io_errors, 0u);
  (void)cache->stop();
  while (cache->state() != CtxState::kIdle) pe->progress();
  cache.reset();
  (void)map->stop();
  std::filesystem::remove_all(dir);
}

// `dpukv nvme` (the target application) from a JSON config, and its JSON-RPC
// answers through `dpukv rpc`, as an operator would ask.
pid_t spawn_app(const std::string& dir) {
  std::vector<std::string> args = {
      "--lib-log-level", "critical",          "nvme", "-r", dir + "/rpc.sock",
      "--config",        dir + "/config.json"};
  std::vector<char*> argv;
  std::string bin = DPUKV_BIN;
  argv.push_back(bin.data());
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t app = -1;
  EXPECT_EQ(posix_spawn(&app, bin.c_str(), nullptr, nullptr, argv.data(), environ), 0);
  return app;
}

// Writes dir/config.json (the bdev given as its create method, a subsystem with it
// as namespace 1, a TCP listener on 127.0.0.1:port and, if asked, a vfio-user one
// at dir/fn) and starts `dpukv nvme` on it.
pid_t start_app(const std::string& dir, const std::string& nqn, int port,
                const nlohmann::json& bdev_create, bool vfio_user) {
  using J = nlohmann::json;
  auto call = [](const char* method, J params) {
    return J{{"method", method}, {"params", std::move(params)}};
  };
  J nvmf = J::array();
  nvmf.push_back(call("nvmf_create_transport", {{"trtype", "TCP"}}));
  if (vfio_user) nvmf.push_back(call("nvmf_create_transport", {{"trtype", "VFIOUSER"}}));
  nvmf.push_back(call("nvmf_create_subsystem", {{"nqn", nqn}, {"allow_any_host", true}}));
  nvmf.push_back(
      call("nvmf_subsystem_add_ns",
           {{"nqn", nqn}, {"namespace", {{"bdev_name", bdev_create["params"]["name"]}}}}));
  nvmf.push_back(
      call("nvmf_subsystem_add_listener",
           {{"nqn", nqn},
            {"listen_address",
             {{"trtype", "TCP"}, {"traddr", "127.0.0.1"}, {"trsvcid", std::to_string(port)}}}}));
  if (vfio_user)
    nvmf.push_back(call(
        "nvmf_subsystem_add_listener",
        {{"nqn", nqn}, {"listen_address", {{"trtype", "VFIOUSER"}, {"traddr", dir + "/fn"}}}}));
  J subsystems = J::array();
  subsystems.push_back(J{{"subsystem", "bdev"}, {"config", J::array({bdev_create})}});
  subsystems.push_back(J{{"subsystem", "nvmf"}, {"config", nvmf}});
  std::ofstream(dir + "/config.json") << J{{"subsystems", subsystems}}.dump();
  return spawn_app(dir);
}

nlohmann::json rpc_result(const std::string& dir, const std::string& method) {
  std::string cmd = std::string(DPUKV_BIN) + " rpc -s " + dir + "/rpc.sock " + method;
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; f != nullptr && (n = fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  if (f != nullptr) pclose(f);
  return nlohmann::json::parse(out, nullptr, false);
}

void stop_app(pid_t app) {
  signal_child(app, SIGTERM);
  int status = 0;
  waitpid(app, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "app exit " << status;
}

// The target application (`dpukv nvme` from a JSON config): a KV-cache namespace
// exported over NVMe/TCP and, through a vfio-user function, as an emulated PCIe
// device; what a host writes over TCP reads back over PCIe (one namespace set).
TEST(NvmfApp, KvNamespaceSharedByTcpAndVfioUser) {
  log_set_level(LogSource::kLib, LogLevel::kError);
  std::string dir = "/tmp/dpukv-nvmf-app-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  int port = 20000 + (getpid() + 13) % 12000;  // below the ephemeral ports (32768-)
  std::string nqn = "nqn.2026-11.io.dpukv:kv";
  pid_t app = start_app(
      dir, nqn, port,
      {{"method", "bdev_kv_create"},
       {"params",
        {{"name", "Kv0"}, {"num_blocks", 8192}, {"chunk_size", 65536}, {"memory_size", 16777216}}}},
      true);
  ASSERT_GT(app, 0);
  TcpHostOptions o;
  o.port = static_cast<uint16_t>(port);
  o.subnqn = nqn;
  std::unique_ptr<NvmeTcpHost> h;
  ASSERT_TRUE(NvmeTcpHost::connect(o, &h).ok());
  EXPECT_EQ(h->num_blocks(1), 8192u);
  std::vector<std::vector<uint8_t>> chunks;
  for (uint32_t i = 0; i < 8;
       ++i) {  // 64 KiB writes, chunk aligned, and one 12 KiB write across a boundary
    chunks.push_back(NvmfTest::pattern(65536, 50 + i));
    Sqe c{};
    c.opc = kNvmWrite;
    c.cid = 1;
    c.nsid = 1;
    c.cdw10 = i * 16;
    c.cdw12 = 15;
    ASSERT_TRUE(h->submit(0, c, chunks.back().data(), 65536, true).ok());
    Cqe e;
    ASSERT_TRUE(h->wait_one(0, &e, 5000).ok());
    ASSERT_EQ(sc(e), kSuccess);
  }
  std::unique_ptr<VfioUserDriver> d;
  DriverOptions dopt;
  dopt.memory_bytes = 16u << 20;
  ASSERT_TRUE(VfioUserDriver::attach(dir + "/fn/cntrl", dopt, &d).ok());
  DmaBuffer b;
  ASSERT_TRUE(d->alloc(65536, &b).ok());
  for (uint32_t i = 0; i < 8; ++i) {
    Sqe c{};
    c.opc = kNvmRead;
    c.cid = 2;
    c.nsid = 1;
    c.cdw10 = i * 16;
    c.cdw12 = 15;
    ASSERT_TRUE(d->submit(0, c, &b, 65536, nullptr).ok());
    Cqe e;
    ASSERT_TRUE(d->wait_one(0, &e, 5000).ok());
    ASSERT_EQ(sc(e), kSuccess);
    EXPECT_EQ(std::memcmp(b.host, chunks[i].data(), 65536), 0) << "chunk " << i;
  }
  d.reset();
  h.reset();
  stop_app(app);
  std::filesystem::remove_all(dir);
}

// A host that leaves cleanly with its Asynchronous Event Requests outstanding
// (SPDK's host keeps 4) leaves nothing behind: no controller in the subsystem,
// no connection in the stats, and a later host gets the same service.
TEST(NvmfApp, HostsLeaveNothingBehindAndDiscoveryFollowsTheConfig) {
  log_set_level(LogSource::kLib, LogLevel::kError);
  std::string dir = "/tmp/dpukv-nvmf-aer-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  int port = 20000 + (getpid() + 29) % 12000;
  std::string nqn = "nqn.2026-11.io.dpukv:aer";
  pid_t app = start_app(dir, nqn, port,
                        {{"method", "bdev_malloc_create"},
                         {"params", {{"name", "M0"}, {"num_blocks", 4096}, {"block_size", 4096}}}},
                        false);
  ASSERT_GT(app, 0);
  TcpHostOptions o;
  o.port = static_cast<uint16_t>(port);
  o.subnqn = nqn;
  o.io_queues = 2;
  auto controllers = [&] {
    nlohmann::json r = rpc_result(dir, "nvmf_get_subsystems");
    return r.is_array() && r.size() == 1 ? r[0].value("controllers", -1) : -1;
  };
  auto active_connections = [&] {
    nlohmann::json r = rpc_result(dir, "nvmf_get_stats");
    if (!r.is_object()) return -1;
    return r["poll_groups"][0]["transports"][0].value("active_connections", -1);
  };
  for (int round = 0; round < 2; ++round) {
    std::unique_ptr<NvmeTcpHost> h;
    ASSERT_TRUE(NvmeTcpHost::connect(o, &h).ok());
    for (uint16_t i = 0; i < 4; ++i) {
      Sqe a{};
      a.opc = kAdminAsyncEvent;
      a.cid = static_cast<uint16_t>(100 + i);
      ASSERT_TRUE(h->submit(NvmeTcpHost::kAdmin, a, nullptr, 0, false).ok());
    }
    ASSERT_TRUE(h->flush_queue(NvmeTcpHost::kAdmin).ok());
    EXPECT_EQ(controllers(), 1);
    EXPECT_EQ(active_connections(), 3);
    // A clean leave, as SPDK's host does it: shutdown notification, then close.
    uint16_t st = 0;
    ASSERT_TRUE(h->property_set(kRegCc, 4, 0x00460001u | 1u << 14, &st).ok());
    h.reset();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while ((controllers() != 0 || active_connections() != 0) &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(controllers(), 0) << "round " << round;
    EXPECT_EQ(active_connections(), 0) << "round " << round;
  }
  // The discovery log follows the configuration: a second listener is a second
  // record under a new generation counter.
  uint64_t gen0 = 0, gen1 = 0;
  std::vector<DiscoveryEntry> before, after;
  ASSERT_TRUE(NvmeTcpHost::discover(o, &gen0, &before).ok());
  ASSERT_EQ(before.size(), 1u);
  const int port2 = 20000 + (getpid() + 31) % 12000;
  nlohmann::json added =
      rpc_result(dir, "nvmf_subsystem_add_listener nqn=" + nqn +
                          " listen_address.trtype=TCP listen_address.traddr=127.0.0.1"
                          " listen_address.trsvcid='\"" +
                          std::to_string(port2) + "\"'");
  EXPECT_EQ(added, true) << added.dump();
  ASSERT_TRUE(NvmeTcpHost::discover(o, &gen1, &after).ok());
  EXPECT_GT(gen1, gen0);
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[1].trsvcid, std::to_string(port2));
  EXPECT_EQ(after[1].subnqn, nqn);
  stop_app(app);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dpukv::nvme
