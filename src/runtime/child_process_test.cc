#include "runtime/child_process.h"

#include <unistd.h>

#include <gtest/gtest.h>

namespace dpukv {
namespace {

// A failed spawn leaves -1 or 0: signalling it must reach nobody. Signal 0 only
// checks permission, so the raw kill(-1, 0) would succeed here (and kill(-1, SIGKILL)
// would end every process of this user).
TEST(ChildProcess, RefusesPidsThatAreNotOneChild) {
  ASSERT_EQ(::kill(-1, 0), 0);
  EXPECT_FALSE(signal_child(-1, 0));
  EXPECT_FALSE(signal_child(0, 0));
  EXPECT_FALSE(reap_child(-1, nullptr));
  EXPECT_FALSE(reap_child(0, nullptr));
}

TEST(ChildProcess, SignalsAndReapsARealChild) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    pause();
    _exit(0);
  }
  EXPECT_TRUE(signal_child(pid, SIGKILL));
  int status = 0;
  ASSERT_TRUE(reap_child(pid, &status));
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

}  // namespace
}  // namespace dpukv
