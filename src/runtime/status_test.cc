#include "runtime/status.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "runtime/log.h"

namespace dpukv {
namespace {

TEST(Status, DefaultIsSuccess) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.name(), "SUCCESS");
}

TEST(Status, EveryCodeHasDistinctNameAndDescription) {
  std::set<std::string> names;
  for (int i = 0; i < static_cast<int>(Code::kCount_); ++i) {
    Status s(static_cast<Code>(i));
    EXPECT_FALSE(s.name().empty());
    EXPECT_FALSE(s.description().empty());
    EXPECT_TRUE(names.insert(std::string(s.name())).second) << s.name();
  }
  EXPECT_EQ(Status(Code::kAgain).name(), "AGAIN");
  EXPECT_EQ(Status(Code::kConnectionReset).name(), "CONNECTION_RESET");
  EXPECT_EQ(code_name(static_cast<Code>(200)), "INVALID_CODE");
}

Status fails_then_succeeds(int* calls) {
  DPUKV_RETURN_IF_ERROR(Status(Code::kTooBig));
  ++*calls;
  return Code::kSuccess;
}

TEST(Status, ReturnIfErrorPropagates) {
  int calls = 0;
  EXPECT_EQ(fails_then_succeeds(&calls), Code::kTooBig);
  EXPECT_EQ(calls, 0);
}

TEST(Log, LevelsAreSeparateAndParsed) {
  LogLevel l;
  ASSERT_TRUE(log_level_from_string("debug", &l).ok());
  EXPECT_EQ(l, LogLevel::kDebug);
  EXPECT_EQ(log_level_from_string("loud", &l), Code::kInvalidValue);
  log_set_level(LogSource::kApp, LogLevel::kTrace);
  log_set_level(LogSource::kLib, LogLevel::kError);
  EXPECT_TRUE(log_enabled(LogSource::kApp, LogLevel::kDebug));
  EXPECT_FALSE(log_enabled(LogSource::kLib, LogLevel::kWarning));
  EXPECT_TRUE(log_enabled(LogSource::kLib, LogLevel::kError));
  // A disabled message does not evaluate its arguments.
  int evaluated = 0;
  LOG_DBG("%d", ++evaluated);
  EXPECT_EQ(evaluated, 0);
  log_set_level(LogSource::kLib, LogLevel::kWarning);
}

TEST(Log, WritesToFile) {
  char path[] = "/tmp/dpukv_log_test_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_TRUE(log_set_file(path).ok());
  log_set_level(LogSource::kLib, LogLevel::kInfo);
  LOG_INFO("hello %s", "file");
  ASSERT_TRUE(log_set_file(nullptr).ok());
  log_set_level(LogSource::kLib, LogLevel::kWarning);
  FILE* f = fopen(path, "r");
  ASSERT_NE(f, nullptr);
  char line[512] = {};
  ASSERT_NE(fgets(line, sizeof(line), f), nullptr);
  fclose(f);
  unlink(path);
  EXPECT_NE(std::string(line).find("hello file"), std::string::npos);
  EXPECT_NE(std::string(line).find("[lib][INFO]"), std::string::npos);
}

}  // namespace
}  // namespace dpukv
