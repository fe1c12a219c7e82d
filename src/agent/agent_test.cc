// The agent as a real process, with real client processes (tests/client_peer.cc)
// and this process as one more client.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/agent.h"
#include "agent/agent_settings.h"
#include "client/client.h"
#include "protocol/agent_wire.h"
#include "protocol/socket_path.h"
#include "runtime/child_process.h"
#include "runtime/log.h"

extern char** environ;

namespace dpukv {
namespace {

pid_t spawn(const std::string& bin, const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(bin.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, bin.c_str(), nullptr, nullptr, argv.data(), environ), 0);
  return pid;
}

int wait_exit(pid_t pid, int timeout_s = 60) {
  if (pid <= 0) return -1;  // waitpid(-1) would reap any child
  for (int i = 0; i < timeout_s * 100; ++i) {
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  signal_child(pid, SIGKILL);
  reap_child(pid, nullptr);
  return -1;
}

// The status the agent answered a raw request with (UNKNOWN: no answer).
Code answered(Client* c, const std::vector<uint8_t>& msg) {
  std::vector<uint8_t> resp;
  EXPECT_TRUE(c->raw_request(msg.data(), static_cast<uint32_t>(msg.size()), &resp).ok());
  if (resp.size() < sizeof(agent::AgentHeader)) return Code::kUnknown;
  agent::AgentHeader r;
  std::memcpy(&r, resp.data(), sizeof(r));
  return static_cast<Code>(r.status);
}

int count_fds(pid_t pid) {
  int n = 0;
  DIR* d = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (!d) return -1;
  while (readdir(d)) ++n;
  closedir(d);
  return n;
}

int staging_mappings(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  int n = 0;
  while (std::getline(f, line)) n += line.find("dpukv-staging") != std::string::npos;
  return n;
}

// GET /metrics on 127.0.0.1:port; the whole answer, or "" if nobody answered.
std::string metrics_get(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string body;
  const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      send(fd, req, sizeof(req) - 1, 0) == static_cast<ssize_t>(sizeof(req) - 1)) {
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) body.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return body;
}

// Polls the agent's figures until every one of `all` is in them (a condition, not
// a time: up to a minute on a busy machine). False if they never are, or stats fail.
bool stats_reach(Client& c, std::initializer_list<const char*> all) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (std::string j; std::chrono::steady_clock::now() < end;
       std::this_thread::sleep_for(std::chrono::milliseconds(10))) {
    if (!c.stats_json(&j).ok()) return false;
    bool every = true;
    for (const char* s : all) every = every && j.find(s) != std::string::npos;
    if (every) return true;
  }
  return false;
}

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log_set_level(LogSource::kLib, LogLevel::kError);
    socket_ = "/tmp/dpukv-agent-test-" + std::to_string(getpid()) + ".sock";
    disk_ = "/tmp/dpukv-agent-test-disk-" + std::to_string(getpid());
    std::filesystem::remove_all(disk_);
  }
  void TearDown() override {
    stop_agent();
    std::filesystem::remove_all(disk_);
  }
  void start_agent(bool disk = false, int metrics_port = 0, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--log-level", "error", "agent",
                                     // Ends with this test even if it dies before
                                     // TearDown (a ctest timeout, a closed pipe).
                                     "--parent-pid", std::to_string(getpid()), "--socket", socket_,
                                     "--memory-bytes", "256M", "--max-chunk-size", "1M",
                                     "--metrics-port", std::to_string(metrics_port)};
    if (disk)
      args.insert(args.end(),
                  {"--local-disk", disk_, "--max-local-disk-size", "0.25", "--write-through"});
    args.insert(args.end(), extra.begin(), extra.end());
    agent_ = spawn(DPUKV_BIN, args);
    ASSERT_GT(agent_, 0) << "cannot start " << DPUKV_BIN;
    ClientOptions o;
    o.socket_path = socket_;
    o.connect_timeout_ms = 10000;
    ASSERT_TRUE(Client::connect(o, &probe_).ok()) << "agent did not come up";
    probe_.reset();
  }
  void stop_agent() {
    if (agent_ > 0) {
      signal_child(agent_, SIGTERM);
      EXPECT_EQ(wait_exit(agent_), 0) << "agent did not shut down cleanly";
      agent_ = -1;
    }
  }
  std::unique_ptr<Client> client(uint32_t reconnect_ms = 1000) {
    ClientOptions o;
    o.socket_path = socket_;
    o.connect_timeout_ms = 10000;
    o.reconnect_interval_ms = reconnect_ms;
    std::unique_ptr<Client> c;
    EXPECT_TRUE(Client::connect(o, &c).ok());
    return c;
  }
  std::string socket_, disk_;
  pid_t agent_ = -1;
  std::unique_ptr<Client> probe_;
};

// Issue 34.5: a client that searches for its agent took any socket it found, and
// another local user's agent there got the client's read-write staging memory.
TEST_F(AgentTest, ASearchedSocketOwnedByAnotherUserIsNotUsed) {
  if (::geteuid() != 0) GTEST_SKIP() << "planting another user's socket needs root (chown)";
  const std::string dir = "/tmp/dpukv-agent-test-xdg-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directory(dir);
  socket_ = dir + "/dpukv.sock";
  start_agent();
  ASSERT_EQ(::chown(socket_.c_str(), 65534, 65534), 0);  // as if user nobody's agent
  ::unsetenv("DPUKV_SOCKET");
  ::setenv("XDG_RUNTIME_DIR", dir.c_str(), 1);
  std::string why;
  EXPECT_FALSE(agent_socket_trusted(socket_, &why));
  EXPECT_NE(why.find("uid 65534"), std::string::npos) << why;
  EXPECT_NE(find_agent_socket(), socket_);

  ClientOptions o;  // no socket named: the client searches
  o.connect_timeout_ms = 2000;
  std::unique_ptr<Client> searched;
  EXPECT_FALSE(Client::connect(o, &searched).ok());
  auto clients = [&] {
    std::string j;
    EXPECT_TRUE(client()->stats_json(&j).ok());
    return j.find("\"clients\": 0") != std::string::npos ||
           j.find("\"clients\":0") != std::string::npos;
  };
  EXPECT_TRUE(clients()) << "the agent saw a session from the searching client";

  // A symbolic link is not taken either: its owner could point it elsewhere later.
  const std::string link = dir + "/link.sock";
  ASSERT_EQ(::symlink(socket_.c_str(), link.c_str()), 0);
  EXPECT_FALSE(agent_socket_trusted(link, &why));
  EXPECT_NE(why.find("symbolic link"), std::string::npos) << why;

  // The same socket owned by root: found and used.
  ASSERT_EQ(::chown(socket_.c_str(), 0, 0), 0);
  EXPECT_EQ(find_agent_socket(), socket_);
  ASSERT_TRUE(Client::connect(o, &searched).ok());
  EXPECT_TRUE(searched->connected());
  searched.reset();
  ::unsetenv("XDG_RUNTIME_DIR");
  stop_agent();
  std::filesystem::remove_all(dir);
}

