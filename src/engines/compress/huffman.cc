#include "engines/compress/huffman.h"

#include <algorithm>
#include <array>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <cstring>
#include <memory>

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

// The coder's loops are built twice, from one body each: for x86-64-v3 (BMI2's
// shifts that take any register, LZCNT) and portable (any CPU, what the DPU's Arm
// cores run). The path is chosen at start by the CPU, or forced (use_portable).
#define DPUKV_HUFF_BODY inline __attribute__((always_inline))
#if defined(__x86_64__)
#define DPUKV_HUFF_V3 __attribute__((target("arch=x86-64-v3")))
// The features x86-64-v3 lets the compiler use (clang 14 has no name for the level).
bool cpu_has_x86_64_v3() {
  unsigned a, b, c, d;
  const bool f16c_movbe = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) && (c & bit_MOVBE);
  const bool lzcnt = __get_cpuid(0x80000001, &a, &b, &c, &d) && (c & bit_LZCNT);
  return f16c_movbe && lzcnt && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi") &&
         __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("fma");
}
bool g_portable = !cpu_has_x86_64_v3();
#else
bool g_portable = true;
#endif

// The last symbols of a stream, one at a time; returns the stream's end.
DPUKV_HUFF_BODY uint8_t* encode_tail(BitWriter w, const uint8_t* src, size_t i, size_t n,
                                     const uint64_t* code, const uint8_t* len) {
  for (; i < n; ++i) {
    w.put(code[src[i]], len[src[i]]);
    w.flush();
  }
  w.finish();
  return w.p;
}

// Encodes src[0..n) into p (which has n_bytes + 8 bytes of room); returns the end.
DPUKV_HUFF_BODY uint8_t* encode_stream_body(const uint8_t* src, size_t n, const uint64_t* code,
                                            const uint8_t* len, uint8_t* p) {
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
  return encode_tail(w, src, i, n, code, len);
}

// The same bits, two symbols a lookup: pair[a | b << 8] = (code of a then b) << 5 |
// their length (at most 22 bits, 22). Two pairs and a symbol (55 bits) go between
// flushes. Fewer instructions a symbol than encode_stream, which is what the encoder
// spends its time on; only pairs of symbols in the block are filled.
DPUKV_HUFF_BODY uint8_t* encode_stream_pairs_body(const uint8_t* src, size_t n,
                                                  const uint32_t* pair, const uint64_t* code,
                                                  const uint8_t* len, uint8_t* p) {
  BitWriter w{p};
  size_t i = 0;
  for (; i + 5 <= n; i += 5) {
    uint16_t a, b;
    std::memcpy(&a, src + i, 2);
    std::memcpy(&b, src + i + 2, 2);
    const uint32_t ea = pair[a], eb = pair[b];
    w.put(ea >> 5, ea & 31);
    w.put(eb >> 5, eb & 31);
    w.put(code[src[i + 4]], len[src[i + 4]]);
    w.flush();
  }
  return encode_tail(w, src, i, n, code, len);
}

#if defined(__x86_64__)
DPUKV_HUFF_V3 uint8_t* encode_stream_v3(const uint8_t* src, size_t n, const uint64_t* code,
                                        const uint8_t* len, uint8_t* p) {
  return encode_stream_body(src, n, code, len, p);
}
DPUKV_HUFF_V3 uint8_t* encode_stream_pairs_v3(const uint8_t* src, size_t n, const uint32_t* pair,
                                              const uint64_t* code, const uint8_t* len,
                                              uint8_t* p) {
  return encode_stream_pairs_body(src, n, pair, code, len, p);
}
#endif
uint8_t* encode_stream(const uint8_t* src, size_t n, const uint64_t* code, const uint8_t* len,
                       uint8_t* p) {
#if defined(__x86_64__)
  if (!g_portable) return encode_stream_v3(src, n, code, len, p);
#endif
  return encode_stream_body(src, n, code, len, p);
}
uint8_t* encode_stream_pairs(const uint8_t* src, size_t n, const uint32_t* pair,
                             const uint64_t* code, const uint8_t* len, uint8_t* p) {
#if defined(__x86_64__)
  if (!g_portable) return encode_stream_pairs_v3(src, n, pair, code, len, p);
#endif
  return encode_stream_pairs_body(src, n, pair, code, len, p);
}

