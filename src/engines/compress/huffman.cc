#include "engines/compress/huffman.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace dpukv::huffman {
namespace {

enum Mode : uint8_t { kRaw = 0, kSingle = 1, kHuff = 2 };
constexpr size_t kTableBits = kMaxCodeLen;
constexpr size_t kHeaderHuff = 1 + 4 + 128 + 16;

inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline void store32(uint8_t* p, uint32_t v) {
  std::memcpy(p, &v, 4);
}
inline uint32_t load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Code lengths from frequencies: plain Huffman (two-queue merge over sorted
// leaves), then frequencies are halved until the longest code fits kMaxCodeLen.
void build_lengths(const uint32_t* freq_in, uint8_t* len) {
  std::array<uint32_t, 256> freq;
  std::copy(freq_in, freq_in + 256, freq.begin());
  for (;;) {
    struct Node {
      uint64_t w;
      int16_t left, right;  // children (node index) or -1 for a leaf
      int16_t sym;
    };
    Node nodes[512];
    int leaves[256];
    int nl = 0;
    for (int s = 0; s < 256; ++s)
      if (freq[s]) nodes[nl] = {freq[s], -1, -1, static_cast<int16_t>(s)}, leaves[nl] = nl, ++nl;
    std::sort(leaves, leaves + nl, [&](int a, int b) { return nodes[a].w < nodes[b].w; });
    int nn = nl;  // internal nodes are appended in nondecreasing weight order
    int li = 0, ii = nl;
    auto pick = [&]() {
      if (li < nl && (ii >= nn || nodes[leaves[li]].w <= nodes[ii].w)) return leaves[li++];
      return ii++;
    };
    for (int k = 0; k < nl - 1; ++k) {
      int a = pick(), b = pick();
      nodes[nn] = {nodes[a].w + nodes[b].w, static_cast<int16_t>(a), static_cast<int16_t>(b), -1};
      ++nn;
    }
    // Depths by walking from the root down (parents precede children in reverse).
    uint8_t depth[512] = {};
    int max_len = 0;
    std::memset(len, 0, 256);
    for (int i = nn - 1; i >= 0; --i) {
      if (nodes[i].left >= 0) {
        depth[nodes[i].left] = depth[nodes[i].right] = static_cast<uint8_t>(depth[i] + 1);
      } else {
        len[nodes[i].sym] = depth[i];
        max_len = std::max<int>(max_len, depth[i]);
      }
    }
    if (max_len <= kMaxCodeLen) return;
    for (uint32_t& f : freq)
      if (f) f = std::max<uint32_t>(1, f >> 1);
  }
}

// Canonical codes, bit-reversed for LSB-first streams.
void build_codes(const uint8_t* len, uint16_t* code) {
  uint16_t count[kMaxCodeLen + 1] = {};
  for (int s = 0; s < 256; ++s) ++count[len[s]];
  count[0] = 0;
  uint16_t next[kMaxCodeLen + 2] = {};
  uint16_t c = 0;
  for (int l = 1; l <= kMaxCodeLen; ++l) {
    c = static_cast<uint16_t>((c + count[l - 1]) << 1);
    next[l] = c;
  }
  for (int s = 0; s < 256; ++s) {
    const int l = len[s];
    if (l == 0) continue;
    uint16_t v = next[l]++, r = 0;
    for (int b = 0; b < l; ++b) r = static_cast<uint16_t>(r | (((v >> b) & 1) << (l - 1 - b)));
    code[s] = r;
  }
}

// Branch-free bit writer: after each flush fewer than 8 bits are pending, so five
// codes of at most 11 bits (55) fit before the next flush, which stores 8 bytes and
// advances by the whole bytes written. Needs 8 bytes of slack past the stream; the
// caller encodes streams in order, so a stream's slack is overwritten by the next.
struct BitWriter {
  uint8_t* p;
  uint64_t acc = 0;
  unsigned bits = 0;
  // Code and length from two tables: a shift, an or and an add a symbol (the
  // encoder's cost is its instruction count, not a dependency chain: interleaving
  // the four streams measured no faster).
  inline void put(uint64_t code, unsigned len) {
    acc |= code << bits;
    bits += len;
  }
  inline void flush() {
    std::memcpy(p, &acc, 8);
    p += bits >> 3;
    acc >>= bits & ~7u;
    bits &= 7;
  }
  void finish() {
    flush();
    if (bits) ++p;
  }
};

// Encodes src[0..n) into p (which has n_bytes + 8 bytes of room); returns the end.
// Built twice: for x86-64-v3 (BMI2 shifts) and the baseline, chosen at load time.
__attribute__((target_clones("arch=x86-64-v3", "default"))) uint8_t* encode_stream(
    const uint8_t* src, size_t n, const uint64_t* code, const uint8_t* len, uint8_t* p) {
  BitWriter w{p};
  size_t i = 0;
  for (; i + 5 <= n; i += 5) {
    w.put(code[src[i]], len[src[i]]);
    w.put(code[src[i + 1]], len[src[i + 1]]);
    w.put(code[src[i + 2]], len[src[i + 2]]);
    w.put(code[src[i + 3]], len[src[i + 3]]);
    w.put(code[src[i + 4]], len[src[i + 4]]);
    w.flush();
  }
  for (; i < n; ++i) {
    w.put(code[src[i]], len[src[i]]);
    w.flush();
  }
  w.finish();
  return w.p;
}

size_t encode_block(const uint8_t* src, size_t n, uint8_t* dst, size_t cap) {
  // Returns bytes written, or 0 if it does not fit.
  const size_t q = n / 4;
  const size_t start[5] = {0, q, 2 * q, 3 * q, n};
  // One histogram per stream: their sum is the block's, and with the code lengths
  // they give each stream's exact size without another pass.
  // Two tables per stream, filled for all four streams in one loop, so that a run of
  // one symbol (common after the delta) does not chain every increment on the last.
  uint32_t f[4][256] = {};
  {
    uint32_t g[4][256] = {};
    size_t i = 0;
    for (; i + 2 <= q; i += 2) {
      ++f[0][src[i]], ++g[0][src[i + 1]];
      ++f[1][src[q + i]], ++g[1][src[q + i + 1]];
      ++f[2][src[2 * q + i]], ++g[2][src[2 * q + i + 1]];
      ++f[3][src[3 * q + i]], ++g[3][src[3 * q + i + 1]];
    }
    for (int k = 0; k < 4; ++k)
      for (size_t j = start[k] + i; j < start[k + 1]; ++j) ++f[k][src[j]];
    for (int k = 0; k < 4; ++k)
      for (int x = 0; x < 256; ++x) f[k][x] += g[k][x];
  }
  uint32_t freq[256];
  int distinct = 0, last = 0;
  for (int s = 0; s < 256; ++s) {
    freq[s] = f[0][s] + f[1][s] + f[2][s] + f[3][s];
    if (freq[s]) ++distinct, last = s;
  }
  if (distinct == 1) {
    if (cap < 6) return 0;
    dst[0] = kSingle;
    store32(dst + 1, static_cast<uint32_t>(n));
    dst[5] = static_cast<uint8_t>(last);
    return 6;
  }
  uint8_t len[256];
  uint16_t code[256] = {};
  build_lengths(freq, len);
  build_codes(len, code);
  size_t bytes[4], total = 0;
  for (int k = 0; k < 4; ++k) {
    uint64_t b = 0;
    for (int s = 0; s < 256; ++s) b += static_cast<uint64_t>(f[k][s]) * len[s];
    bytes[k] = (b + 7) / 8;
    total += bytes[k];
  }
  const size_t huff_size = kHeaderHuff + total;
  if (huff_size >= n + 5 || cap < huff_size + 8) {
    if (cap < n + 5) return 0;
    dst[0] = kRaw;
    store32(dst + 1, static_cast<uint32_t>(n));
    std::memcpy(dst + 5, src, n);
    return n + 5;
  }
  dst[0] = kHuff;
  store32(dst + 1, static_cast<uint32_t>(n));
  for (int s = 0; s < 256; s += 2)
    dst[5 + s / 2] = static_cast<uint8_t>(len[s] | (len[s + 1] << 4));
  uint64_t code64[256];
  for (int s = 0; s < 256; ++s) code64[s] = code[s];
  uint8_t* p = dst + kHeaderHuff;
  for (int k = 0; k < 4; ++k) {
    store32(dst + 5 + 128 + 4 * k, static_cast<uint32_t>(bytes[k]));
    uint8_t* e = encode_stream(src + start[k], start[k + 1] - start[k], code64, len, p);
    if (static_cast<size_t>(e - p) != bytes[k]) return 0;  // cannot happen; be safe
    p = e;
  }
  return huff_size;
}

// Decodes `count` symbols from one stream [p, p + size) whose bytes are followed
// by at least `slack` readable bytes up to buf_end.
struct StreamReader {
  const uint8_t* p;
  const uint8_t* end;      // end of this stream
  const uint8_t* buf_end;  // end of readable memory
  uint64_t pos = 0;        // bit position
  inline uint64_t peek() const {
    const uint8_t* q = p + (pos >> 3);
    uint64_t v;
    if (buf_end - q >= 8) {
      v = load64(q);
    } else {
      uint8_t tmp[8] = {};
      if (q < buf_end) std::memcpy(tmp, q, static_cast<size_t>(buf_end - q));
      v = load64(tmp);
    }
    return v >> (pos & 7);
  }
};

// src: the block ([src, src + block_len)); buf_end: end of readable input, which
// the fast path may read up to (never past).
__attribute__((target_clones("arch=x86-64-v3", "default"))) bool decode_block(
    const uint8_t* src, size_t block_len, const uint8_t* buf_end, uint8_t* dst, size_t n) {
  uint8_t len[256];
  for (int s = 0; s < 256; s += 2) {
    len[s] = src[5 + s / 2] & 15;
    len[s + 1] = src[5 + s / 2] >> 4;
  }
  // Validate: lengths <= 11 and a complete prefix code (Kraft sum exactly 1).
  uint32_t kraft = 0;
  for (int s = 0; s < 256; ++s) {
    if (len[s] > kMaxCodeLen) return false;
    if (len[s]) kraft += 1u << (kMaxCodeLen - len[s]);
  }
  if (kraft != (1u << kMaxCodeLen)) return false;
  uint16_t code[256] = {};
  build_codes(len, code);
  // Single-symbol table: (sym << 4) | len.
  static thread_local uint16_t table[1 << kTableBits];
  for (int s = 0; s < 256; ++s) {
    if (!len[s]) continue;
    const uint16_t e = static_cast<uint16_t>((s << 4) | len[s]);
    for (uint32_t idx = code[s]; idx < (1u << kTableBits); idx += 1u << len[s]) table[idx] = e;
  }
  // Multi-symbol table: up to three symbols whose codes fit together in the 11 bits
  // of the index: bytes 0-2 the symbols, bits 24-25 their count, bits 28-31 the
  // total length. Short codes (the common case on delta-coded planes) then decode
  // two or three at a time.
  static thread_local uint32_t multi[1 << kTableBits];
  for (uint32_t idx = 0; idx < (1u << kTableBits); ++idx) {
    uint32_t e = 0, used = 0, n_syms = 0;
    while (n_syms < 3) {
      const uint16_t t1 = table[(idx >> used) & ((1u << kTableBits) - 1)];
      const uint32_t l = t1 & 15;
      if (used + l > kTableBits) break;  // this code needs bits beyond the index
      e |= static_cast<uint32_t>(t1 >> 4) << (8 * n_syms);
      used += l;
      ++n_syms;
    }
    multi[idx] = e | (n_syms << 24) | (used << 28);
  }
  size_t sizes[4];
  for (int k = 0; k < 4; ++k) sizes[k] = load32(src + 5 + 128 + 4 * k);
  (void)block_len;  // the caller checked that the four sizes fit in it
  const uint8_t* data = src + kHeaderHuff;
  StreamReader r[4];
  size_t off = 0;
  for (int k = 0; k < 4; ++k) {
    r[k].p = data + off;
    off += sizes[k];
    r[k].end = data + off;
    r[k].buf_end = buf_end;
  }
  const size_t q = n / 4;
  constexpr uint64_t kMask = (1u << kTableBits) - 1;
  uint8_t* out[4] = {dst, dst + q, dst + 2 * q, dst + 3 * q};
  uint8_t* const out_end[4] = {dst + q, dst + 2 * q, dst + 3 * q, dst + n};
  // Fast loop: five lookups per stream per 64-bit load (5 x 11 bits <= 57 valid
  // bits), each writing 4 bytes and advancing by 1-3 symbols. It runs while every
  // stream has 8 readable input bytes and 16 bytes of its own output left.
  for (;;) {
    bool ok = true;
    for (int k = 0; k < 4; ++k)
      ok &= buf_end - (r[k].p + (r[k].pos >> 3)) >= 8 && out_end[k] - out[k] >= 16;
    if (!ok) break;
    // Named locals, not arrays: the 4-byte stores must not look like they alias
    // the decoder's own state.
    uint8_t *o0 = out[0], *o1 = out[1], *o2 = out[2], *o3 = out[3];
    const uint64_t v0 = load64(r[0].p + (r[0].pos >> 3)) >> (r[0].pos & 7);
    const uint64_t v1 = load64(r[1].p + (r[1].pos >> 3)) >> (r[1].pos & 7);
    const uint64_t v2 = load64(r[2].p + (r[2].pos >> 3)) >> (r[2].pos & 7);
    const uint64_t v3 = load64(r[3].p + (r[3].pos >> 3)) >> (r[3].pos & 7);
    unsigned c0 = 0, c1 = 0, c2 = 0, c3 = 0;
    for (int j = 0; j < 5; ++j) {
      const uint32_t e0 = multi[(v0 >> c0) & kMask];
      const uint32_t e1 = multi[(v1 >> c1) & kMask];
      const uint32_t e2 = multi[(v2 >> c2) & kMask];
      const uint32_t e3 = multi[(v3 >> c3) & kMask];
      std::memcpy(o0, &e0, 4);
      std::memcpy(o1, &e1, 4);
      std::memcpy(o2, &e2, 4);
      std::memcpy(o3, &e3, 4);
      o0 += (e0 >> 24) & 3, o1 += (e1 >> 24) & 3, o2 += (e2 >> 24) & 3, o3 += (e3 >> 24) & 3;
      c0 += e0 >> 28, c1 += e1 >> 28, c2 += e2 >> 28, c3 += e3 >> 28;
    }
    out[0] = o0, out[1] = o1, out[2] = o2, out[3] = o3;
    r[0].pos += c0, r[1].pos += c1, r[2].pos += c2, r[3].pos += c3;
  }
  // Tails, one symbol at a time.
  for (int k = 0; k < 4; ++k) {
    while (out[k] < out_end[k]) {
      const uint16_t e = table[r[k].peek() & kMask];
      *out[k]++ = static_cast<uint8_t>(e >> 4);
      r[k].pos += e & 15;
    }
  }
  // Every stream must have ended inside its own bytes.
  for (int k = 0; k < 4; ++k)
    if ((r[k].pos + 7) / 8 > static_cast<uint64_t>(r[k].end - r[k].p)) return false;
  return true;
}

}  // namespace

size_t bound(size_t n) {
  const size_t blocks = (n + kBlockSymbols - 1) / kBlockSymbols;
  return n + 5 * (blocks ? blocks : 1);
}

Status compress(const uint8_t* src, size_t n, uint8_t* dst, size_t cap, size_t* out_len) {
  size_t off = 0;
  for (size_t i = 0; i < n; i += kBlockSymbols) {
    const size_t b = std::min(kBlockSymbols, n - i);
    const size_t w = encode_block(src + i, b, dst + off, cap - off);
    if (w == 0) return Code::kTooBig;
    off += w;
  }
  *out_len = off;
  return Code::kSuccess;
}

Status decompress(const uint8_t* src, size_t src_len, uint8_t* dst, size_t n, size_t* consumed) {
  size_t off = 0, done = 0;
  while (done < n) {
    if (src_len - off < 5) return Code::kCorrupted;
    const uint8_t mode = src[off];
    const size_t bn = load32(src + off + 1);
    if (bn == 0 || bn > kMaxBlockSymbols || bn > n - done) return Code::kCorrupted;
    if (mode == kRaw) {
      if (src_len - off - 5 < bn) return Code::kCorrupted;
      std::memcpy(dst + done, src + off + 5, bn);
      off += 5 + bn;
    } else if (mode == kSingle) {
      if (src_len - off < 6) return Code::kCorrupted;
      std::memset(dst + done, src[off + 5], bn);
      off += 6;
    } else if (mode == kHuff) {
      if (src_len - off < kHeaderHuff) return Code::kCorrupted;
      uint64_t total = 0;
      for (int k = 0; k < 4; ++k) total += load32(src + off + 5 + 128 + 4 * k);
      if (total > src_len - off - kHeaderHuff) return Code::kCorrupted;
      const size_t block_len = kHeaderHuff + static_cast<size_t>(total);
      if (!decode_block(src + off, block_len, src + src_len, dst + done, bn))
        return Code::kCorrupted;
      off += block_len;
    } else {
      return Code::kCorrupted;
    }
    done += bn;
  }
  *consumed = off;
  return Code::kSuccess;
}

}  // namespace dpukv::huffman