TEST_F(AgentTest, ClientProcessesStoreAndRetrieveByteForByte) {
  start_agent();
  std::vector<pid_t> peers;
  for (int i = 1; i <= 3; ++i)
    peers.push_back(spawn(CLIENT_PEER_BIN, {socket_, "store-retrieve", std::to_string(i), "60"}));
  for (pid_t p : peers) EXPECT_EQ(wait_exit(p), 0);
  // This process sees what another process stored (same model, same keys).
  auto c = client();
  const KeyContext ctx{model_id("test-model"), 1, 0, 0};
  ChunkKey k = key_from_block_id(ctx, 2 * 1000000 + 5);
  EXPECT_EQ(c->lookup(&k, 1, false), 1u);
  Staging s;
  ASSERT_TRUE(c->alloc_staging(1 << 20, &s).ok());
  const uint64_t off = 0, len = 4096 + 5 * 7919 % 200000;
  Status st;
  ASSERT_TRUE(c->retrieve(s, &k, &off, &len, 1, &st).ok());
  EXPECT_EQ(s.data[100], static_cast<uint8_t>(((2 + 5) * 2654435761u) ^ (100 * 131) ^ (100 >> 9)));
  std::string stats;
  ASSERT_TRUE(c->stats_json(&stats).ok());
  EXPECT_NE(stats.find("\"stores\":180"), std::string::npos) << stats;
}

