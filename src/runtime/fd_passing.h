// Sending bytes with one file descriptor over a UNIX socket (SCM_RIGHTS): how an
// export descriptor and its memfd reach the importing process.
#pragma once

#include <cstddef>

#include "runtime/status.h"

namespace dpukv {

// Sends len bytes (one datagram-like message on a SOCK_SEQPACKET or SOCK_STREAM
// socket) with fd attached. fd stays owned by the caller.
Status send_with_fd(int sock, const void* data, size_t len, int fd);

// Receives up to cap bytes; *len_out gets the length, *fd_out the received fd or -1
// (the caller owns it). Extra descriptors are closed: a peer cannot leak fds into us.
// CONNECTION_RESET on EOF.
Status recv_with_fd(int sock, void* data, size_t cap, size_t* len_out, int* fd_out);

}  // namespace dpukv
