#include "cluster/directory/directory_keys.h"

#include <algorithm>
#include <cstring>

namespace dpukv {

void DirectoryKeys::format(char* p, char kind, const ChunkKey& k) const {
  std::memcpy(p, prefix_.data(), prefix_.size());
  p += prefix_.size();
  *p++ = ':';
  *p++ = kind;
  *p++ = ':';
  const uint64_t w[4] = {k.model, k.prefix_hash, (uint64_t{k.world_size} << 32) | k.rank, k.layout};
  std::memcpy(p, w, sizeof(w));
}

std::string DirectoryKeys::holders_key(const ChunkKey& k) const {
  std::string s(chunk_key_size(), '\0');
  format(s.data(), 'c', k);
  return s;
}

std::string DirectoryKeys::value_key(const ChunkKey& k) const {
  std::string s(chunk_key_size(), '\0');
  format(s.data(), 'v', k);
  return s;
}

std::string DirectoryKeys::node_key(uint64_t node) const {
  return prefix_ + ":n:" + hex16(node);
}

bool DirectoryKeys::parse_holders_key(const char* p, size_t len, ChunkKey* k) const {
  const size_t pl = prefix_.size();
  if (len != chunk_key_size() || std::memcmp(p, prefix_.data(), pl) != 0 || p[pl] != ':' ||
      p[pl + 1] != 'c' || p[pl + 2] != ':')
    return false;
  p += pl + 3;
  uint64_t w[4];
  std::memcpy(w, p, sizeof(w));
  k->model = w[0];
  k->prefix_hash = w[1];
  k->world_size = static_cast<uint32_t>(w[2] >> 32);
  k->rank = static_cast<uint32_t>(w[2]);
  k->layout = w[3];
  return true;
}

void DirectoryKeys::put_hex16(char* p, uint64_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  for (int i = 15; i >= 0; --i, v >>= 4) p[i] = kDigits[v & 15];
}

std::string DirectoryKeys::hex16(uint64_t v) {
  std::string s(16, '0');
  put_hex16(s.data(), v);
  return s;
}

bool DirectoryKeys::parse_hex16(const char* s, size_t n, uint64_t* out) {
  if (n != 16) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) {
    const char c = s[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

bool DirectoryKeys::parse_holders(const char* s, size_t len, std::vector<uint64_t>* out) {
  const size_t first = out->size();
  if (len > 1 + kMaxHolders * 17 || len == 0 || s[0] != ',' || (len - 1) % 17 != 0) return false;
  for (size_t i = 1; i + 17 <= len; i += 17) {
    uint64_t node;
    if (!parse_hex16(s + i, 16, &node) || s[i + 16] != ',') {
      out->resize(first);
      return false;
    }
    if (std::find(out->begin() + static_cast<long>(first), out->end(), node) == out->end())
      out->push_back(node);
  }
  return true;
}

}  // namespace dpukv
