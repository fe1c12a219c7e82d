// Fuzzes the vfio-user protocol engine of the emulated NVMe function: the input is
// cut into messages (2-byte little-endian length prefixes) and handed to
// NvmePciFunction::handle() exactly as the server's framing would. The first
// byte chooses whether a valid VERSION and a DMA window (a memfd) go first, so
// both the handshake and everything behind it are reached; the controller is
// polled after every message so register writes that enable it take effect.
// The function must never crash, and every reply must be well formed.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "nvmf/bdev/bdev_malloc.h"
#include "nvmf/vfio_user/nvme_pci_function.h"
#include "runtime/log.h"

using namespace dpukv;
using namespace dpukv::nvme;
namespace vu = dpukv::vfio_user;

namespace {

std::vector<uint8_t> message(uint16_t cmd, const void* payload, size_t n) {
  vu::Header h{1, cmd, static_cast<uint32_t>(sizeof h + n), vu::kFlagCommand, 0};
  std::vector<uint8_t> m(sizeof h + n);
  std::memcpy(m.data(), &h, sizeof h);
  if (n > 0) std::memcpy(m.data() + sizeof h, payload, n);
  return m;
}

void check_reply(const std::vector<uint8_t>& r) {
  if (r.empty()) return;
  vu::Header h;
  if (r.size() < sizeof h) abort();
  std::memcpy(&h, r.data(), sizeof h);
  if (h.msg_size != r.size() || (h.flags & vu::kFlagTypeMask) != vu::kFlagReply) abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bool quiet = [] {
    log_set_level(LogSource::kLib, LogLevel::kCritical);
    return true;
  }();
  (void)quiet;
  static std::shared_ptr<Bdev> bdev = [] {
    std::unique_ptr<Bdev> b;
    if (!create_malloc_bdev("fuzz", 256, 4096, &b).ok()) abort();
    return std::shared_ptr<Bdev>(std::move(b));
  }();
  if (size == 0) return 0;
  FunctionConfig cfg;
  cfg.controller.num_vectors = 4;
  std::unique_ptr<NvmePciFunction> fn;
  if (!NvmePciFunction::create(cfg, nullptr, &fn).ok()) abort();
  if (!fn->add_namespace(1, bdev).ok()) abort();
  std::vector<uint8_t> reply;
  std::vector<int> reply_fds;
  if (data[0] & 1) {
    vu::Version v{0, 1};
    auto m = message(vu::kVersion, &v, sizeof v);
    fn->handle(m.data(), m.size(), nullptr, 0, &reply, &reply_fds);
    int mfd = memfd_create("fuzz-dma", MFD_CLOEXEC);
    if (mfd < 0 || ftruncate(mfd, 1 << 20) != 0) abort();
    vu::DmaMap dm{sizeof dm, vu::kDmaRead_ | vu::kDmaWrite_, 0, 0x100000, 1 << 20};
    m = message(vu::kDmaMap, &dm, sizeof dm);
    fn->handle(m.data(), m.size(), &mfd, 1, &reply, &reply_fds);  // takes the fd
  }
  size_t pos = 1;
  while (pos + 2 <= size) {
    size_t n = data[pos] | size_t{data[pos + 1]} << 8;
    pos += 2;
    n = std::min(n, size - pos);
    std::vector<uint8_t> msg(data + pos, data + pos + n);  // exact size: ASan sees overreads
    pos += n;
    fn->handle(msg.data(), msg.size(), nullptr, 0, &reply, &reply_fds);
    check_reply(reply);
    fn->poll();
  }
  return 0;
}
