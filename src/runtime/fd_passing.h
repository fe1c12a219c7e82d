// Sending bytes with file descriptors over a UNIX socket (SCM_RIGHTS): how an
// export descriptor and its memfd, or a doorbell eventfd, reach the peer process.
#pragma once

#include <cstddef>

#include "runtime/status.h"

namespace dpukv {

inline constexpr int kMaxPassedFds = 4;

// Sends len bytes as one message (SOCK_SEQPACKET keeps it whole) with nfds fds
// attached. The fds stay owned by the caller. AGAIN if the socket buffer is full,
// CONNECTION_RESET if the peer is gone.
Status send_with_fds(int sock, const void* data, size_t len, const int* fds, int nfds);
inline Status send_with_fd(int sock, const void* data, size_t len, int fd) {
  return send_with_fds(sock, data, len, &fd, fd >= 0 ? 1 : 0);
}

// Receives one message of at most cap bytes. *len_out gets its length; fds gets up
// to max_fds received descriptors (owned by the caller), *nfds_out their count.
// Descriptors beyond max_fds are closed, so a peer cannot leak fds into us.
// TOO_BIG (all fds closed) if the message was longer than cap; CONNECTION_RESET on
// EOF; AGAIN if nothing is there.
Status recv_with_fds(int sock, void* data, size_t cap, size_t* len_out, int* fds, int max_fds,
                     int* nfds_out);
inline Status recv_with_fd(int sock, void* data, size_t cap, size_t* len_out, int* fd_out) {
  int n = 0;
  *fd_out = -1;
  return recv_with_fds(sock, data, cap, len_out, fd_out, 1, &n);
}

// Closes fds[0..n) and sets them to -1.
void close_fds(int* fds, int n);

}  // namespace dpukv
