// Where an agent listens when nobody says: shared by the agent and every client.
#pragma once

#include <string>

namespace dpukv {

// $XDG_RUNTIME_DIR/dpukv.sock, else /run/dpukv.sock if /run is writable, else /tmp.
std::string default_socket_path();

// Where a client looks for the agent when nobody says: DPUKV_SOCKET, else the
// first socket that exists of $XDG_RUNTIME_DIR/dpukv.sock, /run/dpukv/dpukv.sock
// (the systemd unit's), /run/dpukv.sock and /tmp/dpukv.sock, else
// default_socket_path().
std::string find_agent_socket();

}  // namespace dpukv
