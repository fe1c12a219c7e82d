// Logging with separate application and library levels, as DOCA separates
// doca_log_level_set_global_sdk_limit() from the application's backends.
//
// A disabled message costs one relaxed load and a compare: the format arguments
// are not evaluated. Output goes to stderr or to a file; each line is written with
// one write(2) so lines from several threads do not interleave.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

#include "runtime/status.h"

namespace dpukv {

enum class LogLevel : uint8_t { kDisable = 0, kCritical, kError, kWarning, kInfo, kDebug, kTrace };

enum class LogSource : uint8_t { kApp = 0, kLib = 1 };

namespace log_internal {
extern std::atomic<uint8_t> g_levels[2];
void write(LogSource src, LogLevel lvl, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
uint64_t now_ns();  // the monotonic clock (runtime/clock.h), without including it here
}  // namespace log_internal

void log_set_level(LogSource src, LogLevel lvl);
LogLevel log_level(LogSource src);
// Parses "critical", "error", "warning", "info", "debug", "trace", "disable".
Status log_level_from_string(std::string_view s, LogLevel* out);
// The text of the last ERROR or CRITICAL line this thread wrote ("" if none): what
// a command line tool repeats as its last word when a start fails.
const char* log_last_error();
// Sends log lines to PATH (appending); an empty path restores stderr.
Status log_set_file(const char* path);

// A line a peer can trigger is rate limited per call site (as the kernel's
// printk_ratelimited): at most kLogBurst lines per kLogWindowNs, then one line
// when the window ends saying how many were left out. allow() is lock free; under
// a race a line or two more may pass, never fewer.
class LogRateLimit {
 public:
  static constexpr uint32_t kLogBurst = 5;
  static constexpr uint64_t kLogWindowNs = 10'000'000'000ull;
  // True if this line may be written; *suppressed: lines left out before it
  // (since the last line written from this site).
  bool allow(uint64_t now_ns, uint64_t* suppressed);

 private:
  std::atomic<uint64_t> window_start_{0};
  std::atomic<uint32_t> in_window_{0};
  std::atomic<uint64_t> suppressed_{0};
};

inline bool log_enabled(LogSource src, LogLevel lvl) {
  return static_cast<uint8_t>(lvl) <=
         log_internal::g_levels[static_cast<int>(src)].load(std::memory_order_relaxed);
}

}  // namespace dpukv

#define DPUKV_LOG_(src, lvl, ...)                                              \
  do {                                                                         \
    if (::dpukv::log_enabled(src, lvl))                                        \
      ::dpukv::log_internal::write(src, lvl, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

// A rate-limited line (LogRateLimit): for messages a peer can cause. The format
// must be a string literal; "(N more left out)" is added when lines were dropped.
#define DPUKV_LOG_LIMITED_(src, lvl, fmt, ...)                                            \
  do {                                                                                    \
    if (::dpukv::log_enabled(src, lvl)) {                                                 \
      static ::dpukv::LogRateLimit dpukv_rl_;                                             \
      uint64_t dpukv_left_out_ = 0;                                                       \
      if (!dpukv_rl_.allow(::dpukv::log_internal::now_ns(), &dpukv_left_out_)) break;     \
      if (dpukv_left_out_ == 0)                                                           \
        ::dpukv::log_internal::write(src, lvl, __FILE__, __LINE__,                        \
                                     fmt __VA_OPT__(, ) __VA_ARGS__);                     \
      else                                                                                \
        ::dpukv::log_internal::write(src, lvl, __FILE__, __LINE__,                        \
                                     fmt " (%llu more like it not logged)" __VA_OPT__(, ) \
                                         __VA_ARGS__,                                     \
                                     static_cast<unsigned long long>(dpukv_left_out_));   \
    }                                                                                     \
  } while (0)
#define LOG_WARN_LIMITED(fmt, ...) \
  DPUKV_LOG_LIMITED_(::dpukv::LogSource::kLib, ::dpukv::LogLevel::kWarning, fmt, __VA_ARGS__)
#define LOG_ERR_LIMITED(fmt, ...) \
  DPUKV_LOG_LIMITED_(::dpukv::LogSource::kLib, ::dpukv::LogLevel::kError, fmt, __VA_ARGS__)

// Library code (runtime, engines, cache ...) logs with LOG_*; applications with APP_LOG_*.
#define LOG_CRIT(...) \
  DPUKV_LOG_(::dpukv::LogSource::kLib, ::dpukv::LogLevel::kCritical, __VA_ARGS__)
#define LOG_ERR(...) DPUKV_LOG_(::dpukv::LogSource::kLib, ::dpukv::LogLevel::kError, __VA_ARGS__)
#define LOG_WARN(...) DPUKV_LOG_(::dpukv::LogSource::kLib, ::dpukv::LogLevel::kWarning, __VA_ARGS__)
#define LOG_INFO(...) DPUKV_LOG_(::dpukv::LogSource::kLib, ::dpukv::LogLevel::kInfo, __VA_ARGS__)
#define LOG_DBG(...) DPUKV_LOG_(::dpukv::LogSource::kLib, ::dpukv::LogLevel::kDebug, __VA_ARGS__)
#define LOG_TRACE(...) DPUKV_LOG_(::dpukv::LogSource::kLib, ::dpukv::LogLevel::kTrace, __VA_ARGS__)

#define APP_LOG_ERR(...) \
  DPUKV_LOG_(::dpukv::LogSource::kApp, ::dpukv::LogLevel::kError, __VA_ARGS__)
#define APP_LOG_WARN(...) \
  DPUKV_LOG_(::dpukv::LogSource::kApp, ::dpukv::LogLevel::kWarning, __VA_ARGS__)
#define APP_LOG_INFO(...) \
  DPUKV_LOG_(::dpukv::LogSource::kApp, ::dpukv::LogLevel::kInfo, __VA_ARGS__)
#define APP_LOG_DBG(...) \
  DPUKV_LOG_(::dpukv::LogSource::kApp, ::dpukv::LogLevel::kDebug, __VA_ARGS__)
