// Fuzzes every decoder of the compress engine: the first byte picks the algorithm,
// the rest is the compressed input. A decoder may fail, but must never read or
// write outside its buffers (ASan) and never claim more output than the buffer.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "engines/compress/codec.h"

using namespace dpukv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<CodecScratch> scratch = [] {
    std::unique_ptr<CodecScratch> s;
    if (!CodecScratch::create(1 << 20, &s).ok()) abort();
    return s;
  }();
  static std::vector<uint8_t> out(1 << 20);
  if (size < 1) return 0;
  const auto algo =
      static_cast<CompressAlgo>(data[0] % static_cast<uint8_t>(CompressAlgo::kCount_));
  // Exact-size input copy so ASan sees reads past the end.
  std::vector<uint8_t> in(data + 1, data + size);
  CodecResult r;
  Status st = codec_decompress(algo, CodecParams{}, in.data(), in.size(), out.data(), out.size(),
                               scratch.get(), &r);
  if (st.ok() && r.out_len > out.size()) abort();
  return 0;
}
