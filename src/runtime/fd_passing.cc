#include "runtime/fd_passing.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/log.h"

namespace dpukv {

void close_fds(int* fds, int n) {
  for (int i = 0; i < n; ++i) {
    if (fds[i] >= 0) ::close(fds[i]);
    fds[i] = -1;
  }
}

Status send_with_fds(int sock, const void* data, size_t len, const int* fds, int nfds) {
  if (nfds < 0 || nfds > kMaxPassedFds) return Code::kInvalidValue;
  iovec iov{const_cast<void*>(data), len};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kMaxPassedFds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (nfds > 0) {
    msg.msg_control = ctrl;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * static_cast<size_t>(nfds));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * static_cast<size_t>(nfds));
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * static_cast<size_t>(nfds));
  }
  ssize_t n;
  do n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Code::kAgain;
    if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN) return Code::kConnectionReset;
    if (errno == EMSGSIZE) return Code::kTooBig;
    if (errno == ENOBUFS || errno == ENOMEM) return Code::kAgain;  // kernel memory: transient
    LOG_WARN("sendmsg: %s", std::strerror(errno));
    return Code::kIoFailed;
  }
  return static_cast<size_t>(n) == len ? Status() : Status(Code::kIoFailed);
}

Status recv_with_fds(int sock, void* data, size_t cap, size_t* len_out, int* fds, int max_fds,
                     int* nfds_out) {
  iovec iov{data, cap};
  // Room for more descriptors than we accept, so that extras arrive and get closed
  // instead of being dropped with MSG_CTRUNC semantics we cannot see.
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * 32)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof(ctrl);
  *nfds_out = 0;
  ssize_t n;
  do n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Code::kAgain;
    if (errno == ECONNRESET) return Code::kConnectionReset;
    return Code::kIoFailed;
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (*nfds_out < max_fds)
        fds[(*nfds_out)++] = fd;
      else
        ::close(fd);
    }
  }
  if (n == 0 && *nfds_out == 0) return Code::kConnectionReset;
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    close_fds(fds, *nfds_out);
    *nfds_out = 0;
    return Code::kTooBig;
  }
  *len_out = static_cast<size_t>(n);
  return Code::kSuccess;
}

}  // namespace dpukv
