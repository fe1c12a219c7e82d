#include "protocol/socket_path.h"

#include <unistd.h>

#include <cstdlib>

namespace dpukv {

std::string default_socket_path() {
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x != nullptr && *x != '\0')
    return std::string(x) + "/dpukv.sock";
  if (access("/run", W_OK) == 0) return "/run/dpukv.sock";
  return "/tmp/dpukv.sock";
}

}  // namespace dpukv