TEST_F(AgentTest, KilledClientIsReleasedAndAgentKeepsServing) {
  start_agent();
  // Let the agent close the start-up probe's connection before counting.
  int fds_before = -1;
  for (int i = 0; i < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const int n = count_fds(agent_);
    if (n == fds_before) break;
    fds_before = n;
  }
  pid_t p = spawn(CLIENT_PEER_BIN, {socket_, "stream", "9"});
  // Wait until it has exported memory and is storing.
  for (int i = 0; i < 500 && staging_mappings(agent_) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GT(staging_mappings(agent_), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(signal_child(p, SIGKILL));
  reap_child(p, nullptr);
  // The agent unmaps the dead client's memory and closes its socket.
  for (int i = 0; i < 500 && (staging_mappings(agent_) != 0 || count_fds(agent_) != fds_before);
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(staging_mappings(agent_), 0);
  EXPECT_EQ(count_fds(agent_), fds_before);
  // And serves the next client.
  EXPECT_EQ(wait_exit(spawn(CLIENT_PEER_BIN, {socket_, "store-retrieve", "4", "20"})), 0);
  auto c = client();
  std::string stats;
  ASSERT_TRUE(c->stats_json(&stats).ok());
  EXPECT_NE(stats.find("\"clients\":0,"), std::string::npos) << stats;
}

TEST_F(AgentTest, AgentDeathFailsFastThenClientReconnectsAndDiskTierIsBack) {
  start_agent(true);
  auto c = client(100);
  Staging s;
  ASSERT_TRUE(c->alloc_staging(8 << 20, &s).ok());
  const KeyContext ctx{model_id("m"), 1, 0, 0};
  std::vector<ChunkKey> keys;
  std::vector<uint64_t> offs, lens;
  for (uint32_t i = 0; i < 16; ++i) {
    keys.push_back(key_from_block_id(ctx, i));
    offs.push_back(i * (256 << 10));
    lens.push_back(256 << 10);
    for (uint64_t k = 0; k < (256 << 10); ++k)
      s.data[offs[i] + k] = static_cast<uint8_t>(i * 31 + k);
  }
  ASSERT_TRUE(c->store(s, keys.data(), offs.data(), lens.data(), 16, nullptr).ok());
  // Write-through reaches the disk: every chunk there, no write in flight.
  ASSERT_TRUE(stats_reach(*c, {"\"disk_chunks\":16,", "\"disk_ios_in_flight\":0,"}));
  ASSERT_TRUE(signal_child(agent_, SIGKILL));
  reap_child(agent_, nullptr);
  agent_ = -1;
  // Gone: lookup says recompute, operations fail at once (not after the op
  // timeout), and no entry reads SUCCESS.
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(c->lookup(keys.data(), 16, false), 0u);
  uint32_t hits = 99;
  EXPECT_EQ(c->lookup(keys.data(), 16, false, &hits), Code::kConnectionReset);
  EXPECT_EQ(hits, 99u);
  std::vector<Status> per(16, Code::kSuccess);
  Status call;
  Status st = c->retrieve(s, keys.data(), offs.data(), lens.data(), 16, per.data(), &call);
  EXPECT_EQ(st, Code::kConnectionReset);
  EXPECT_EQ(call, Code::kConnectionReset);
  for (Status x : per) EXPECT_EQ(x, Code::kConnectionReset);
  for (auto op : {&Client::contains, &Client::remove, &Client::prefetch}) {
    std::fill(per.begin(), per.end(), Status(Code::kSuccess));
    call = Code::kSuccess;
    EXPECT_EQ((c.get()->*op)(keys.data(), 16, per.data(), &call), Code::kConnectionReset);
    EXPECT_EQ(call, Code::kConnectionReset);
    for (Status x : per) EXPECT_EQ(x, Code::kConnectionReset);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));  // op timeout: 30 s
  start_agent(true);
  uint32_t found = 0;
  const auto back = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (found == 0 && std::chrono::steady_clock::now() < back) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    found = c->lookup(keys.data(), 16, false);
  }
  EXPECT_GT(found, 0u) << "disk tier not recovered or client did not reconnect";
  std::memset(s.data, 0, 8 << 20);
  std::vector<Status> sts(found);
  (void)c->retrieve(s, keys.data(), offs.data(), lens.data(), found, sts.data());
  for (uint32_t i = 0; i < found; ++i) {
    if (!sts[i].ok()) continue;  // a miss is allowed, wrong bytes are not
    for (uint64_t k = 0; k < (256 << 10); k += 997)
      ASSERT_EQ(s.data[offs[i] + k], static_cast<uint8_t>(i * 31 + k));
  }
}

// Issue 45.6: with --write-through, a burst of 40 stores of 1 MiB reached the disk
// with 29 (a store that found the 16 write-back slots taken skipped its write), and
// a kill -9 lost the rest. Every chunk must be back after the restart.
TEST_F(AgentTest, AWriteThroughBurstSurvivesKill9) {
  start_agent(true);
  auto c = client();
  const uint32_t n = 40;
  const uint64_t len = 1 << 20;
  Staging s;
  ASSERT_TRUE(c->alloc_staging(n * len, &s).ok());
  const KeyContext ctx{model_id("wt"), 1, 0, 0};
  std::vector<ChunkKey> keys;
  std::vector<uint64_t> offs, lens;
  for (uint32_t i = 0; i < n; ++i) {
    keys.push_back(key_from_block_id(ctx, i));
    offs.push_back(i * len);
    lens.push_back(len);
    for (uint64_t k = 0; k < len; ++k) s.data[offs[i] + k] = static_cast<uint8_t>(i * 7 + k / 3);
  }
  std::vector<Status> per(n);
  ASSERT_TRUE(c->store(s, keys.data(), offs.data(), lens.data(), n, per.data()).ok());
  for (uint32_t i = 0; i < n; ++i) ASSERT_TRUE(per[i].ok()) << i << " " << per[i].name();
  // Acknowledged, then written: wait until no disk write is in flight or queued.
  ASSERT_TRUE(stats_reach(*c, {"\"disk_ios_in_flight\":0,", "\"writes_waiting\":0,"}));
  ASSERT_TRUE(signal_child(agent_, SIGKILL));
  reap_child(agent_, nullptr);
  agent_ = -1;
  c.reset();
  start_agent(true);
  c = client();
  ASSERT_TRUE(c->alloc_staging(n * len, &s).ok());
  std::memset(s.data, 0, n * len);
  EXPECT_EQ(c->lookup(keys.data(), n, false), n) << "chunks lost across kill -9";
  ASSERT_TRUE(c->retrieve(s, keys.data(), offs.data(), lens.data(), n, per.data()).ok());
  for (uint32_t i = 0; i < n; ++i) {
    ASSERT_TRUE(per[i].ok()) << "chunk " << i << ": " << per[i].name();
    for (uint64_t k = 0; k < len; k += 4093)
      ASSERT_EQ(s.data[offs[i] + k], static_cast<uint8_t>(i * 7 + k / 3)) << i;
  }
}

TEST_F(AgentTest, HostileRequestsGetClearErrors) {
  start_agent();
  auto c = client();
  Staging s;
  ASSERT_TRUE(c->alloc_staging(1 << 20, &s).ok());
  auto io = [&](uint64_t map_id, uint64_t off, uint64_t len,
                uint16_t version = agent::kProtocolVersion) {
    uint8_t msg[sizeof(agent::AgentHeader) + sizeof(agent::IoEntry)];
    agent::AgentHeader h{};
    h.op = static_cast<uint16_t>(agent::Op::kStore);
    h.version = version;
    h.count = 1;
    h.request_id = 77;
    agent::IoEntry e{key_from_block_id(KeyContext{}, 1), map_id, off, len};
    std::memcpy(msg, &h, sizeof(h));
    std::memcpy(msg + sizeof(h), &e, sizeof(e));
    std::vector<uint8_t> resp;
    EXPECT_TRUE(c->raw_request(msg, sizeof(msg), &resp).ok());
    if (resp.size() < sizeof(agent::AgentHeader)) return Status(Code::kUnknown);
    agent::AgentHeader r;
    std::memcpy(&r, resp.data(), sizeof(r));
    return Status(static_cast<Code>(r.status));
  };
  EXPECT_EQ(io(s.id + 12345, 0, 4096), Code::kNotPermitted);        // memory it did not export
  EXPECT_EQ(io(s.id, (1 << 20) - 100, 4096), Code::kInvalidValue);  // past the end of its map
  EXPECT_EQ(io(s.id, 0, 1ull << 60), Code::kInvalidValue);          // absurd size
  EXPECT_EQ(io(s.id, UINT64_MAX - 10, 100), Code::kInvalidValue);   // offset overflow
  EXPECT_EQ(io(s.id, 0, 4096, 99), Code::kNotSupported);            // unknown version
  EXPECT_EQ(io(s.id, 0, 4096), Code::kSuccess);                     // and it still works
  // A count that does not match the bytes.
  agent::AgentHeader h{};
  h.op = static_cast<uint16_t>(agent::Op::kLookup);
  h.version = agent::kProtocolVersion;
  h.count = 1000;
  h.request_id = 78;
  std::vector<uint8_t> resp;
  ASSERT_TRUE(c->raw_request(&h, sizeof(h), &resp).ok());
  agent::AgentHeader r;
  std::memcpy(&r, resp.data(), sizeof(r));
  EXPECT_EQ(r.status, static_cast<uint8_t>(Code::kInvalidValue));
  // A long key batch (more keys than a store batch has entries) is answered whole.
  std::vector<ChunkKey> many(2000, key_from_block_id(KeyContext{}, 424242));
  std::vector<Status> many_st(2000);
  EXPECT_EQ(c->contains(many.data(), 2000, many_st.data()), Code::kNotFound);
  EXPECT_EQ(many_st[1999], Code::kNotFound);
  // Another client cannot name this client's memory.
  auto other = client();
  Staging s2;
  ASSERT_TRUE(other->alloc_staging(1 << 20, &s2).ok());
  ChunkKey k = key_from_block_id(KeyContext{}, 5);
  const uint64_t off = 0, len = 4096;
  Status st;
  Staging forged = s2;
  forged.id = s.id;  // the first client's map
  EXPECT_FALSE(other->store(forged, &k, &off, &len, 1, &st).ok());
  EXPECT_EQ(st, Code::kNotPermitted);
  // A header shorter than the protocol's: the agent drops that client, others go on.
  EXPECT_FALSE(other->raw_request("xx", 2, &resp).ok());
  EXPECT_EQ(c->lookup(&k, 1, false), 0u);
  std::string stats;
  ASSERT_TRUE(c->stats_json(&stats).ok());
  EXPECT_NE(stats.find("\"not_permitted\":2"), std::string::npos) << stats;
}

// Every op, given a body of another shape than its own (one byte too many, or a
// count that does not match), is refused as malformed before its handler runs; so
// are an unknown op and EVENTS, which only the agent sends. The agent goes on.
TEST_F(AgentTest, EveryOpRefusesABodyOfAnotherShape) {
  start_agent();
  auto c = client();
  auto status_of = [&](agent::Op op, uint32_t count, size_t body_len) {
    std::vector<uint8_t> msg(sizeof(agent::AgentHeader) + body_len, 0);
    agent::AgentHeader h{};
    h.op = static_cast<uint16_t>(op);
    h.version = agent::kProtocolVersion;
    h.count = count;
    h.request_id = 90;
    std::memcpy(msg.data(), &h, sizeof(h));
    return answered(c.get(), msg);
  };
  const size_t key = sizeof(ChunkKey);
  const struct {
    agent::Op op;
    uint32_t count;
    size_t len;
  } bad[] = {
      {agent::Op::kHello, 1, sizeof(agent::HelloEntry) + 1},
      {agent::Op::kHello, 2, 2 * sizeof(agent::HelloEntry)},
      {agent::Op::kStore, 0, 0},
      {agent::Op::kStore, 1, sizeof(agent::IoEntry) - 1},
      {agent::Op::kRetrieve, 2, sizeof(agent::IoEntry)},
      {agent::Op::kLookup, 1, key + 1},
      {agent::Op::kContains, 3, 2 * key},
      {agent::Op::kRemove, 1, 0},
      {agent::Op::kPrefetch, 0, key},
      {agent::Op::kUnpin, 2, key},
      {agent::Op::kStats, 1, 0},
      {agent::Op::kClear, 0, 8},
      {agent::Op::kPush, 1, sizeof(agent::PushHeader)},
      {agent::Op::kPush, agent::kMaxPushKeys + 1,
       sizeof(agent::PushHeader) + (agent::kMaxPushKeys + 1) * key},
      {agent::Op::kGpuExport, 1, sizeof(agent::GpuExportEntry) - 1},
      {agent::Op::kGpuRelease, 1, 4},
      {agent::Op::kSubscribe, 1, 0},
      {agent::Op::kEvents, 0, 0},
      {agent::Op::kRetrieveRows, 0, sizeof(agent::RowsHeader)},
      {agent::Op::kRetrieveRows, 1, sizeof(agent::RowsHeader) + key + 8},  // row_bytes 0
      {static_cast<agent::Op>(99), 0, 0},
  };
  for (const auto& b : bad)
    EXPECT_EQ(status_of(b.op, b.count, b.len), Code::kInvalidValue)
        << "op " << static_cast<int>(b.op) << ", " << b.count << " entries, " << b.len << " bytes";
  // The well-formed form of a few of them still works on the same connection.
  EXPECT_EQ(status_of(agent::Op::kLookup, 1, key), Code::kSuccess);
  EXPECT_EQ(status_of(agent::Op::kStats, 0, 0), Code::kSuccess);
  std::string stats;
  ASSERT_TRUE(c->stats_json(&stats).ok());
  const std::string want = "\"bad_requests\":" + std::to_string(std::size(bad));
  EXPECT_NE(stats.find(want), std::string::npos) << stats;
}

// A program that embeds an agent takes the same settings the CLI does, without the
// CLI: defaults, a config file, values of its own; bad ones are said, not run.
TEST_F(AgentTest, AnEmbeddingProgramStartsAnAgentFromSettings) {
  const std::string config = disk_ + ".yaml";
  {
    std::ofstream f(config);
    f << "max_chunk_size: 1M\nmemory_bytes: 64M\neviction: s3fifo\nmetrics_port: 0\n";
  }
  AgentSettings st = default_agent_settings();
  std::ostringstream why;
  ASSERT_TRUE(apply_config_file(config, &st, why)) << why.str();
  st.at("socket").value = socket_;
  ASSERT_TRUE(check_settings(st, why)) << why.str();
  AgentOptions o;
  ASSERT_TRUE(agent_options_from_settings(&st, &o, why)) << why.str();
  EXPECT_EQ(o.cache.memory_bytes, 64u << 20);
  EXPECT_EQ(o.cache.policy, "s3fifo");
  std::unique_ptr<Agent> agent;
  ASSERT_TRUE(Agent::create(o, &agent).ok());
  std::atomic<bool> stop{false};
  agent->set_on_ready([&] { stop = true; });  // served once: enough here
  EXPECT_TRUE(agent->run(&stop).ok());
  agent.reset();
  // A bad value and a setting that does not exist are said, each with where it came from.
  AgentSettings bad = default_agent_settings();
  bad.at("max_requests").value = "0";
  bad.at("max_requests").origin = "--max-requests";
  std::ostringstream why_bad;
  EXPECT_TRUE(check_settings(bad, why_bad));  // a count: parsed, then refused as options
  EXPECT_FALSE(agent_options_from_settings(&bad, &o, why_bad));
  EXPECT_NE(why_bad.str().find("--max-requests"), std::string::npos) << why_bad.str();
  {
    std::ofstream f(config);
    f << "memory_bytes: 64M\nno_such_setting: 1\n";
  }
  std::ostringstream why_file;
  EXPECT_FALSE(apply_config_file(config, &bad, why_file));
  EXPECT_NE(why_file.str().find(config + ":2: unknown setting 'no_such_setting'"),
            std::string::npos)
      << why_file.str();
  std::filesystem::remove(config);
}

TEST_F(AgentTest, AsynchronousSubmitThenWait) {
  start_agent();
  auto c = client();
  Staging s;
  ASSERT_TRUE(c->alloc_staging(16 << 20, &s).ok());
  const KeyContext ctx{model_id("async"), 1, 0, 0};
  constexpr uint32_t kN = 48;
  std::vector<ChunkKey> keys;
  std::vector<uint64_t> offs, lens;
  for (uint32_t i = 0; i < kN; ++i) {
    keys.push_back(key_from_block_id(ctx, i));
    offs.push_back(i * (128 << 10));
    lens.push_back(128 << 10);
    std::memset(s.data + offs[i], static_cast<int>(i + 1), 128 << 10);
  }
  // Three tickets in flight at once, collected out of order.
  std::vector<Status> a(16), b(16), d(16);
  Client::Ticket ta, tb, td;
  ASSERT_TRUE(c->submit_store(s, keys.data(), offs.data(), lens.data(), 16, a.data(), &ta).ok());
  ASSERT_TRUE(
      c->submit_store(s, keys.data() + 16, offs.data() + 16, lens.data() + 16, 16, b.data(), &tb)
          .ok());
  ASSERT_TRUE(
      c->submit_store(s, keys.data() + 32, offs.data() + 32, lens.data() + 32, 16, d.data(), &td)
          .ok());
  EXPECT_TRUE(c->wait(td).ok());
  EXPECT_TRUE(c->wait(ta).ok());
  bool done = false;
  Status st;
  while (!done) st = c->poll(tb, &done);
  EXPECT_TRUE(st.ok());
  for (const auto* v : {&a, &b, &d})
    for (Status x : *v) EXPECT_TRUE(x.ok());
  EXPECT_EQ(c->lookup(keys.data(), kN, false), kN);
  std::memset(s.data, 0, 16 << 20);
  std::vector<Status> r(kN);
  Client::Ticket tr;
  ASSERT_TRUE(c->submit_retrieve(s, keys.data(), offs.data(), lens.data(), kN, r.data(), &tr).ok());
  ASSERT_TRUE(c->wait(tr).ok());
  for (uint32_t i = 0; i < kN; ++i) ASSERT_EQ(s.data[offs[i] + 777], static_cast<uint8_t>(i + 1));
  EXPECT_EQ(c->poll(tr, &done), Code::kNotFound);  // collected already
}

// Issue 47: a load in one copy. Memory the client keeps using (an engine's paged
// cache, here a mapping of this test's own) is shared in place, its bytes kept, and
// a RETRIEVE_ROWS writes each chunk into its rows in order, a partial last chunk
// into fewer rows; nothing else of the memory changes. What the agent must refuse
// (rows outside the map, a map not exported, GPU memory, a chunk larger than its
// rows, a malformed body) writes nothing.
TEST_F(AgentTest, ARowsRetrieveWritesEachChunkIntoItsRowsAndNothingElse) {
  start_agent();
  auto c = client();
  ASSERT_TRUE(c->agent_rows());
  constexpr uint32_t kRow = 1000, kRows = 4, kChunk = kRow * kRows, kLastRows = 2;
  const KeyContext ctx{model_id("rows"), 1, 0, 0};
  Staging s;
  ASSERT_TRUE(c->alloc_staging(1 << 20, &s).ok());
  std::vector<ChunkKey> keys;
  std::vector<uint64_t> offs, lens;
  for (uint32_t i = 0; i < 3; ++i) {
    keys.push_back(key_from_block_id(ctx, i));
    offs.push_back(i * kChunk);
    lens.push_back(i == 2 ? kRow * kLastRows : kChunk);
    for (uint32_t b = 0; b < kChunk; ++b) s.data[i * kChunk + b] = static_cast<uint8_t>(b * 7 + i);
  }
  std::vector<Status> st(3);
  ASSERT_TRUE(c->store(s, keys.data(), offs.data(), lens.data(), 3, st.data()).ok());

  // The "cache": 64 KiB a few bytes into a mapping, with bytes of its own.
  constexpr size_t kMap = 80 << 10, kAt = 100, kCache = 64 << 10;
  auto* map = static_cast<uint8_t*>(
      mmap(nullptr, kMap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(map, MAP_FAILED);
  for (size_t i = 0; i < kMap; ++i) map[i] = static_cast<uint8_t>(i % 251);
  std::vector<uint8_t> before(map, map + kMap);
  Staging sh;
  EXPECT_EQ(c->share_memory(map + kAt, 1000, &sh), Code::kInvalidValue);  // no whole page
  ASSERT_TRUE(c->share_memory(map + kAt, kCache, &sh).ok());
  EXPECT_EQ(sh.data, map + 4096);  // the first whole page
  EXPECT_EQ(sh.size, 60u << 10);   // to the last whole one
  EXPECT_EQ(std::memcmp(map, before.data(), kMap), 0) << "sharing changed the bytes";
  const size_t at = static_cast<size_t>(sh.data - map);

  // Rows out of order, across pages, one unaligned.
  const std::vector<uint64_t> rows = {kAt + 9000,  kAt + 1000, kAt + 30000, 4097,
                                      kAt + 50000, kAt + 2000, kAt + 12345, kAt + 40000,
                                      kAt + 60000, kAt + 20000};
  Client::Ticket t;
  ASSERT_TRUE(c->submit_retrieve_rows(sh, keys.data(), 3, rows.data(), kRow, kRows, kLastRows,
                                      st.data(), &t)
                  .ok());
  ASSERT_TRUE(c->wait(t).ok());
  for (Status x : st) EXPECT_TRUE(x.ok()) << x.name();
  std::vector<uint8_t> want = before;
  for (uint32_t r = 0; r < rows.size(); ++r)
    std::memcpy(want.data() + at + rows[r], s.data + static_cast<size_t>(r) * kRow, kRow);
  EXPECT_EQ(std::memcmp(map, want.data(), kMap), 0) << "bytes outside the rows changed";

  // Refused: what the agent is sent, not what this client would send (raw).
  auto rows_request = [&](uint64_t map_id, uint16_t per_chunk, uint16_t last, uint64_t row_off,
                          uint32_t row_bytes, uint32_t chunk) {
    agent::AgentHeader h{};
    h.op = static_cast<uint16_t>(agent::Op::kRetrieveRows);
    h.version = agent::kProtocolVersion;
    h.count = 1;
    h.request_id = 91;
    const agent::RowsHeader rh{map_id, row_bytes, per_chunk, last, 0};
    std::vector<uint8_t> msg(sizeof(h) + sizeof(rh) + sizeof(ChunkKey) + 8u * last);
    std::memcpy(msg.data(), &h, sizeof(h));
    std::memcpy(msg.data() + sizeof(h), &rh, sizeof(rh));
    std::memcpy(msg.data() + sizeof(h) + sizeof(rh), &keys[chunk], sizeof(ChunkKey));
    for (uint32_t r = 0; r < last; ++r) {
      const uint64_t o = row_off + r * row_bytes;
      std::memcpy(msg.data() + sizeof(h) + sizeof(rh) + sizeof(ChunkKey) + 8u * r, &o, 8);
    }
    return answered(c.get(), msg);
  };
  std::memcpy(before.data(), map, kMap);
  EXPECT_EQ(rows_request(sh.id, kRows, kRows, sh.size - 10, kRow, 0), Code::kInvalidValue);
  EXPECT_EQ(rows_request(sh.id, kRows, kRows, UINT64_MAX - 500, kRow, 0), Code::kInvalidValue);
  EXPECT_EQ(rows_request(sh.id + 999, kRows, kRows, 0, kRow, 0), Code::kNotPermitted);
  EXPECT_EQ(rows_request(agent::kGpuMapBit | 1, kRows, kRows, 0, kRow, 0), Code::kNotSupported);
  EXPECT_EQ(rows_request(sh.id, kRows, kRows, 0, kRow / 2, 0), Code::kTooBig);  // rows too small
  EXPECT_EQ(rows_request(sh.id, agent::kMaxRowsPerChunk + 1, 1, 0, kRow, 0), Code::kInvalidValue);
  EXPECT_EQ(rows_request(sh.id, 2, 3, 0, kRow, 0), Code::kInvalidValue);  // last > per chunk
  EXPECT_EQ(std::memcmp(map, before.data(), kMap), 0) << "a refused request wrote";
  // The client checks its own rows before sending.
  const uint64_t outside[] = {sh.size - kRow + 1};
  EXPECT_EQ(c->submit_retrieve_rows(sh, keys.data(), 1, outside, kRow, 1, 1, st.data(), &t),
            Code::kInvalidValue);
  // The same rows again, through the well-formed path: still served.
  ASSERT_TRUE(c->submit_retrieve_rows(sh, keys.data(), 3, rows.data(), kRow, kRows, kLastRows,
                                      st.data(), &t)
                  .ok());
  EXPECT_TRUE(c->wait(t).ok());
  // Another client of this process may not move the pages from under this export...
  auto other = client();
  Staging sh2;
  EXPECT_EQ(other->share_memory(map + kAt + 8192, 8192, &sh2), Code::kBadState);
  c.reset();  // the export goes with the client; the pages stay this test's
  EXPECT_EQ(std::memcmp(map, want.data(), kMap), 0);
  // ... but may once it is gone, the bytes kept again.
  EXPECT_TRUE(other->share_memory(map + kAt, kCache, &sh2).ok());
  EXPECT_EQ(std::memcmp(map, want.data(), kMap), 0);
  other.reset();
  munmap(map, kMap);
}

// Issue 36: the connector unpins a request's every layer in one call (a 32k-token
// prompt of Llama-8B: 32 layers of 128 keys, 4,096 keys), more than a message holds
// (2,047); unpin sent its keys in one message, which would fail and leave the pins
// until their timeout. Now the keys go in as many messages as they need, all sent
// before the first answer is awaited.
TEST_F(AgentTest, UnpinOfMoreKeysThanAMessageHoldsReleasesEveryPin) {
  start_agent();
  auto c = client();
  Staging s;
  ASSERT_TRUE(c->alloc_staging(1 << 20, &s).ok());
  const KeyContext ctx{model_id("unpin-many"), 1, 0, 0};
  constexpr uint32_t kN = 5000;  // more than two messages of keys
  std::vector<ChunkKey> keys;
  for (uint32_t i = 0; i < kN; ++i) keys.push_back(key_from_block_id(ctx, i));
  std::vector<uint64_t> offs(kN, 0), lens(kN, 4096);
  std::vector<Status> st(kN);
  for (uint32_t first = 0; first < kN; first += 200)
    ASSERT_TRUE(c->store(s, keys.data() + first, offs.data(), lens.data(), 200, st.data()).ok());
  ASSERT_EQ(c->lookup(keys.data(), kN, true), kN);  // every chunk pinned
  std::vector<Status> rm(kN);
  (void)c->remove(keys.data(), 10, rm.data());
  for (uint32_t i = 0; i < 10; ++i) EXPECT_EQ(rm[i], Code::kBadState) << i;  // pinned
  ASSERT_TRUE(c->unpin(keys.data(), kN).ok());
  // Unpinned (the lookup's pins, on every message's keys): removable now.
  for (uint32_t first : {0u, 2500u, 4990u}) {
    ASSERT_TRUE(c->remove(keys.data() + first, 10, rm.data()).ok()) << first;
    for (uint32_t i = 0; i < 10; ++i) EXPECT_TRUE(rm[i].ok()) << first + i;
  }
}

// A batch larger than the cache's request pool (a 32k-token prefix is 4,096 chunk
// copies at once) waits for requests to finish instead of failing entries with
// AGAIN; a batch that comes while another waits queues behind it.
TEST_F(AgentTest, BatchesBeyondTheRequestPoolWaitInsteadOfFailing) {
  start_agent(false, 0, {"--max-requests", "8"});
  auto c = client();
  Staging s;
  ASSERT_TRUE(c->alloc_staging(16 << 20, &s).ok());
  const KeyContext ctx{model_id("burst"), 1, 0, 0};
  constexpr uint32_t kN = 400, kLen = 32 << 10;
  std::vector<ChunkKey> keys;
  std::vector<uint64_t> offs, lens;
  for (uint32_t i = 0; i < kN; ++i) {
    keys.push_back(key_from_block_id(ctx, i));
    offs.push_back(uint64_t{i} * kLen);
    lens.push_back(kLen);
    for (uint32_t at = 0; at < kLen; at += 512)
      s.data[offs[i] + at] = static_cast<uint8_t>(i * 7 + at);
  }
  std::vector<Status> a(kN / 2), b(kN / 2);
  Client::Ticket ta, tb;
  ASSERT_TRUE(
      c->submit_store(s, keys.data(), offs.data(), lens.data(), kN / 2, a.data(), &ta).ok());
  ASSERT_TRUE(c->submit_store(s, keys.data() + kN / 2, offs.data() + kN / 2, lens.data() + kN / 2,
                              kN / 2, b.data(), &tb)
                  .ok());
  EXPECT_TRUE(c->wait(ta).ok());
  EXPECT_TRUE(c->wait(tb).ok());
  for (const auto* v : {&a, &b})
    for (Status x : *v) EXPECT_EQ(x, Code::kSuccess);
  std::memset(s.data, 0, uint64_t{kN} * kLen);
  std::vector<Status> r(kN);
  ASSERT_TRUE(c->retrieve(s, keys.data(), offs.data(), lens.data(), kN, r.data()).ok());
  for (uint32_t i = 0; i < kN; ++i) {
    ASSERT_EQ(r[i], Code::kSuccess) << i;
    for (uint32_t at = 0; at < kLen; at += 512)
      ASSERT_EQ(s.data[offs[i] + at], static_cast<uint8_t>(i * 7 + at)) << i << " " << at;
  }
  std::string stats;
  ASSERT_TRUE(c->stats_json(&stats).ok());
  EXPECT_EQ(stats.find("\"stalled_batches\":0"), std::string::npos) << stats;
}

// Issue 37.4: an answer over the message bound was cut to fit a 64 KiB buffer on
// the stack while its header kept the whole length. Now it is refused as TOO_BIG,
// said and counted, and the session goes on. The agent runs in this process here,
// with a 1 KiB bound its own JSON statistics exceed.
TEST_F(AgentTest, AnAnswerOverTheMessageBoundIsRefusedNotCut) {
  AgentSettings st = default_agent_settings();
  st.at("socket").value = socket_;
  st.at("memory_bytes").value = "64M";
  st.at("metrics_port").value = "0";
  std::ostringstream why;
  AgentOptions o;
  ASSERT_TRUE(agent_options_from_settings(&st, &o, why)) << why.str();
  o.max_msg = 1024;
  std::unique_ptr<Agent> agent;
  ASSERT_TRUE(Agent::create(o, &agent).ok());
  ASSERT_GT(agent->stats_json().size(), o.max_msg);  // else this test proves nothing
  std::atomic<bool> stop{false};
  std::thread serve([&] { EXPECT_TRUE(agent->run(&stop).ok()); });
  {
    auto c = client();
    ASSERT_NE(c, nullptr);
    std::string json;
    EXPECT_EQ(c->stats_json(&json), Code::kTooBig);
    // The session is intact: a store and a lookup after it are served.
    Staging s;
    ASSERT_TRUE(c->alloc_staging(1 << 20, &s).ok());
    std::memset(s.data, 0x5a, 4096);
    const ChunkKey k = key_from_block_id({model_id("oversized"), 1, 0, 0}, 1);
    const uint64_t off = 0, len = 4096;
    Status r;
    ASSERT_TRUE(c->store(s, &k, &off, &len, 1, &r).ok());
    EXPECT_TRUE(r.ok());
    EXPECT_EQ(c->lookup(&k, 1, false), 1u);
  }
  stop = true;
  serve.join();
  EXPECT_NE(agent->stats_json().find("\"oversized_replies\":1"), std::string::npos);
}

// An inference process may not touch the cache for a while: its session must
// survive several heartbeat timeouts' worth of silence from its own thread.
TEST_F(AgentTest, IdleClientKeepsItsSession) {
  start_agent();
  auto c = client();
  std::this_thread::sleep_for(std::chrono::milliseconds(4500));  // > 3 x 1 s heartbeat
  std::string stats;
  ASSERT_TRUE(c->stats_json(&stats).ok());
  // One session for the start-up probe, one for this client: no reconnect happened.
  EXPECT_NE(stats.find("\"sessions_opened\":2,"), std::string::npos) << stats;
}

TEST_F(AgentTest, MetricsEndpointServesPrometheusText) {
  const int port = 20000 + getpid() % 12000;  // below the ephemeral ports (32768-)
  start_agent(false, port);
  EXPECT_EQ(wait_exit(spawn(CLIENT_PEER_BIN, {socket_, "store-retrieve", "6", "10"})), 0);
  const std::string body = metrics_get(port);
  EXPECT_NE(body.find("200 OK"), std::string::npos);
  EXPECT_NE(body.find("dpukv_stores_total 10"), std::string::npos) << body.substr(0, 2000);
  EXPECT_NE(body.find("dpukv_retrieve_batch_seconds_bucket{le=\"+Inf\"} 1"), std::string::npos);
  EXPECT_NE(body.find("# TYPE dpukv_memory_used_bytes gauge"), std::string::npos);
}

// Silent connections to the metrics port (a scraper that hangs, a port scan) must
// never stall the agent's thread: clients are served at once, and the port
// answers again once the silent ones time out.
TEST_F(AgentTest, SilentMetricsConnectionsNeverStallClients) {
  const int port = 20000 + (getpid() + 7) % 12000;
  start_agent(false, port);
  auto c = client();
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<int> silent;
  for (int i = 0; i < 25; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    silent.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ChunkKey k = key_from_block_id(KeyContext{}, 1);
  for (int i = 0; i < 20; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(c->lookup(&k, 1, false), 0u);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50));
  }
  // After the silent ones' deadline (2 s) the endpoint answers again.
  std::this_thread::sleep_for(std::chrono::milliseconds(2300));
  EXPECT_NE(metrics_get(port).find("200 OK"), std::string::npos);
  for (int s : silent) close(s);
}

// Issue 45.9: 16 metrics connections were the cap, so 500 slow ones locked a
// scraper out until they timed out. Now the oldest connection still sending its
// request makes room, and a scrape gets through at once.
TEST_F(AgentTest, SlowMetricsConnectionsCannotLockAScraperOut) {
  const int port = 20000 + (getpid() + 11) % 12000;
  start_agent(false, port);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<int> slow;
  for (int i = 0; i < 500; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ASSERT_EQ(send(fd, "GET /met", 8, 0), 8);  // half a request line, then nothing
    slow.push_back(fd);
  }
  const std::string got = metrics_get(port);
  EXPECT_NE(got.find("200 OK"), std::string::npos) << "the scrape was refused: " << got;
  EXPECT_NE(got.find("dpukv_metrics_connections_refused_total"), std::string::npos);
  for (int fd : slow) close(fd);
}

// A client asking for absurd staging is refused before any memory is touched, by
// the agent's per-client limit (max_staging_size), which the client learns at HELLO.
TEST_F(AgentTest, StagingIsCappedPerClient) {
  start_agent(false, 0, {"--max-staging-size", "64M"});
  auto c = client();
  EXPECT_EQ(c->max_staging_bytes(), 64ull << 20);
  Staging s;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(c->alloc_staging(1ull << 40, &s), Code::kTooBig);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100));
  ASSERT_TRUE(c->alloc_staging(32 << 20, &s).ok());
  Staging s2;
  EXPECT_EQ(c->alloc_staging(48 << 20, &s2), Code::kTooBig);
  ASSERT_TRUE(c->alloc_staging(32 << 20, &s2).ok());
  ChunkKey k = key_from_block_id(KeyContext{}, 3);
  const uint64_t off = 0, len = 4096;
  EXPECT_TRUE(c->store(s2, &k, &off, &len, 1, nullptr).ok());
}

