#include "cluster/directory/directory_replica.h"

#include <algorithm>

namespace dpukv {

void DirectoryReplica::add(const ChunkKey& k, uint64_t node) {
  auto it = map_.find(k);
  if (it == map_.end()) {
    if (map_.size() >= max_keys_) {
      overflow_ = true;
      return;
    }
    it = map_.emplace(k, Holders{}).first;
  }
  Holders& h = it->second;
  if (std::find(h.node.begin(), h.node.begin() + h.n, node) != h.node.begin() + h.n) return;
  if (h.n < kMaxHolders) h.node[h.n++] = node;
}

void DirectoryReplica::drop(const ChunkKey& k, uint64_t node) {
  auto it = map_.find(k);
  if (it == map_.end()) return;
  Holders& h = it->second;
  auto* end = h.node.begin() + h.n;
  auto* at = std::find(h.node.begin(), end, node);
  if (at == end) return;
  *at = *(end - 1);
  if (--h.n == 0) map_.erase(it);
}

void DirectoryReplica::find(const ChunkKey& k, std::vector<uint64_t>* out) const {
  auto it = map_.find(k);
  if (it == map_.end()) return;
  out->insert(out->end(), it->second.node.begin(), it->second.node.begin() + it->second.n);
}

}  // namespace dpukv
