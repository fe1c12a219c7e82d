#include "runtime/fd_passing.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dpukv {

Status send_with_fd(int sock, const void* data, size_t len, int fd) {
  iovec iov{const_cast<void*>(data), len};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = ctrl;
    msg.msg_controllen = sizeof(ctrl);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  ssize_t n;
  do n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return errno == EAGAIN ? Code::kAgain
                           : (errno == EPIPE ? Code::kConnectionReset : Code::kIoFailed);
  return static_cast<size_t>(n) == len ? Status() : Status(Code::kIoFailed);
}

Status recv_with_fd(int sock, void* data, size_t cap, size_t* len_out, int* fd_out) {
  iovec iov{data, cap};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * 8)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof(ctrl);
  *fd_out = -1;
  ssize_t n;
  do n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0) return errno == EAGAIN ? Code::kAgain : Code::kIoFailed;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t nfds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < nfds; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (*fd_out < 0)
        *fd_out = fd;
      else
        ::close(fd);
    }
  }
  if (n == 0 && *fd_out < 0) return Code::kConnectionReset;
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    if (*fd_out >= 0) ::close(*fd_out);
    *fd_out = -1;
    return Code::kTooBig;
  }
  *len_out = static_cast<size_t>(n);
  return Code::kSuccess;
}

}  // namespace dpukv
