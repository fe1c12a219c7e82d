#include "protocol/socket_path.h"

#include <pwd.h>
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

namespace {

// The uid of the systemd unit's user (examples/dpukv-agent.service.in), if any.
bool unit_uid(uid_t* out) {
  struct passwd pw {};
  struct passwd* res = nullptr;
  char buf[1024];
  if (getpwnam_r("dpukv", &pw, buf, sizeof(buf), &res) != 0 || res == nullptr) return false;
  *out = pw.pw_uid;
  return true;
}

}  // namespace

bool agent_socket_trusted(const std::string& path, std::string* why) {
  why->clear();
  struct stat sb {};
  if (::lstat(path.c_str(), &sb) != 0) return false;
  if (S_ISLNK(sb.st_mode)) {
    *why = "a symbolic link";
    return false;
  }
  if (!S_ISSOCK(sb.st_mode)) {
    *why = "not a socket";
    return false;
  }
  uid_t unit = 0;
  if (sb.st_uid == 0 || sb.st_uid == ::geteuid() || (unit_uid(&unit) && sb.st_uid == unit))
    return true;
  *why = "owned by uid " + std::to_string(sb.st_uid) +
         " (neither root, this user, nor the unit's user dpukv)";
  return false;
}

std::string pick_agent_socket(const std::vector<std::string>& candidates,
                              const std::string& fallback, std::vector<std::string>* skipped) {
  bool fallback_refused = false;
  for (const std::string& c : candidates) {
    std::string why;
    if (agent_socket_trusted(c, &why)) return c;
    if (why.empty()) continue;  // nothing there
    if (skipped != nullptr) skipped->push_back(c + ": " + why);
    if (c == fallback) fallback_refused = true;
  }
  if (!fallback_refused) return fallback;
  // Where nothing is yet (an agent may start there); none: no path at all.
  for (const std::string& c : candidates) {
    struct stat sb {};
    if (::lstat(c.c_str(), &sb) != 0) return c;
  }
  return "";
}

std::string find_agent_socket(std::vector<std::string>* skipped) {
  if (const char* x = std::getenv("DPUKV_SOCKET"); x != nullptr && *x != '\0') return x;
  std::vector<std::string> candidates;
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x != nullptr && *x != '\0')
    candidates.push_back(std::string(x) + "/dpukv.sock");
  candidates.emplace_back("/run/dpukv/dpukv.sock");
  candidates.emplace_back("/run/dpukv.sock");
  candidates.emplace_back("/tmp/dpukv.sock");
  return pick_agent_socket(candidates, default_socket_path(), skipped);
}

}  // namespace dpukv
