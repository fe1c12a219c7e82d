// Status codes of the dpukv runtime.
//
// The code space follows doca_error_t so that a DOCA backend can map its results
// one to one. A Status is one byte: returning it costs nothing on the data path.
// AGAIN and IN_PROGRESS are answers, not failures: callers must check for them.
#pragma once

#include <cstdint>
#include <string_view>

namespace dpukv {

enum class Code : uint8_t {
  kSuccess = 0,
  kUnknown,          // an error with no better code
  kNotPermitted,     // access or permission denied
  kInProgress,       // operation accepted; completion comes later
  kFull,             // a fixed-size resource has no room
  kTooBig,           // a length exceeds a limit or the destination
  kBadState,         // not allowed in the object's current state
  kInvalidValue,     // an argument or a field failed validation
  kNoMemory,         // a pool or inventory is exhausted
  kNotFound,         // no such object or key
  kAgain,            // temporarily unable; retry later (queue full)
  kTimeout,          // a deadline passed
  kShutdown,         // the object is stopping; the task was flushed
  kIoFailed,         // a system call or device reported an I/O error
  kConnectionReset,  // the peer went away
  kNotSupported,     // the capability is absent
  kCorrupted,        // data failed a checksum or a format check
  kDriver,           // an OS or library call failed unexpectedly
  kCount_,
};

class [[nodiscard]] Status {
 public:
  constexpr Status() = default;
  constexpr Status(Code c) : code_(c) {}  // NOLINT(google-explicit-constructor): errors are values

  static constexpr Status Ok() { return Status(); }

  constexpr bool ok() const { return code_ == Code::kSuccess; }
  constexpr Code code() const { return code_; }
  // Short upper-case name, e.g. "AGAIN", as doca_error_get_name() returns.
  std::string_view name() const;
  // One-sentence meaning, as doca_error_get_descr() returns.
  std::string_view description() const;

  friend constexpr bool operator==(Status a, Status b) { return a.code_ == b.code_; }
  friend constexpr bool operator==(Status a, Code b) { return a.code_ == b; }

 private:
  Code code_ = Code::kSuccess;
};

std::string_view code_name(Code c);
std::string_view code_description(Code c);

// Evaluates a Status expression and returns it from the enclosing function on error.
#define DPUKV_RETURN_IF_ERROR(expr)        \
  do {                                     \
    ::dpukv::Status dpukv_st_ = (expr);    \
    if (!dpukv_st_.ok()) return dpukv_st_; \
  } while (0)

}  // namespace dpukv
