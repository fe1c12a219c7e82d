#include "nvme/vfio_user_client.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "runtime/fd_passing.h"

namespace dpukv::nvme {
namespace vu = vfio_user;

Status VfioUserClient::connect(const std::string& path, int timeout_ms,
                               std::unique_ptr<VfioUserClient>* out) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) return Code::kInvalidValue;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  std::unique_ptr<VfioUserClient> c(new VfioUserClient());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    c->fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd_ < 0) return Code::kDriver;
    if (::connect(c->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) break;
    ::close(c->fd_);
    c->fd_ = -1;
    if (std::chrono::steady_clock::now() >= deadline) return Code::kTimeout;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  timeval tv{5, 0};
  setsockopt(c->fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(c->fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  const char caps[] = "{\"capabilities\":{\"max_msg_fds\":8,\"max_data_xfer_size\":1048576}}";
  std::vector<uint8_t> req(sizeof(vu::Version) + sizeof caps);
  vu::Version v{vu::kVersionMajor, vu::kVersionMinor};
  std::memcpy(req.data(), &v, sizeof v);
  std::memcpy(req.data() + sizeof v, caps, sizeof caps);
  std::vector<uint8_t> reply;
  if (Status st = c->request(vu::kVersion, req.data(), req.size(), nullptr, 0, &reply); !st.ok())
    return st;
  if (reply.size() < sizeof v) return Code::kCorrupted;
  std::memcpy(&v, reply.data(), sizeof v);
  if (v.major != vu::kVersionMajor) return Code::kNotSupported;
  if (reply.size() > sizeof v)
    c->server_caps_.assign(
        reinterpret_cast<const char*>(reply.data() + sizeof v),
        strnlen(reinterpret_cast<const char*>(reply.data() + sizeof v), reply.size() - sizeof v));
  *out = std::move(c);
  return Code::kSuccess;
}

VfioUserClient::~VfioUserClient() {
  if (fd_ >= 0) ::close(fd_);
}

Status VfioUserClient::send_msg(const void* msg, size_t len, const int* fds, int nfds) {
  // The descriptors go with the first bytes; the rest follows without them.
  const auto* p = static_cast<const uint8_t*>(msg);
  size_t first = std::min<size_t>(len, 64 * 1024);
  if (Status st = send_with_fds(fd_, p, first, fds, nfds); !st.ok()) return Code::kConnectionReset;
  for (size_t off = first; off < len;) {
    ssize_t n = ::send(fd_, p + off, len - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Code::kConnectionReset;
    off += static_cast<size_t>(n);
  }
  return Code::kSuccess;
}

Status VfioUserClient::recv_reply(vu::Header* h, std::vector<uint8_t>* body,
                                  std::vector<int>* fds) {
  size_t len = 0;
  int rfds[8];
  int nfds = 0;
  // Header first (with any descriptors), then exactly the announced body.
  size_t got = 0;
  while (got < sizeof *h) {
    int more = 0;
    Status st = recv_with_fds(fd_, reinterpret_cast<uint8_t*>(h) + got, sizeof *h - got, &len,
                              rfds + nfds, 8 - nfds, &more);
    nfds += more;
    if (!st.ok()) {
      close_fds(rfds, nfds);
      return Code::kConnectionReset;
    }
    got += len;
  }
  if (fds != nullptr)
    fds->assign(rfds, rfds + nfds);
  else
    close_fds(rfds, nfds);
  if (h->msg_size < sizeof *h || h->msg_size > vu::kMaxMessage) return Code::kCorrupted;
  body->resize(h->msg_size - sizeof *h);
  for (size_t off = 0; off < body->size();) {
    ssize_t n = ::recv(fd_, body->data() + off, body->size() - off, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Code::kConnectionReset;
    off += static_cast<size_t>(n);
  }
  return Code::kSuccess;
}

Status VfioUserClient::request(uint16_t command, const void* payload, size_t len, const int* fds,
                               int nfds, std::vector<uint8_t>* reply, std::vector<int>* reply_fds) {
  vu::Header h{};
  h.msg_id = next_id_++;
  h.command = command;
  h.msg_size = static_cast<uint32_t>(sizeof h + len);
  h.flags = vu::kFlagCommand;
  buf_.resize(sizeof h + len);
  std::memcpy(buf_.data(), &h, sizeof h);
  if (len > 0) std::memcpy(buf_.data() + sizeof h, payload, len);
  if (Status st = send_msg(buf_.data(), buf_.size(), fds, nfds); !st.ok()) return st;
  vu::Header r{};
  if (Status st = recv_reply(&r, reply, reply_fds); !st.ok()) return st;
  if (r.msg_id != h.msg_id || r.command != command ||
      (r.flags & vu::kFlagTypeMask) != vu::kFlagReply)
    return Code::kCorrupted;
  if (r.flags & vu::kFlagError) {
    last_errno_ = static_cast<int>(r.error_no);
    if (reply_fds != nullptr) {
      close_fds(reply_fds->data(), static_cast<int>(reply_fds->size()));
      reply_fds->clear();
    }
    return Code::kIoFailed;
  }
  last_errno_ = 0;
  return Code::kSuccess;
}

Status VfioUserClient::raw(const void* msg, size_t len, vu::Header* reply_header,
                           std::vector<uint8_t>* reply) {
  if (Status st = send_msg(msg, len, nullptr, 0); !st.ok()) return st;
  std::vector<int> fds;
  Status st = recv_reply(reply_header, reply, &fds);
  close_fds(fds.data(), static_cast<int>(fds.size()));
  return st;
}

Status VfioUserClient::device_info(vu::DeviceInfo* out) {
  vu::DeviceInfo in{sizeof in, 0, 0, 0};
  std::vector<uint8_t> r;
  if (Status st = request(vu::kDeviceGetInfo, &in, sizeof in, nullptr, 0, &r); !st.ok()) return st;
  if (r.size() < sizeof *out) return Code::kCorrupted;
  std::memcpy(out, r.data(), sizeof *out);
  return Code::kSuccess;
}

Status VfioUserClient::region_info(uint32_t index, vu::RegionInfo* out, int* fd,
                                   uint64_t* area_offset, uint64_t* area_size) {
  vu::RegionInfo in{};
  in.argsz = sizeof in + sizeof(vu::SparseMmap);
  in.index = index;
  std::vector<uint8_t> r;
  std::vector<int> fds;
  if (Status st = request(vu::kDeviceGetRegionInfo, &in, sizeof in, nullptr, 0, &r, &fds); !st.ok())
    return st;
  if (r.size() < sizeof *out) {
    close_fds(fds.data(), static_cast<int>(fds.size()));
    return Code::kCorrupted;
  }
  std::memcpy(out, r.data(), sizeof *out);
  if (area_offset != nullptr && (out->flags & vu::kRegionCaps) && out->cap_offset >= sizeof *out &&
      r.size() >= out->cap_offset + sizeof(vu::SparseMmap)) {
    vu::SparseMmap cap;
    std::memcpy(&cap, r.data() + out->cap_offset, sizeof cap);
    if (cap.header.id == vu::kCapSparseMmap && cap.nr_areas >= 1) {
      *area_offset = cap.offset;
      *area_size = cap.size;
    }
  }
  if (fd != nullptr && !fds.empty()) {
    *fd = fds[0];
    close_fds(fds.data() + 1, static_cast<int>(fds.size()) - 1);
  } else {
    close_fds(fds.data(), static_cast<int>(fds.size()));
  }
  return Code::kSuccess;
}

Status VfioUserClient::region_read(uint32_t region, uint64_t offset, void* data, uint32_t count) {
  vu::RegionAccess a{offset, region, count};
  std::vector<uint8_t> r;
  if (Status st = request(vu::kRegionRead, &a, sizeof a, nullptr, 0, &r); !st.ok()) return st;
  if (r.size() != sizeof a + count) return Code::kCorrupted;
  std::memcpy(data, r.data() + sizeof a, count);
  return Code::kSuccess;
}

Status VfioUserClient::region_write(uint32_t region, uint64_t offset, const void* data,
                                    uint32_t count) {
  std::vector<uint8_t> req(sizeof(vu::RegionAccess) + count);
  vu::RegionAccess a{offset, region, count};
  std::memcpy(req.data(), &a, sizeof a);
  std::memcpy(req.data() + sizeof a, data, count);
  std::vector<uint8_t> r;
  return request(vu::kRegionWrite, req.data(), req.size(), nullptr, 0, &r);
}

Status VfioUserClient::dma_map(uint64_t iova, uint64_t size, int fd, uint64_t offset,
                               uint32_t flags) {
  vu::DmaMap m{sizeof m, flags, offset, iova, size};
  std::vector<uint8_t> r;
  return request(vu::kDmaMap, &m, sizeof m, &fd, fd >= 0 ? 1 : 0, &r);
}

Status VfioUserClient::dma_unmap(uint64_t iova, uint64_t size) {
  vu::DmaUnmap u{sizeof u, 0, iova, size};
  std::vector<uint8_t> r;
  return request(vu::kDmaUnmap, &u, sizeof u, nullptr, 0, &r);
}

Status VfioUserClient::set_irq_eventfds(uint32_t start, const std::vector<int>& fds) {
  vu::IrqSet s{sizeof s, vu::kIrqDataEventfd | vu::kIrqActionTrigger, vu::kIrqMsix, start,
               static_cast<uint32_t>(fds.size())};
  std::vector<uint8_t> r;
  // More vectors than one message may carry: send them in groups.
  for (size_t i = 0; i < fds.size(); i += 8) {
    s.start = start + static_cast<uint32_t>(i);
    s.count = static_cast<uint32_t>(std::min<size_t>(8, fds.size() - i));
    if (Status st = request(vu::kDeviceSetIrqs, &s, sizeof s, fds.data() + i,
                            static_cast<int>(s.count), &r);
        !st.ok())
      return st;
  }
  return Code::kSuccess;
}

Status VfioUserClient::mask_irq(uint32_t vector, bool masked) {
  vu::IrqSet s{sizeof s, vu::kIrqDataNone | (masked ? vu::kIrqActionMask : vu::kIrqActionUnmask),
               vu::kIrqMsix, vector, 1};
  std::vector<uint8_t> r;
  return request(vu::kDeviceSetIrqs, &s, sizeof s, nullptr, 0, &r);
}

Status VfioUserClient::reset() {
  std::vector<uint8_t> r;
  return request(vu::kDeviceReset, nullptr, 0, nullptr, 0, &r);
}

}  // namespace dpukv::nvme
