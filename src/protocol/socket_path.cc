#include "protocol/socket_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

namespace dpukv {

std::string default_socket_path() {
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x != nullptr && *x != '\0')
    return std::string(x) + "/dpukv.sock";
  if (access("/run", W_OK) == 0) return "/run/dpukv.sock";
  return "/tmp/dpukv.sock";
}

std::string find_agent_socket() {
  if (const char* x = std::getenv("DPUKV_SOCKET"); x != nullptr && *x != '\0') return x;
  std::string candidates[4];
  size_t n = 0;
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x != nullptr && *x != '\0')
    candidates[n++] = std::string(x) + "/dpukv.sock";
  candidates[n++] = "/run/dpukv/dpukv.sock";
  candidates[n++] = "/run/dpukv.sock";
  candidates[n++] = "/tmp/dpukv.sock";
  for (size_t i = 0; i < n; ++i) {
    struct stat sb {};
    if (::stat(candidates[i].c_str(), &sb) == 0 && S_ISSOCK(sb.st_mode)) return candidates[i];
  }
  return default_socket_path();
}

}  // namespace dpukv
