#include "cache/ghost_window.h"

#include <algorithm>

namespace dpukv {
namespace {

// Two independent halves of a well-mixed hash drive the probes (Kirsch and
// Mitzenmacher's double hashing); the key hashes are mixed once more, as the
// cache's own index already uses their low bits.
struct Probe {
  uint64_t a, b;
  explicit Probe(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    a = h;
    b = (h >> 32 | h << 32) | 1;
  }
  // The i-th bit index among n.
  uint64_t bit(unsigned i, uint64_t n) const {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(a + i * b) * n) >> 64);
  }
};

}  // namespace

GhostWindow::GhostWindow(size_t max_capacity)
    : max_per_generation_(std::max<size_t>((max_capacity + kGenerations - 1) / kGenerations, 1)),
      stride_(words_for(max_per_generation_)),
      per_generation_(max_per_generation_),
      bits_(stride_ * kGenerations, 0) {}  // each generation starts at its first put

void GhostWindow::set_capacity(size_t capacity) {
  per_generation_ =
      std::clamp<size_t>((capacity + kGenerations - 1) / kGenerations, 1, max_per_generation_);
}

// Generation g, cleared, at the length the window has now.
void GhostWindow::start_generation(size_t g) {
  std::fill_n(bits_.begin() + static_cast<std::ptrdiff_t>(g * stride_), words_[g], 0);
  size_ -= counts_[g];
  counts_[g] = 0;
  limits_[g] = per_generation_;
  words_[g] = words_for(per_generation_);
}

bool GhostWindow::contains(uint64_t key_hash) const {
  const Probe p(key_hash);
  for (size_t g = 0; g < kGenerations; ++g) {
    if (counts_[g] == 0) continue;
    const uint64_t* w = bits_.data() + g * stride_;
    const uint64_t n = words_[g] * 64;
    unsigned i = 0;
    while (i < kProbes) {
      const uint64_t b = p.bit(i, n);
      if ((w[b / 64] >> (b % 64) & 1) == 0) break;
      ++i;
    }
    if (i == kProbes) return true;
  }
  return false;
}

void GhostWindow::put(uint64_t key_hash) {
  if (counts_[newest_] >= limits_[newest_]) {
    newest_ = (newest_ + 1) % kGenerations;
    start_generation(newest_);
  }
  const Probe p(key_hash);
  uint64_t* w = bits_.data() + newest_ * stride_;
  const uint64_t n = words_[newest_] * 64;
  for (unsigned i = 0; i < kProbes; ++i) {
    const uint64_t b = p.bit(i, n);
    w[b / 64] |= uint64_t{1} << (b % 64);
  }
  ++counts_[newest_];
  ++size_;
}

}  // namespace dpukv
