#include "tools/bench/compress.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "engines/compress/codec.h"
#include "engines/compress/huffman.h"
#include "engines/compress/kv_synth.h"
#include "tools/common/bench_common.h"

namespace dpukv {
namespace {

using bench::Json;

struct Config {
  std::string datasets = "kv_bf16,kv_fp16,iid_bf16";
  std::string file;
  std::string codecs = "kv-lossless-delta,kv-lossless,kv-int8,kv-int4,deflate,lz4,zstd";
  uint32_t layers = 8;
  uint32_t reps = 7;
  std::string simd = "auto";  // the KV kernels' path: auto, avx512, avx2, scalar
  bench::OutputOptions out;
};

struct Measure {
  double ratio = 0, c_gbps = 0, d_gbps = 0;
  KvCodecError err;
  bool ok = false;
};

// Median of reps timed runs of fn, in seconds.
template <typename F>
double median_seconds(uint32_t reps, F&& fn) {
  std::vector<double> t;
  for (uint32_t i = 0; i < reps; ++i) {
    const uint64_t t0 = bench::now_ns();
    fn();
    t.push_back((bench::now_ns() - t0) / 1e9);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

Measure measure(CompressAlgo a, const CodecParams& p, const std::vector<uint8_t>& in,
                CodecScratch* s, uint32_t reps) {
  Measure m;
  std::vector<uint8_t> enc(compress_bound(a, p, in.size()) + 64), dec(in.size() + 64);
  CodecResult r;
  if (!codec_compress(a, p, in.data(), in.size(), enc.data(), enc.size(), s, &r).ok()) return m;
  const size_t clen = r.out_len;
  m.err = r.error;
  const double tc = median_seconds(reps, [&] {
    (void)codec_compress(a, p, in.data(), in.size(), enc.data(), enc.size(), s, &r);
  });
  CodecResult d;
  if (!codec_decompress(a, p, enc.data(), clen, dec.data(), dec.size(), s, &d).ok() ||
      d.out_len != in.size())
    return m;
  const double td = median_seconds(
      reps, [&] { (void)codec_decompress(a, p, enc.data(), clen, dec.data(), dec.size(), s, &d); });
  m.ratio = static_cast<double>(in.size()) / clen;
  m.c_gbps = in.size() / tc / 1e9;
  m.d_gbps = in.size() / td / 1e9;
  m.ok = true;
  return m;
}

// zstd-1 after splitting 16-bit values into two byte planes: the usual trick for
// floating-point data, as a general codec would be used on KV.
Measure measure_shuffled_zstd(const std::vector<uint8_t>& in, CodecScratch* s, uint32_t reps) {
  std::vector<uint8_t> sh(in.size());
  auto shuffle = [&] {
    const size_t n = in.size() / 2;
    for (size_t i = 0; i < n; ++i) sh[i] = in[2 * i + 1], sh[n + i] = in[2 * i];
    if (in.size() & 1) sh[in.size() - 1] = in.back();
  };
  auto unshuffle = [&](const std::vector<uint8_t>& src, std::vector<uint8_t>* dst) {
    const size_t n = src.size() / 2;
    for (size_t i = 0; i < n; ++i) (*dst)[2 * i + 1] = src[i], (*dst)[2 * i] = src[n + i];
  };
  Measure m;
  CodecParams p;
  std::vector<uint8_t> enc(compress_bound(CompressAlgo::kZstd, p, in.size())), dec(in.size()),
      out(in.size());
  CodecResult r;
  shuffle();
  if (!codec_compress(CompressAlgo::kZstd, p, sh.data(), sh.size(), enc.data(), enc.size(), s, &r)
           .ok())
    return m;
  const size_t clen = r.out_len;
  const double tc = median_seconds(reps, [&] {
    shuffle();
    (void)codec_compress(CompressAlgo::kZstd, p, sh.data(), sh.size(), enc.data(), enc.size(), s,
                         &r);
  });
  const double td = median_seconds(reps, [&] {
    (void)codec_decompress(CompressAlgo::kZstd, p, enc.data(), clen, dec.data(), dec.size(), s, &r);
    unshuffle(dec, &out);
  });
  if (out != in) return m;
  m.ratio = static_cast<double>(in.size()) / clen;
  m.c_gbps = in.size() / tc / 1e9;
  m.d_gbps = in.size() / td / 1e9;
  m.ok = true;
  return m;
}

int run(const Config& c) {
  std::vector<CompressAlgo> algos;
  {
    size_t pos = 0;
    while (pos <= c.codecs.size()) {
      size_t e = c.codecs.find(',', pos);
      if (e == std::string::npos) e = c.codecs.size();
      std::string name = c.codecs.substr(pos, e - pos);
      CompressAlgo a;
      if (!compress_algo_from_name(name.c_str(), &a)) {
        std::cerr << "dpukv bench compress: unknown codec '" << name << "'\n";
        return 2;
      }
      algos.push_back(a);
      pos = e + 1;
    }
  }
  struct Dataset {
    std::string name;
    KvDtype dt;
    KvShape shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Dataset> sets;
  const KvShape shape{2 * c.layers, 256, 8 * 128};
  for (const std::string& name :
       {std::string("kv_bf16"), std::string("kv_fp16"), std::string("iid_bf16")}) {
    if (c.datasets.find(name) == std::string::npos) continue;
    Dataset d{name, name == "kv_fp16" ? KvDtype::kFp16 : KvDtype::kBf16, shape, {}};
    std::vector<uint16_t> v;
    kv_synth(name == "iid_bf16" ? KvDataset::kIid : KvDataset::kRealistic, d.dt, shape, 42, &v);
    d.bytes.resize(v.size() * 2);
    std::memcpy(d.bytes.data(), v.data(), d.bytes.size());
    sets.push_back(std::move(d));
  }
  if (!c.file.empty()) {
    std::ifstream f(c.file, std::ios::binary);
    if (!f) {
      std::cerr << "dpukv bench compress: cannot read " << c.file << "\n";
      return 2;
    }
    Dataset d{c.file, KvDtype::kBf16, KvShape{1, 1, 0}, {}};
    d.bytes.assign(std::istreambuf_iterator<char>(f), {});
    if (d.bytes.empty() || d.bytes.size() > (256u << 20)) {
      std::cerr << "dpukv bench compress: the file must hold 1 byte to 256 MiB\n";
      return 2;
    }
    sets.push_back(std::move(d));
  }
  size_t max_len = 0;
  for (auto& d : sets) max_len = std::max(max_len, d.bytes.size());
  std::unique_ptr<CodecScratch> scratch;
  if (!CodecScratch::create(max_len + 64, &scratch).ok()) return 1;

  // A narrower path than the CPU offers is what a machine without the wider
  // one runs: measurable here. A wider one than the CPU has is refused.
  if (c.simd != "auto") {
    const SimdLevel want = c.simd == "avx512" ? SimdLevel::kAvx512
                           : c.simd == "avx2" ? SimdLevel::kAvx2
                                              : SimdLevel::kScalar;
    kv_force_simd_level(want);
    if (kv_simd_level() != want) {
      std::cerr << "dpukv bench compress: --simd " << c.simd << ": this CPU offers at most "
                << simd_level_name(kv_simd_level()) << "\n";
      return 2;
    }
  }
  std::vector<Json> rows;
  if (!c.out.json) {
    std::printf(
        "dpukv bench compress: one thread, median of %u runs, %s SIMD, %s Huffman, chunk %s\n",
        c.reps, simd_level_name(kv_simd_level()), huffman::path_name(),
        bench::format_size(sets.empty() ? 0 : sets[0].bytes.size()).c_str());
    std::printf("%-10s %-18s %6s %9s %9s %10s | %-12s %6s %9s %9s\n", "dataset", "codec", "ratio",
                "comp GB/s", "dec GB/s", "rel_rmse", "baseline", "ratio", "comp GB/s", "dec GB/s");
  }
  for (auto& d : sets) {
    if (bench::progress_enabled())
      std::fprintf(stderr, "\r  %s: baselines ...      ", d.name.c_str());
    CodecParams base_p;
    const Measure lz4 = measure(CompressAlgo::kLz4Block, base_p, d.bytes, scratch.get(), c.reps);
    const Measure zstd = measure(CompressAlgo::kZstd, base_p, d.bytes, scratch.get(), c.reps);
    const Measure zshuf = measure_shuffled_zstd(d.bytes, scratch.get(), c.reps);
    auto emit = [&](const std::string& codec, const Measure& m, bool lossy,
                    const std::string& bname, const Measure& b) {
      Json row;
      row["bench"] = "compress";
      row["dataset"] = d.name;
      row["bytes"] = d.bytes.size();
      row["codec"] = codec;
      row["ratio"] = m.ratio;
      row["compress_gbps"] = m.c_gbps;
      row["decompress_gbps"] = m.d_gbps;
      if (lossy) {
        row["rel_rmse"] = m.err.rel_rmse;
        row["max_abs_err"] = m.err.max_abs_err;
      }
      row["kv_simd"] = simd_level_name(kv_simd_level());  // the KV kernels' path
      row["huffman"] = huffman::path_name();              // the lossless codecs' coder
      row["baseline_codec"] = bname;
      row["baseline_ratio"] = b.ratio;
      row["baseline_compress_gbps"] = b.c_gbps;
      row["baseline_decompress_gbps"] = b.d_gbps;
      row["compress_speed_ratio"] = b.c_gbps > 0 ? m.c_gbps / b.c_gbps : 0.0;
      rows.push_back(row);
      if (!c.out.json) {
        char err[16] = "-";
        if (lossy) std::snprintf(err, sizeof(err), "%.2e", m.err.rel_rmse);
        std::printf("%-10s %-18s %6.3f %9.2f %9.2f %10s | %-12s %6.3f %9.2f %9.2f\n",
                    d.name.c_str(), codec.c_str(), m.ratio, m.c_gbps, m.d_gbps, err, bname.c_str(),
                    b.ratio, b.c_gbps, b.d_gbps);
        std::fflush(stdout);
      }
    };
    emit("zstd-1+shuffle", zshuf, false, "lz4", lz4);
    for (CompressAlgo a : algos) {
      if (bench::progress_enabled())
        std::fprintf(stderr, "\r  %s: %s ...          ", d.name.c_str(), compress_algo_name(a));
      const bool kv = a >= CompressAlgo::kKvLossless;
      const bool lossy = a == CompressAlgo::kKvInt8 || a == CompressAlgo::kKvInt4;
      if (kv && d.shape.channels == 0 && (lossy || a == CompressAlgo::kKvLosslessDelta))
        continue;  // needs a shape
      CodecParams p;
      p.dtype = d.dt;
      p.shape = d.shape;
      Measure m = a == CompressAlgo::kLz4Block ? lz4
                  : a == CompressAlgo::kZstd   ? zstd
                                               : measure(a, p, d.bytes, scratch.get(), c.reps);
      if (!m.ok) {
        std::cerr << "dpukv bench compress: " << compress_algo_name(a) << " failed on " << d.name
                  << "\n";
        return 1;
      }
      // KV codecs are compared with the best general codec here; general codecs with LZ4.
      if (kv)
        emit(compress_algo_name(a), m, lossy, "zstd-1+shuffle", zshuf);
      else
        emit(a == CompressAlgo::kZstd ? "zstd-1" : compress_algo_name(a), m, false, "lz4", lz4);
    }
  }
  if (bench::progress_enabled()) std::fprintf(stderr, "\r%50s\r", "");
  if (c.out.json)
    bench::print_json("compress", rows);
  else
    bench::print_machine_line();
  return bench::write_csv(c.out, rows) ? 0 : 1;
}

}  // namespace

void add_bench_compress_command(CLI::App* bench, int* exit_code) {
  auto c = std::make_shared<Config>();
  CLI::App* cmd = bench->add_subcommand(
      "compress", "Benchmark the codecs on KV-like data against LZ4 and zstd");
  cmd->add_option("--datasets", c->datasets, "kv_bf16, kv_fp16, iid_bf16 (comma-separated)")
      ->capture_default_str();
  cmd->add_option("--file", c->file,
                  "Also measure this file's bytes (no KV shape: lossless codecs only)");
  cmd->add_option("--codecs", c->codecs, "Codecs to measure")->capture_default_str();
  cmd->add_option("--layers", c->layers,
                  "Layers per chunk (K and V each: [256 tokens, 8 heads, 128 dims])")
      ->capture_default_str()
      ->check(CLI::Range(1u, 128u));
  cmd->add_option("--reps", c->reps, "Timed runs per measurement (median reported)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000u));
  cmd->add_option("--simd", c->simd,
                  "KV kernels' path: auto (the widest the CPU has), avx512, avx2 or scalar "
                  "(portable C++; the Huffman coder's portable build too)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "avx512", "avx2", "scalar"}));
  bench::add_output_options(cmd, &c->out);
  cmd->callback([c, exit_code] { *exit_code = run(*c); });
}

}  // namespace dpukv
