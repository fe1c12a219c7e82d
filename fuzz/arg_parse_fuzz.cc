// The one parser of what users type (sizes, ports, counts, booleans): any bytes
// give a clear yes or no, and a yes is within the stated bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/arg_parse.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string err;
  uint64_t v = 0;
  int port = 0;
  bool b = false;
  if (dpukv::parse_gib_size(text, &v, &err) && v > (1ull << 60)) std::abort();
  if (dpukv::parse_byte_size(text, &v, &err) && v > (1ull << 60)) std::abort();
  if (dpukv::parse_port(text, &port, &err) && (port < 0 || port > 65535)) std::abort();
  if (dpukv::parse_count(text, 1000, &v, &err) && v > 1000) std::abort();
  (void)dpukv::parse_bool(text, &b, &err);
  std::vector<int> cpus;
  if (dpukv::parse_cpu_mask(text, &cpus, &err)) {
    if (cpus.empty()) std::abort();
    for (size_t i = 0; i < cpus.size(); ++i)
      if (cpus[i] < 0 || cpus[i] > 1023 || (i > 0 && cpus[i] <= cpus[i - 1])) std::abort();
  }
  // A refusal always says why.
  if (!dpukv::parse_gib_size(text, &v, &err) && err.empty()) std::abort();
  return 0;
}
