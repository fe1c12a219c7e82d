// Where an agent listens when nobody says: shared by the agent and every client.
#pragma once

#include <string>

namespace dpukv {

// $XDG_RUNTIME_DIR/dpukv.sock, else /run/dpukv.sock if /run is writable, else /tmp.
std::string default_socket_path();

}  // namespace dpukv
