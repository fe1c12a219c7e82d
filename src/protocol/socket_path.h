// Where an agent listens when nobody says: shared by the agent and every client.
#pragma once

#include <string>
#include <vector>

namespace dpukv {

// $XDG_RUNTIME_DIR/dpukv.sock, else /run/dpukv.sock if /run is writable, else /tmp.
std::string default_socket_path();

// Where a client looks for the agent when nobody says: DPUKV_SOCKET (taken as
// given: the user named it), else the first of $XDG_RUNTIME_DIR/dpukv.sock,
// /run/dpukv/dpukv.sock (the systemd unit's), /run/dpukv.sock and /tmp/dpukv.sock
// that is a trusted socket (agent_socket_trusted), else as pick_agent_socket says.
//
// Why the owner matters: a client hands the agent its staging memory, read-write,
// and takes the bytes it serves as KV. A socket another local user planted in
// /tmp would capture both.
// skipped: each candidate passed over, with why (the caller logs them).
std::string find_agent_socket(std::vector<std::string>* skipped = nullptr);

// The search of find_agent_socket over these candidates, in order, with `fallback`
// when none is trusted; if fallback is one found untrusted, the first candidate
// where nothing is, else "" (no agent may be looked for).
std::string pick_agent_socket(const std::vector<std::string>& candidates,
                              const std::string& fallback, std::vector<std::string>* skipped);

// A socket a client may find by searching: the path itself is a socket (not a
// symbolic link, which its owner could point elsewhere after the check) owned by
// root, by this process's user, or by the systemd unit's user `dpukv`. On false,
// *why says what it is instead (empty when nothing is there).
bool agent_socket_trusted(const std::string& path, std::string* why);

}  // namespace dpukv
