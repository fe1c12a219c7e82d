#include "nvmf/vfio_user/dma_map_table.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "runtime/log.h"
#include "runtime/mem_region.h"

namespace dpukv::nvme {

Status DmaMapTable::add(uint64_t iova, uint64_t size, int fd, uint64_t offset, uint32_t prot) {
  const uint64_t page = page_size();
  if (size == 0 || iova + size < iova || (prot & ~(kRead | kWrite)) != 0 || prot == 0)
    return Code::kInvalidValue;
  if (fd < 0) return Code::kNotSupported;  // DMA_READ/WRITE messages are not implemented
  if (windows_.size() >= kMaxMaps) return Code::kFull;
  if (overlaps(iova, size)) return Code::kBadState;
  struct stat sb {};
  if (fstat(fd, &sb) != 0) return Code::kInvalidValue;
  // A window past the end of a regular file or memfd would SIGBUS on first touch.
  if ((S_ISREG(sb.st_mode) && (offset > static_cast<uint64_t>(sb.st_size) ||
                               size > static_cast<uint64_t>(sb.st_size) - offset)))
    return Code::kInvalidValue;
  uint64_t delta = offset % page;
  size_t len = static_cast<size_t>(size + delta);
  int mprot = ((prot & kRead) ? PROT_READ : 0) | ((prot & kWrite) ? PROT_WRITE : 0);
  void* m = mmap(nullptr, len, mprot, MAP_SHARED, fd, static_cast<off_t>(offset - delta));
  if (m == MAP_FAILED) {
    LOG_ERR("dma map iova 0x%llx size 0x%llx: mmap failed", static_cast<unsigned long long>(iova),
            static_cast<unsigned long long>(size));
    return Code::kInvalidValue;
  }
  auto w = std::make_unique<Window>();
  w->iova = iova;
  w->size = size;
  w->host = static_cast<uint8_t*>(m) + delta;
  w->mapping = m;
  w->mapping_len = len;
  w->prot = prot;
  uint32_t access = (prot & kWrite) ? kAccessLocalReadWrite : kAccessLocalRead;
  if (Status st = Mmap::create(w->host, static_cast<size_t>(size), access, -1, 0, &w->map); st.ok())
    (void)w->map->start();
  auto pos =
      std::lower_bound(windows_.begin(), windows_.end(), iova,
                       [](const std::unique_ptr<Window>& a, uint64_t v) { return a->iova < v; });
  windows_.insert(pos, std::move(w));
  return Code::kSuccess;
}

Status DmaMapTable::remove(uint64_t iova, uint64_t size) {
  for (auto it = windows_.begin(); it != windows_.end(); ++it) {
    if ((*it)->iova != iova) continue;
    if ((*it)->size != size) return Code::kInvalidValue;
    if ((*it)->map) (void)(*it)->map->stop();
    munmap((*it)->mapping, (*it)->mapping_len);
    windows_.erase(it);
    last_ = nullptr;
    return Code::kSuccess;
  }
  return Code::kNotFound;
}

void DmaMapTable::clear() {
  for (auto& w : windows_) {
    if (w->map) (void)w->map->stop();
    munmap(w->mapping, w->mapping_len);
  }
  windows_.clear();
  last_ = nullptr;
}

bool DmaMapTable::overlaps(uint64_t iova, uint64_t len) const {
  for (const auto& w : windows_)
    if (iova < w->iova + w->size && w->iova < iova + len) return true;
  return false;
}

const DmaMapTable::Window* DmaMapTable::find(uint64_t iova) const {
  auto it =
      std::upper_bound(windows_.begin(), windows_.end(), iova,
                       [](uint64_t v, const std::unique_ptr<Window>& a) { return v < a->iova; });
  if (it == windows_.begin()) return nullptr;
  const Window* w = (it - 1)->get();
  return iova - w->iova < w->size ? w : nullptr;
}

}  // namespace dpukv::nvme
