#include "runtime/progress_engine.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>

#include <chrono>

#include <atomic>
#include <thread>
#include <vector>

#include "runtime/context.h"

namespace dpukv {
namespace {

// A context whose start completes only when told (as a client waits for its
// connection) and whose "tasks" are a counter, to drive the base state machine.
class ManualContext final : public Context {
 public:
  explicit ManualContext(ProgressEngine* pe) : Context(pe) {}
  ~ManualContext() override = default;
  bool async_start = true;
  Status start_result = Code::kSuccess;
  int outstanding = 0;
  std::atomic<int> pending_events{0};
  void become_ready() { set_state(CtxState::kRunning); }
  Status configure() { return require_idle(); }

 private:
  Status do_start() override {
    if (!start_result.ok()) return start_result;
    return async_start ? Status(Code::kInProgress) : Status();
  }
  void do_stop() override {}
  bool drained() override { return outstanding == 0; }
  size_t poll() override { return static_cast<size_t>(pending_events.exchange(0)); }
  bool arm_notification() override { return pending_events.load() != 0; }
};

struct Transitions {
  std::vector<std::pair<CtxState, CtxState>> seen;
  static void cb(UserData ud, Context*, CtxState prev, CtxState next) {
    static_cast<Transitions*>(ud.ptr)->seen.emplace_back(prev, next);
  }
};

TEST(Context, FullStateMachineWithAsyncStartAndDrainingStop) {
  std::unique_ptr<ProgressEngine> pe;
  ASSERT_TRUE(ProgressEngine::create(&pe).ok());
  ManualContext ctx(pe.get());
  EXPECT_EQ(pe->num_contexts(), 1u);
  Transitions tr;
  UserData ud;
  ud.ptr = &tr;
  ASSERT_TRUE(ctx.set_user_data(ud).ok());
  ASSERT_TRUE(ctx.set_state_changed_cb(&Transitions::cb).ok());
  EXPECT_EQ(ctx.stop(), Code::kBadState);  // stop while IDLE

  EXPECT_EQ(ctx.start(), Code::kInProgress);
  EXPECT_EQ(ctx.state(), CtxState::kStarting);
  EXPECT_EQ(ctx.start(), Code::kBadState);
  EXPECT_EQ(ctx.configure(), Code::kBadState);
  EXPECT_EQ(ctx.set_state_changed_cb(nullptr), Code::kBadState);
  ctx.become_ready();
  EXPECT_EQ(ctx.state(), CtxState::kRunning);

  ctx.outstanding = 2;  // tasks the user still holds
  EXPECT_EQ(ctx.stop(), Code::kInProgress);
  EXPECT_EQ(ctx.state(), CtxState::kStopping);
  EXPECT_EQ(ctx.stop(), Code::kBadState);
  pe->progress();
  EXPECT_EQ(ctx.state(), CtxState::kStopping);  // not until every task is freed
  ctx.outstanding = 0;
  EXPECT_TRUE(pe->progress());
  EXPECT_EQ(ctx.state(), CtxState::kIdle);
  EXPECT_TRUE(ctx.configure().ok());

  using S = CtxState;
  std::vector<std::pair<S, S>> want = {{S::kIdle, S::kStarting},
                                       {S::kStarting, S::kRunning},
                                       {S::kRunning, S::kStopping},
                                       {S::kStopping, S::kIdle}};
  EXPECT_EQ(tr.seen, want);
}

TEST(Context, FailedStartReturnsToIdleAndStopFromStarting) {
  std::unique_ptr<ProgressEngine> pe;
  ASSERT_TRUE(ProgressEngine::create(&pe).ok());
  ManualContext ctx(pe.get());
  ctx.start_result = Code::kDriver;
  EXPECT_EQ(ctx.start(), Code::kDriver);
  EXPECT_EQ(ctx.state(), CtxState::kIdle);
  ctx.start_result = Code::kSuccess;
  ASSERT_EQ(ctx.start(), Code::kInProgress);
  EXPECT_TRUE(ctx.stop().ok());  // nothing in flight: straight to IDLE
  EXPECT_EQ(ctx.state(), CtxState::kIdle);
  ctx.async_start = false;
  EXPECT_TRUE(ctx.start().ok());
  EXPECT_EQ(ctx.state(), CtxState::kRunning);
  EXPECT_TRUE(ctx.stop().ok());
}

TEST(ProgressEngine, ReportsWhetherItDidWork) {
  std::unique_ptr<ProgressEngine> pe;
  ASSERT_TRUE(ProgressEngine::create(&pe).ok());
  ManualContext ctx(pe.get());
  ctx.async_start = false;
  ASSERT_TRUE(ctx.start().ok());
  EXPECT_FALSE(pe->progress());
  ctx.pending_events = 3;
  EXPECT_TRUE(pe->progress());
  EXPECT_FALSE(pe->progress());
  ASSERT_TRUE(ctx.stop().ok());
}

TEST(ProgressEngine, NotificationWakesSleeperAndArmSeesPendingWork) {
  std::unique_ptr<ProgressEngine> pe;
  ASSERT_TRUE(ProgressEngine::create(&pe).ok());
  ManualContext ctx(pe.get());
  ctx.async_start = false;
  ASSERT_TRUE(ctx.start().ok());
  pollfd pfd{pe->notification_handle(), POLLIN, 0};

  ASSERT_TRUE(pe->request_notification().ok());
  EXPECT_EQ(poll(&pfd, 1, 0), 0);  // idle: nothing to wake for

  // Work that arrives from another thread wakes the sleeper.
  std::thread t([&] {
    ctx.pending_events = 1;
    pe->notify();
  });
  EXPECT_EQ(poll(&pfd, 1, 5000), 1);
  t.join();
  ASSERT_TRUE(pe->clear_notification().ok());
  EXPECT_EQ(poll(&pfd, 1, 0), 0);
  EXPECT_TRUE(pe->progress());

  // Work pending at arm time signals at once: no lost wake-up.
  ctx.pending_events = 1;
  ASSERT_TRUE(pe->request_notification().ok());
  EXPECT_EQ(poll(&pfd, 1, 0), 1);
  ASSERT_TRUE(pe->clear_notification().ok());
  EXPECT_TRUE(pe->progress());
  ASSERT_TRUE(ctx.stop().ok());
}

TEST(ProgressEngine, AdaptiveWaitSleepsWhenIdleAndWakesOnWork) {
  std::unique_ptr<ProgressEngine> pe;
  ASSERT_TRUE(ProgressEngine::create(&pe).ok());
  ManualContext ctx(pe.get());
  ctx.async_start = false;
  ASSERT_TRUE(ctx.start().ok());
  // Idle: 50 us of spinning, then a 200 ms sleep that costs almost no CPU.
  rusage r0{}, r1{};
  getrusage(RUSAGE_THREAD, &r0);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(pe->wait(50'000, 200));
  auto slept = std::chrono::steady_clock::now() - t0;
  getrusage(RUSAGE_THREAD, &r1);
  EXPECT_GE(slept, std::chrono::milliseconds(190));
  auto cpu_us = (r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) * 1000000L +
                (r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) +
                (r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) * 1000000L +
                (r1.ru_stime.tv_usec - r0.ru_stime.tv_usec);
  EXPECT_LT(cpu_us, 20'000) << "an idle wait burned CPU";
  // Work from another thread ends the sleep early.
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ctx.pending_events = 1;
    pe->notify();
  });
  t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(pe->wait(0, 5000));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2000));
  t.join();
  ASSERT_TRUE(ctx.stop().ok());
}

}  // namespace
}  // namespace dpukv
