// Fuzzes the NVMe controller with submission queue entries: a function with a
// 1 MiB DMA window, an enabled controller and one I/O queue pair, then the input
// as 65-byte records (1 control byte + one 64-byte SQE). The control byte picks
// the admin or the I/O queue and, sometimes, a raw doorbell value instead of the
// right one. PRPs, opcodes, queue ids and sizes are whatever the fuzzer writes:
// the controller must answer with a status or a fatal state, never touch memory
// outside the window (ASan guards the rest of the heap; the window is surrounded
// by unmapped guard pages), and never crash.
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

constexpr uint64_t kIova = 0x100000, kWindow = 1 << 20;
constexpr uint64_t kAdminSq = kIova, kAdminCq = kIova + 0x1000, kIoSq = kIova + 0x2000,
                   kIoCq = kIova + 0x3000;
constexpr uint32_t kEntries = 16;

struct Harness {
  std::unique_ptr<NvmePciFunction> fn;
  uint8_t* mem = nullptr;
  std::vector<uint8_t> reply;
  std::vector<int> reply_fds;
  uint32_t admin_tail = 0, io_tail = 0, admin_head = 0, io_head = 0;

  void send(uint16_t cmd, const void* p, size_t n, int* fds = nullptr, int nfds = 0) {
    vu::Header h{1, cmd, static_cast<uint32_t>(sizeof h + n), vu::kFlagCommand, 0};
    std::vector<uint8_t> m(sizeof h + n);
    std::memcpy(m.data(), &h, sizeof h);
    std::memcpy(m.data() + sizeof h, p, n);
    fn->handle(m.data(), m.size(), fds, nfds, &reply, &reply_fds);
  }
  void write_bar0(uint64_t off, uint64_t v, uint32_t size) {
    std::vector<uint8_t> p(sizeof(vu::RegionAccess) + size);
    vu::RegionAccess a{off, vu::kBar0, size};
    std::memcpy(p.data(), &a, sizeof a);
    std::memcpy(p.data() + sizeof a, &v, size);
    send(vu::kRegionWrite, p.data(), p.size());
  }
  void submit(bool admin, const Sqe& e, bool raw_doorbell, uint32_t raw) {
    uint64_t sq = admin ? kAdminSq : kIoSq;
    uint32_t& tail = admin ? admin_tail : io_tail;
    std::memcpy(mem + (sq - kIova) + tail * 64, &e, 64);
    tail = (tail + 1) % kEntries;
    write_bar0(kDoorbellBase + (admin ? 0 : 8), raw_doorbell ? raw : tail, 4);
    fn->poll();
    // Consume completions so the CQ never stays full.
    write_bar0(kDoorbellBase + 4, admin_tail, 4);
    write_bar0(kDoorbellBase + 12, io_tail, 4);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bool quiet = [] {
    log_set_level(LogSource::kLib, LogLevel::kCritical);
    return true;
  }();
  (void)quiet;
  static std::shared_ptr<Bdev> bdev = [] {
    std::unique_ptr<Bdev> b;
    if (!create_malloc_bdev("fuzz", 512, 4096, &b).ok()) abort();
    return std::shared_ptr<Bdev>(std::move(b));
  }();
  Harness h;
  FunctionConfig cfg;
  cfg.controller.num_vectors = 4;
  cfg.controller.max_io_queues = 4;
  if (!NvmePciFunction::create(cfg, nullptr, &h.fn).ok()) abort();
  if (!h.fn->add_namespace(1, bdev).ok()) abort();
  vu::Version v{0, 1};
  h.send(vu::kVersion, &v, sizeof v);
  int mfd = memfd_create("fuzz-dma", MFD_CLOEXEC);
  if (mfd < 0 || ftruncate(mfd, kWindow) != 0) abort();
  h.mem = static_cast<uint8_t*>(mmap(nullptr, kWindow, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0));
  if (h.mem == MAP_FAILED) abort();
  vu::DmaMap dm{sizeof dm, vu::kDmaRead_ | vu::kDmaWrite_, 0, kIova, kWindow};
  h.send(vu::kDmaMap, &dm, sizeof dm, &mfd, 1);
  h.write_bar0(kRegAqa, (kEntries - 1) << 16 | (kEntries - 1), 4);
  h.write_bar0(kRegAsq, kAdminSq, 8);
  h.write_bar0(kRegAcq, kAdminCq, 8);
  h.write_bar0(kRegCc, kCcEn | 6u << 16 | 4u << 20, 4);
  Sqe c{};
  c.opc = kAdminCreateCq;
  c.prp1 = kIoCq;
  c.cdw10 = (kEntries - 1) << 16 | 1;
  c.cdw11 = 1;
  h.submit(true, c, false, 0);
  c = Sqe{};
  c.opc = kAdminCreateSq;
  c.prp1 = kIoSq;
  c.cdw10 = (kEntries - 1) << 16 | 1;
  c.cdw11 = 1 | 1u << 16;
  h.submit(true, c, false, 0);
  for (size_t pos = 0; pos + 65 <= size; pos += 65) {
    uint8_t ctl = data[pos];
    Sqe e;
    std::memcpy(&e, data + pos + 1, 64);
    h.submit((ctl & 1) != 0, e, (ctl & 0x0e) == 0x0e, ctl >> 4);
  }
  munmap(h.mem, kWindow);
  return 0;
}