// A block with more distinct symbols than this is coded a symbol at a time: filling
// the pairs would cost more than it saves (and such a block is near raw anyway).
constexpr int kMaxPairSymbols = 96;

// The pair table, 256 KiB, made once per thread on its first block (kept off the
// static TLS block, which every thread of the process would carry).
uint32_t* pair_table() {
  static thread_local std::unique_ptr<uint32_t[]> table;
  if (!table) table = std::make_unique<uint32_t[]>(1 << 16);
  return table.get();
}

size_t encode_block(const uint8_t* src, size_t n, uint8_t* dst, size_t cap) {
  // Returns bytes written, or 0 if it does not fit.
  const size_t q = n / 4;
  const size_t start[5] = {0, q, 2 * q, 3 * q, n};
  // One histogram per stream: their sum is the block's, and with the code lengths
  // they give each stream's exact size without another pass.
  // Two tables per stream, filled for all four streams in one loop, so that a run of
  // one symbol (common after the delta) does not chain every increment on the last.
  // (Eight-byte loads split by shifts, and four tables per stream, measured slower.)
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
  uint32_t* pair = nullptr;
  if (distinct <= kMaxPairSymbols) {
    int used[256], u = 0;
    for (int s = 0; s < 256; ++s)
      if (freq[s]) used[u++] = s;
    pair = pair_table();
    for (int x = 0; x < u; ++x) {
      const int a = used[x];
      for (int y = 0; y < u; ++y) {
        const int b = used[y];
        pair[a | b << 8] =
            static_cast<uint32_t>((code[a] | code[b] << len[a]) << 5 | (len[a] + len[b]));
      }
    }
  }
  uint8_t* p = dst + kHeaderHuff;
  for (int k = 0; k < 4; ++k) {
    store32(dst + 5 + 128 + 4 * k, static_cast<uint32_t>(bytes[k]));
    const size_t m = start[k + 1] - start[k];
    uint8_t* e = pair ? encode_stream_pairs(src + start[k], m, pair, code64, len, p)
                      : encode_stream(src + start[k], m, code64, len, p);
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
DPUKV_HUFF_BODY bool decode_block_body(const uint8_t* src, size_t block_len, const uint8_t* buf_end,
                                       uint8_t* dst, size_t n) {
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
  // Multi-symbol table: up to four symbols whose codes fit together in the 11 bits
  // of the index: bits 0-7 their total length, bits 8-15 their count, bits 16-47
  // the symbols. Short codes (the common case on delta-coded planes) then decode
  // up to four at a time, and the total length in the low bits is a shift count as
  // it is (x86 shifts take the low six bits), so each stream's chain from one lookup
  // to the next is a shift, a mask and a load.
  static thread_local uint64_t multi[1 << kTableBits];
  for (uint32_t idx = 0; idx < (1u << kTableBits); ++idx) {
    uint64_t e = 0;
    uint32_t used = 0, n_syms = 0;
    while (n_syms < 4) {
      const uint16_t t1 = table[(idx >> used) & ((1u << kTableBits) - 1)];
      const uint32_t l = t1 & 15;
      if (used + l > kTableBits) break;  // this code needs bits beyond the index
      e |= static_cast<uint64_t>(t1 >> 4) << (16 + 8 * n_syms);
      used += l;
      ++n_syms;
    }
    multi[idx] = e | (n_syms << 8) | used;
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
  // bits), each writing 4 bytes and advancing by 1-4 symbols. A round needs 8
  // readable input bytes and 20 bytes of its stream's own output, and moves at most
  // 7 and 20: the rounds every stream can take are counted first, then run
  // without checks. A sentinel bit above the bits a round can use gives the bits
  // it used (the leading zeros), so no stream keeps a count.
  const uint64_t* const mt = multi;
  const uint8_t* ip[4];
  unsigned ib[4];
  for (int k = 0; k < 4; ++k) ip[k] = r[k].p, ib[k] = 0;
  for (;;) {
    size_t rounds = SIZE_MAX;
    for (int k = 0; k < 4 && rounds != 0; ++k) {
      const ptrdiff_t in_left = buf_end - ip[k], out_left = out_end[k] - out[k];
      rounds = in_left < 8 || out_left < 20
                   ? 0
                   : std::min({rounds, static_cast<size_t>(in_left - 8) / 7 + 1,
                               static_cast<size_t>(out_left) / 20});
    }
    if (rounds == 0) break;
    // Named locals, not arrays: the 4-byte stores must not look like they alias
    // the decoder's own state.
    uint8_t *o0 = out[0], *o1 = out[1], *o2 = out[2], *o3 = out[3];
    const uint8_t *i0 = ip[0], *i1 = ip[1], *i2 = ip[2], *i3 = ip[3];
    unsigned b0 = ib[0], b1 = ib[1], b2 = ib[2], b3 = ib[3];
    constexpr uint64_t kSentinel = 1ull << 63;
    for (; rounds != 0; --rounds) {
      uint64_t v0 = (load64(i0) | kSentinel) >> b0, v1 = (load64(i1) | kSentinel) >> b1,
               v2 = (load64(i2) | kSentinel) >> b2, v3 = (load64(i3) | kSentinel) >> b3;
#pragma GCC unroll 5
      for (int j = 0; j < 5; ++j) {
        const uint64_t e0 = mt[v0 & kMask], e1 = mt[v1 & kMask], e2 = mt[v2 & kMask],
                       e3 = mt[v3 & kMask];
        v0 >>= e0 & 63, v1 >>= e1 & 63, v2 >>= e2 & 63, v3 >>= e3 & 63;
        const auto s0 = static_cast<uint32_t>(e0 >> 16), s1 = static_cast<uint32_t>(e1 >> 16),
                   s2 = static_cast<uint32_t>(e2 >> 16), s3 = static_cast<uint32_t>(e3 >> 16);
        std::memcpy(o0, &s0, 4);
        std::memcpy(o1, &s1, 4);
        std::memcpy(o2, &s2, 4);
        std::memcpy(o3, &s3, 4);
        o0 += (e0 >> 8) & 7, o1 += (e1 >> 8) & 7, o2 += (e2 >> 8) & 7, o3 += (e3 >> 8) & 7;
      }
      const auto t0 = static_cast<unsigned>(__builtin_clzll(v0)),
                 t1 = static_cast<unsigned>(__builtin_clzll(v1)),
                 t2 = static_cast<unsigned>(__builtin_clzll(v2)),
                 t3 = static_cast<unsigned>(__builtin_clzll(v3));
      i0 += t0 >> 3, i1 += t1 >> 3, i2 += t2 >> 3, i3 += t3 >> 3;
      b0 = t0 & 7, b1 = t1 & 7, b2 = t2 & 7, b3 = t3 & 7;
    }
    out[0] = o0, out[1] = o1, out[2] = o2, out[3] = o3;
    ip[0] = i0, ip[1] = i1, ip[2] = i2, ip[3] = i3;
    ib[0] = b0, ib[1] = b1, ib[2] = b2, ib[3] = b3;
  }
  for (int k = 0; k < 4; ++k) r[k].pos = static_cast<uint64_t>(ip[k] - r[k].p) * 8 + ib[k];
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

#if defined(__x86_64__)
DPUKV_HUFF_V3 bool decode_block_v3(const uint8_t* src, size_t block_len, const uint8_t* buf_end,
                                   uint8_t* dst, size_t n) {
  return decode_block_body(src, block_len, buf_end, dst, n);
}
#endif
bool decode_block(const uint8_t* src, size_t block_len, const uint8_t* buf_end, uint8_t* dst,
                  size_t n) {
#if defined(__x86_64__)
  if (!g_portable) return decode_block_v3(src, block_len, buf_end, dst, n);
#endif
  return decode_block_body(src, block_len, buf_end, dst, n);
}

}  // namespace

bool use_portable(bool portable) {
#if defined(__x86_64__)
  g_portable = portable || !cpu_has_x86_64_v3();
#else
  (void)portable;
#endif
  return g_portable;
}

const char* path_name() {
  return g_portable ? "portable" : "x86-64-v3";
}

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
