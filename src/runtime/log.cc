#include "runtime/log.h"

#include "runtime/clock.h"

#include <fcntl.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace dpukv {
namespace log_internal {
std::atomic<uint8_t> g_levels[2] = {static_cast<uint8_t>(LogLevel::kInfo),
                                    static_cast<uint8_t>(LogLevel::kWarning)};
namespace {
std::atomic<int> g_fd{STDERR_FILENO};
thread_local char g_last_error[512];

constexpr std::array<const char*, 7> kLevelNames = {"DISABLE", "CRIT",  "ERROR", "WARN",
                                                    "INFO",    "DEBUG", "TRACE"};

const char* basename_of(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}
}  // namespace

uint64_t now_ns() {
  return monotonic_ns();
}

void write(LogSource src, LogLevel lvl, const char* file, int line, const char* fmt, ...) {
  char buf[1024];
  timeval tv{};
  gettimeofday(&tv, nullptr);
  tm tmv{};
  localtime_r(&tv.tv_sec, &tmv);
  int n = std::snprintf(buf, sizeof(buf), "[%04d-%02d-%02d %02d:%02d:%02d.%06ld][%s][%s][%s:%d] ",
                        tmv.tm_year + 1900, tmv.tm_mon + 1, tmv.tm_mday, tmv.tm_hour, tmv.tm_min,
                        tmv.tm_sec, static_cast<long>(tv.tv_usec),
                        src == LogSource::kApp ? "app" : "lib",
                        kLevelNames[static_cast<size_t>(lvl)], basename_of(file), line);
  if (n < 0) return;
  size_t used = static_cast<size_t>(n) < sizeof(buf) ? static_cast<size_t>(n) : sizeof(buf) - 1;
  va_list ap;
  va_start(ap, fmt);
  int m = std::vsnprintf(buf + used, sizeof(buf) - used, fmt, ap);
  va_end(ap);
  if (m > 0)
    used += static_cast<size_t>(m) < sizeof(buf) - used ? static_cast<size_t>(m)
                                                        : sizeof(buf) - used - 1;
  if (used >= sizeof(buf) - 1) used = sizeof(buf) - 2;
  if (lvl <= LogLevel::kError && lvl != LogLevel::kDisable) {
    const size_t msg = static_cast<size_t>(n) < used ? static_cast<size_t>(n) : used;
    const size_t len = std::min(used - msg, sizeof(g_last_error) - 1);
    std::memcpy(g_last_error, buf + msg, len);
    g_last_error[len] = '\0';
  }
  buf[used++] = '\n';
  ssize_t ignored = ::write(g_fd.load(std::memory_order_relaxed), buf, used);
  (void)ignored;
}
}  // namespace log_internal

const char* log_last_error() {
  return log_internal::g_last_error;
}

void log_set_level(LogSource src, LogLevel lvl) {
  log_internal::g_levels[static_cast<int>(src)].store(static_cast<uint8_t>(lvl),
                                                      std::memory_order_relaxed);
}

LogLevel log_level(LogSource src) {
  return static_cast<LogLevel>(
      log_internal::g_levels[static_cast<int>(src)].load(std::memory_order_relaxed));
}

Status log_level_from_string(std::string_view s, LogLevel* out) {
  static constexpr std::pair<std::string_view, LogLevel> kNames[] = {
      {"disable", LogLevel::kDisable}, {"critical", LogLevel::kCritical},
      {"error", LogLevel::kError},     {"warning", LogLevel::kWarning},
      {"info", LogLevel::kInfo},       {"debug", LogLevel::kDebug},
      {"trace", LogLevel::kTrace}};
  for (const auto& [name, lvl] : kNames) {
    if (s == name) {
      *out = lvl;
      return Code::kSuccess;
    }
  }
  return Code::kInvalidValue;
}

Status log_set_file(const char* path) {
  int fd = STDERR_FILENO;
  if (path != nullptr && path[0] != '\0') {
    fd = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return Code::kIoFailed;
  }
  int old = log_internal::g_fd.exchange(fd);
  if (old != STDERR_FILENO) ::close(old);
  return Code::kSuccess;
}

}  // namespace dpukv

namespace dpukv {

bool LogRateLimit::allow(uint64_t now, uint64_t* suppressed) {
  uint64_t start = window_start_.load(std::memory_order_relaxed);
  if (start == 0 || now - start >= kLogWindowNs) {
    // A new window; one thread wins the swap and resets the count.
    if (window_start_.compare_exchange_strong(start, now, std::memory_order_relaxed))
      in_window_.store(0, std::memory_order_relaxed);
  }
  if (in_window_.fetch_add(1, std::memory_order_relaxed) >= kLogBurst) {
    suppressed_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  *suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
  return true;
}

}  // namespace dpukv
