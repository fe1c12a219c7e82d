#include "cluster/remote_tier.h"

#include <cstring>
#include <memory>

namespace dpukv {

struct RemoteTier::Get {
  RemoteTier* tier;
  std::vector<ChunkKey> keys;
  GetCb cb;
  void* arg;
};

void RemoteTier::on_present(const ChunkKey& k) {
  if (arrivals_.erase(k) == 0) uploads_.push_back(k);
}

size_t RemoteTier::poll() {
  const size_t queued = uploads_.size();
  for (int i = 0; i < 16 && !uploads_.empty(); ++i) {
    const ChunkKey k = uploads_.back();
    uploads_.pop_back();
    ChunkPlacement p;
    if (!cache_->locate(k, &p).ok()) continue;  // gone, or only on disk already
    void* base;
    uint64_t len;
    cache_->arena(&base, &len);
    const TierValue h{kTierMagic, static_cast<uint8_t>(p.encoded), {}, p.size, p.stored, p.checksum,
                      k};
    std::string v(reinterpret_cast<const char*>(&h), sizeof(h));
    v.append(static_cast<const char*>(base) + p.offset, p.stored);  // hiredis copies it
    cache_->unpin(&k, 1);
    dir_->put_value(k, std::move(v));
    ++counters_.puts;
  }
  return queued;
}

Status RemoteTier::get(std::vector<ChunkKey> keys, GetCb cb, void* arg) {
  if (keys.empty() || cb == nullptr) return Code::kInvalidValue;
  auto g = std::make_unique<Get>(Get{this, std::move(keys), cb, arg});
  DPUKV_RETURN_IF_ERROR(dir_->get_values(g->keys.data(), static_cast<uint32_t>(g->keys.size()),
                                         &RemoteTier::on_values, g.get()));
  g.release();  // on_values owns it
  return Code::kSuccess;
}

void RemoteTier::on_values(void* arg, Status st, const std::vector<std::string>& values) {
  std::unique_ptr<Get> g(static_cast<Get*>(arg));
  RemoteTier* self = g->tier;
  std::vector<uint8_t> got(g->keys.size(), 0);
  for (size_t j = 0; st.ok() && !self->stopping_ && j < values.size() && j < got.size(); ++j) {
    const std::string& v = values[j];
    if (v.empty()) break;  // leading keys only
    TierValue h;
    if (v.size() < sizeof(h)) {
      ++self->counters_.rejects;
      break;
    }
    std::memcpy(&h, v.data(), sizeof(h));
    const ChunkKey& k = g->keys[j];
    if (h.magic != kTierMagic || h.encoded > 1 || v.size() - sizeof(h) != h.stored ||
        !(h.key == k)) {  // another chunk's value under this key
      ++self->counters_.rejects;
      break;
    }
    const ChunkPlacement p{0, h.stored, h.size, h.checksum, h.encoded != 0};
    uint8_t* dst = nullptr;
    Status in = self->cache_->begin_ingest(k, p, &dst);
    if (in == Code::kBadState) {  // here already
      got[j] = self->cache_->contains(k) ? 1 : 0;
      continue;
    }
    if (!in.ok()) {
      if (in == Code::kNoMemory) ++self->counters_.no_room;
      break;
    }
    std::memcpy(dst, v.data() + sizeof(h), h.stored);
    self->mark_arrival(k);  // its arrival must not write it back to the tier
    in = self->cache_->end_ingest(k, true);
    if (!in.ok()) {
      self->arrival_failed(k);
      ++self->counters_.rejects;
      break;
    }
    got[j] = 1;
    ++self->counters_.hits;
    self->counters_.bytes += h.size;
  }
  g->cb(g->arg, got.data(), static_cast<uint32_t>(got.size()));
}

}  // namespace dpukv
