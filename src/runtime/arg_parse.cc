#include "runtime/arg_parse.h"

#include <cmath>

namespace dpukv {
namespace {

constexpr uint64_t kMaxBytes = 1ull << 60;

// Digits, at most one '.', at least one digit: the only number shape accepted.
bool decimal(const std::string& s, size_t end, long double* v) {
  long double x = 0, scale = 0;
  bool digits = false;
  for (size_t i = 0; i < end; ++i) {
    const char c = s[i];
    if (c == '.') {
      if (scale != 0) return false;
      scale = 1;
      continue;
    }
    if (c < '0' || c > '9') return false;
    digits = true;
    if (scale != 0) {
      scale /= 10;
      x += (c - '0') * scale;
    } else {
      x = x * 10 + (c - '0');
      if (x > 1e30L) return false;
    }
  }
  *v = x;
  return digits;
}

int unit_shift(const std::string& s, size_t* end) {
  // Accepts K, KB, KiB (and M/G/T), and a bare B.
  size_t n = s.size();
  if (n > 0 && (s[n - 1] == 'B' || s[n - 1] == 'b')) --n;
  if (n > 0 && s[n - 1] == 'i') --n;
  if (n == 0) return -1;
  int shift = -1;
  switch (s[n - 1]) {
    case 'k':
    case 'K':
      shift = 10;
      break;
    case 'm':
    case 'M':
      shift = 20;
      break;
    case 'g':
    case 'G':
      shift = 30;
      break;
    case 't':
    case 'T':
      shift = 40;
      break;
    default:
      break;
  }
  if (shift >= 0) {
    *end = n - 1;
    return shift;
  }
  if (n != s.size() && s[n] == 'B' && n == s.size() - 1) {  // "4096B"
    *end = n;
    return 0;
  }
  *end = s.size();
  return -1;  // no unit
}

bool to_bytes(long double v, int shift, uint64_t* bytes, const std::string& text,
              std::string* err) {
  const long double b = std::ldexp(v, shift);
  if (!(b <= static_cast<long double>(kMaxBytes))) {
    *err = "'" + text + "' is larger than 2^60 bytes";
    return false;
  }
  *bytes = static_cast<uint64_t>(b);
  return true;
}

}  // namespace

bool parse_gib_size(const std::string& text, uint64_t* bytes, std::string* err) {
  size_t end = 0;
  const int shift = unit_shift(text, &end);
  long double v = 0;
  if (!decimal(text, end, &v)) {
    *err = "'" + text +
           "' is not a size (GiB as a plain number like 0.25, or bytes with a unit "
           "like 512M)";
    return false;
  }
  return to_bytes(v, shift < 0 ? 30 : shift, bytes, text, err);
}

bool parse_byte_size(const std::string& text, uint64_t* bytes, std::string* err) {
  size_t end = 0;
  const int shift = unit_shift(text, &end);
  long double v = 0;
  if (!decimal(text, end, &v) || (shift <= 0 && v != std::floor(v))) {
    *err = "'" + text + "' is not a size in bytes (like 4096, 64K, 16M, 1G)";
    return false;
  }
  return to_bytes(v, shift < 0 ? 0 : shift, bytes, text, err);
}

bool parse_count(const std::string& text, uint64_t max, uint64_t* out, std::string* err) {
  uint64_t v = 0;
  bool ok = !text.empty() && text.size() <= 20;
  for (char c : text) {
    if (c < '0' || c > '9' || v > (UINT64_MAX - 9) / 10) {
      ok = false;
      break;
    }
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (!ok || v > max) {
    *err = "'" + text + "' is not an integer from 0 to " + std::to_string(max);
    return false;
  }
  *out = v;
  return true;
}

bool parse_cpu_mask(const std::string& text, std::vector<int>* cpus, std::string* err) {
  constexpr int kMaxCpu = 1023;
  std::vector<bool> set(kMaxCpu + 1, false);
  auto bad = [&] {
    *err = "'" + text + "' is not a CPU mask (0x3) or a CPU list ([0,2-3]) of CPUs 0 to 1023";
    return false;
  };
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    const std::string body = text.substr(1, text.size() - 2);
    size_t p = 0;
    if (body.empty()) return bad();
    while (p <= body.size()) {
      size_t q = body.find(',', p);
      if (q == std::string::npos) q = body.size();
      const std::string item = body.substr(p, q - p);
      size_t dash = item.find('-');
      uint64_t lo = 0, hi = 0;
      std::string e;
      if (dash == std::string::npos) {
        if (!parse_count(item, kMaxCpu, &lo, &e)) return bad();
        hi = lo;
      } else if (!parse_count(item.substr(0, dash), kMaxCpu, &lo, &e) ||
                 !parse_count(item.substr(dash + 1), kMaxCpu, &hi, &e) || hi < lo) {
        return bad();
      }
      for (uint64_t c = lo; c <= hi; ++c) set[c] = true;
      p = q + 1;
    }
  } else {
    std::string hex = text;
    if (hex.size() > 2 && hex[0] == '0' && (hex[1] == 'x' || hex[1] == 'X')) hex = hex.substr(2);
    if (hex.empty() || hex.size() > (kMaxCpu + 1) / 4) return bad();
    for (size_t i = 0; i < hex.size(); ++i) {
      const char c = hex[hex.size() - 1 - i];
      int v = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (v < 0) return bad();
      for (int b = 0; b < 4; ++b)
        if (v >> b & 1) set[4 * i + b] = true;
    }
  }
  cpus->clear();
  for (int c = 0; c <= kMaxCpu; ++c)
    if (set[c]) cpus->push_back(c);
  if (cpus->empty()) return bad();
  return true;
}

bool parse_port(const std::string& text, int* port, std::string* err) {
  uint64_t v = 0;
  if (!parse_count(text, 65535, &v, err)) {
    *err = "'" + text + "' is not a port (0 to 65535)";
    return false;
  }
  *port = static_cast<int>(v);
  return true;
}

bool parse_bool(const std::string& text, bool* out, std::string* err) {
  if (text == "true" || text == "yes" || text == "on" || text == "1") {
    *out = true;
    return true;
  }
  if (text == "false" || text == "no" || text == "off" || text == "0") {
    *out = false;
    return true;
  }
  *err = "'" + text + "' is not true or false";
  return false;
}

}  // namespace dpukv
