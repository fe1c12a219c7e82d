#include "runtime/status.h"

#include <array>

namespace dpukv {
namespace {

struct CodeInfo {
  std::string_view name;
  std::string_view description;
};

constexpr std::array<CodeInfo, static_cast<size_t>(Code::kCount_)> kInfo = {{
    {"SUCCESS", "Success"},
    {"UNKNOWN", "Unknown error"},
    {"NOT_PERMITTED", "Operation not permitted on this memory or object"},
    {"IN_PROGRESS", "Operation accepted and still in progress"},
    {"FULL", "No room left in a fixed-size resource"},
    {"TOO_BIG", "Length exceeds a limit or the destination"},
    {"BAD_STATE", "Operation not allowed in the current state"},
    {"INVALID_VALUE", "Invalid argument or field"},
    {"NO_MEMORY", "Pool or inventory exhausted"},
    {"NOT_FOUND", "Object not found"},
    {"AGAIN", "Temporarily unavailable, try again"},
    {"TIME_OUT", "Deadline passed"},
    {"SHUTDOWN", "Object is stopping; task flushed"},
    {"IO_FAILED", "I/O operation failed"},
    {"CONNECTION_RESET", "Peer connection reset"},
    {"NOT_SUPPORTED", "Capability not supported"},
    {"CORRUPTED", "Data failed a checksum or format check"},
    {"DRIVER", "Operating-system or library call failed"},
}};

}  // namespace

std::string_view code_name(Code c) {
  auto i = static_cast<size_t>(c);
  return i < kInfo.size() ? kInfo[i].name : "INVALID_CODE";
}

std::string_view code_description(Code c) {
  auto i = static_cast<size_t>(c);
  return i < kInfo.size() ? kInfo[i].description : "Not a status code";
}

std::string_view Status::name() const {
  return code_name(code_);
}
std::string_view Status::description() const {
  return code_description(code_);
}

}  // namespace dpukv