// Keys naming another model than the session's are refused and counted, whatever
// the operation.
TEST_F(AgentTest, KeysOfAnotherModelAreCountedAsNotPermitted) {
  start_agent();
  ClientOptions o;
  o.socket_path = socket_;
  o.model = 7;
  std::unique_ptr<Client> c;
  ASSERT_TRUE(Client::connect(o, &c).ok());
  Staging s;
  ASSERT_TRUE(c->alloc_staging(1 << 20, &s).ok());
  ChunkKey other = key_from_block_id(KeyContext{8, 1, 0, 0}, 1);
  const uint64_t off = 0, len = 4096;
  Status st;
  EXPECT_FALSE(c->store(s, &other, &off, &len, 1, &st).ok());
  EXPECT_EQ(st, Code::kNotPermitted);
  EXPECT_EQ(c->lookup(&other, 1, false), 0u);
  std::string stats;
  ASSERT_TRUE(c->stats_json(&stats).ok());
  EXPECT_NE(stats.find("\"not_permitted\":2"), std::string::npos) << stats;
}

// The agent folds the client's tenant into every key (protocol/tenant_key.h): a
// key whose world size or rank does not fit the fold is refused with
// INVALID_VALUE, on every op that carries keys, and the agent goes on.
TEST_F(AgentTest, KeysTheTenantFoldCannotHoldAreInvalid) {
  start_agent();
  auto c = client();
  Staging s;
  ASSERT_TRUE(c->alloc_staging(1 << 20, &s).ok());
  const uint64_t off = 0, len = 4096;
  for (auto [ws, rank] : {std::pair<uint32_t, uint32_t>{70000, 0}, {0, 0}, {4, 4}}) {
    ChunkKey k = key_from_block_id(KeyContext{0, ws, rank, 0}, 1);
    Status st;
    EXPECT_FALSE(c->store(s, &k, &off, &len, 1, &st).ok());
    EXPECT_EQ(st, Code::kInvalidValue) << ws << " " << rank;
    EXPECT_EQ(c->lookup(&k, 1, false), 0u);
    EXPECT_EQ(c->contains(&k, 1, &st), Code::kInvalidValue);
  }
  ChunkKey ok = key_from_block_id(KeyContext{0, 65535, 65534, 0}, 1);
  Status st;
  EXPECT_TRUE(c->store(s, &ok, &off, &len, 1, &st).ok());
  EXPECT_EQ(c->lookup(&ok, 1, false), 1u);
  std::string stats;
  ASSERT_TRUE(c->stats_json(&stats).ok());
  EXPECT_NE(stats.find("\"tenant\":\"user:"), std::string::npos) << stats;
}

}  // namespace
}  // namespace dpukv
