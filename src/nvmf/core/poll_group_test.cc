// The generic poll group alone, with real descriptors: a watched fd's handler runs
// on the group's thread, every poller runs each pass and ticks about every 100 ms,
// calls from other threads run there, and an fd kept in the set with no events (a
// listener paused out of descriptors) is not reported until it is watched again.
#include "nvmf/core/poll_group.h"

#include <gtest/gtest.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace dpukv::nvme {
namespace {

struct CountingWatcher final : PollWatcher {
  explicit CountingWatcher(int f) : PollWatcher(&ready), fd(f) {}
  static int ready(PollWatcher* self, uint32_t events) {
    auto* w = static_cast<CountingWatcher*>(self);
    uint64_t v;
    (void)::read(w->fd, &v, sizeof v);
    w->last_events.store(events);
    w->on_thread.store(std::this_thread::get_id());
    ++w->calls;
    return 1;
  }
  int fd;
  std::atomic<int> calls{0};
  std::atomic<uint32_t> last_events{0};
  std::atomic<std::thread::id> on_thread{};
};

struct CountingPoller final : Poller {
  int poll() override {
    ++passes;
    return 0;
  }
  void tick(uint64_t) override { ++ticks; }
  std::atomic<uint64_t> passes{0}, ticks{0};
};

// Waits for a condition (not for a time); fails after a generous bound.
template <class F>
bool eventually(F f) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!f()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

void signal(int fd) {
  uint64_t one = 1;
  ASSERT_EQ(::write(fd, &one, sizeof one), 8);
}

// An eventfd, its watcher, and a poller in a group not started yet.
class PollGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GE(fd, 0);
    g.add_poller(&p);
  }
  void TearDown() override {
    g.stop();
    if (fd >= 0) ::close(fd);
  }
  const int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  CountingWatcher w{fd};
  CountingPoller p;
  PollGroup g;
};

TEST_F(PollGroupTest, WatchersPollersTicksAndCallsRunOnItsThread) {
  ASSERT_TRUE(g.start(-1).ok());
  std::thread::id poll_thread;
  ASSERT_TRUE(g.call([&] {
                 poll_thread = std::this_thread::get_id();
                 return g.watch(fd, EPOLLIN, &w) ? Status() : Status(Code::kDriver);
               }).ok());
  EXPECT_NE(poll_thread, std::this_thread::get_id());

  signal(fd);
  ASSERT_TRUE(eventually([&] { return w.calls.load() == 1; }));
  EXPECT_EQ(w.last_events.load() & EPOLLIN, uint32_t{EPOLLIN});
  EXPECT_EQ(w.on_thread.load(), poll_thread);
  ASSERT_TRUE(eventually([&] { return p.ticks.load() >= 2; }));  // about every 100 ms
  EXPECT_GT(p.passes.load(), p.ticks.load());

  // A call's status comes back to the caller.
  EXPECT_EQ(g.call([] { return Status(Code::kNotFound); }), Code::kNotFound);
  g.stop();
  // No thread left: the caller runs a call itself, and no pass runs any more.
  const uint64_t passes = p.passes.load();
  std::thread::id ran_on;
  EXPECT_TRUE(g.call([&] {
                 ran_on = std::this_thread::get_id();
                 return Status();
               }).ok());
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_EQ(p.passes.load(), passes);
}

TEST_F(PollGroupTest, AnFdWithNoEventsStaysQuietUntilWatchedAgain) {
  ASSERT_TRUE(g.watch(fd, EPOLLIN, &w));  // before start: the owner's set-up
  ASSERT_TRUE(g.start(-1).ok());
  ASSERT_TRUE(g.call([&] { return g.rewatch(fd, 0, &w) ? Status() : Status(Code::kDriver); }).ok());
  signal(fd);  // readable from now on, but not watched
  const uint64_t from = p.passes.load();
  ASSERT_TRUE(eventually([&] { return p.passes.load() >= from + 200; }));
  EXPECT_EQ(w.calls.load(), 0);
  ASSERT_TRUE(
      g.call([&] { return g.rewatch(fd, EPOLLIN, &w) ? Status() : Status(Code::kDriver); }).ok());
  ASSERT_TRUE(eventually([&] { return w.calls.load() == 1; }));
  ASSERT_TRUE(g.call([&] {
                 g.unwatch(fd);
                 g.remove_poller(&p);
                 return Status();
               }).ok());
  const uint64_t passes = p.passes.load();
  signal(fd);
  // The group goes on without them: a call still runs, nothing more is counted.
  ASSERT_TRUE(g.call([] { return Status(); }).ok());
  ASSERT_TRUE(g.call([] { return Status(); }).ok());
  EXPECT_EQ(p.passes.load(), passes);
  EXPECT_EQ(w.calls.load(), 1);
}

}  // namespace
}  // namespace dpukv::nvme
