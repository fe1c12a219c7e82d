// Fuzzes every decoder of the compress engine: the first byte picks the algorithm,
// the rest is the compressed input. A decoder may fail, but must never read or
// write outside its buffers (ASan) and never claim more output than the buffer.
// The KV codecs' input is also decoded as a connector does (kv_decode_rows: its
// length from its header, into rows), into one to four rows of the output.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "engines/compress/codec.h"
#include "engines/compress/kv_codec.h"

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
  static KvScratch kv(1 << 20);
  size_t len = 0, m = 0;
  KvChunkHeader h;
  if (algo >= CompressAlgo::kKvLossless && kv_encoded_length(in.data(), in.size(), &len).ok() &&
      kv_read_header(in.data(), len, &h).ok()) {
    const size_t nrows = 1 + data[0] / 16 % 4, row_bytes = out.size() / 4;
    uint8_t* rows[4] = {out.data() + 3 * row_bytes, out.data(), out.data() + 2 * row_bytes,
                        out.data() + row_bytes};
    // Rows of the chunk's size when they fit (a connector's rows match its chunks).
    if (h.original_len && h.original_len % nrows == 0 && h.original_len / nrows <= row_bytes &&
        kv_decode_rows(in.data(), len, rows, nrows, h.original_len / nrows, &kv, &m).ok() &&
        m != h.original_len)
      abort();
  }
  return 0;
}
