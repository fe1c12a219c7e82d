#include "engines/compress/compress_engine.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "engines/compress/checksum.h"
#include "engines/compress/kv_synth.h"
#include "runtime/mem_region.h"
#include "runtime/mmap.h"

namespace dpukv {
namespace {

class CompressEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ProgressEngine::create(&pe_).ok());
    CompressOptions o;
    o.num_threads = 2;
    o.max_buf_size = 8 << 20;
    ASSERT_TRUE(CompressEngine::create(pe_.get(), o, &eng_).ok());
    UserData ud;
    ud.ptr = this;
    ASSERT_TRUE(eng_->set_user_data(ud).ok());
    ASSERT_TRUE(eng_->set_conf(&CompressEngineTest::cb, &CompressEngineTest::cb, 16).ok());
    ASSERT_TRUE(eng_->start().ok());
    ASSERT_TRUE(MemRegion::create(64 << 20, MemRegionOptions{}, &mem_).ok());
    ASSERT_TRUE(
        Mmap::create(mem_->data(), mem_->size(), kAccessLocalReadWrite, mem_->fd(), 0, &map_).ok());
    ASSERT_TRUE(map_->start().ok());
    ASSERT_TRUE(BufInventory::create(64, &inv_).ok());
  }
  void TearDown() override {
    if (eng_->state() != CtxState::kIdle) {
      (void)eng_->stop();
      while (eng_->state() != CtxState::kIdle) pe_->progress();
    }
  }
  static void cb(CompressTask* t, UserData, UserData ctx) {
    auto* self = static_cast<CompressEngineTest*>(ctx.ptr);
    self->last_status_ = t->status();
    self->last_result_ = t->result();
    (void)t->src()->dec_refcount();
    (void)t->dst()->dec_refcount();
    (void)self->eng_->free(t);
    ++self->done_;
  }
  uint8_t* at(size_t off) { return static_cast<uint8_t*>(mem_->data()) + off; }
  Status run(CompressTask::Op op, CompressAlgo a, const CodecParams& p, size_t src_off, size_t len,
             size_t dst_off, size_t cap, size_t* out_len) {
    Buf *s, *d;
    EXPECT_TRUE(inv_->get_by_data(map_.get(), at(src_off), len ? len : 1, &s).ok());
    if (!len) {
      EXPECT_TRUE(s->set_data_len(0).ok());
    }
    EXPECT_TRUE(inv_->get_by_addr(map_.get(), at(dst_off), cap, &d).ok());
    EXPECT_TRUE(d->inc_refcount().ok());
    CompressTask* t;
    EXPECT_TRUE(eng_->task_alloc_init(op, a, p, s, d, UserData{}, &t).ok());
    const uint64_t before = done_;
    EXPECT_TRUE(eng_->submit(t).ok());
    while (done_ == before) pe_->progress();
    *out_len = d->data_len();
    EXPECT_TRUE(d->dec_refcount().ok());
    return last_status_;
  }

  std::unique_ptr<ProgressEngine> pe_;
  std::unique_ptr<CompressEngine> eng_;
  std::unique_ptr<MemRegion> mem_;
  std::unique_ptr<Mmap> map_;
  std::unique_ptr<BufInventory> inv_;
  Status last_status_;
  CodecResult last_result_;
  uint64_t done_ = 0;
};

TEST_F(CompressEngineTest, EveryAlgorithmRoundTripsWithChecksums) {
  const KvShape sh{4, 256, 512};
  std::vector<uint16_t> v;
  kv_synth(KvDataset::kRealistic, KvDtype::kBf16, sh, 3, &v);
  const size_t len = v.size() * 2;
  std::memcpy(at(0), v.data(), len);
  for (size_t a = 0; a < static_cast<size_t>(CompressAlgo::kCount_); ++a) {
    const auto algo = static_cast<CompressAlgo>(a);
    CodecParams p;
    p.shape = sh;
    size_t clen = 0, dlen = 0;
    ASSERT_TRUE(run(CompressTask::Op::kCompress, algo, p, 0, len, 16 << 20, 8 << 20, &clen).ok())
        << compress_algo_name(algo);
    const CodecResult cr = last_result_;
    EXPECT_EQ(cr.out_len, clen);
    ASSERT_TRUE(
        run(CompressTask::Op::kDecompress, algo, p, 16 << 20, clen, 32 << 20, 8 << 20, &dlen).ok())
        << compress_algo_name(algo);
    ASSERT_EQ(dlen, len);
    const bool lossy = algo == CompressAlgo::kKvInt8 || algo == CompressAlgo::kKvInt4;
    if (!lossy) {
      EXPECT_EQ(std::memcmp(at(32 << 20), at(0), len), 0) << compress_algo_name(algo);
      // Checksums of the uncompressed bytes, the same on both directions.
      if (algo == CompressAlgo::kDeflate) {
        EXPECT_EQ(cr.crc32, crc32_gzip(at(0), len));
        EXPECT_EQ(cr.adler32, adler32(at(0), len));
        EXPECT_EQ(last_result_.crc32, cr.crc32);
      } else if (algo < CompressAlgo::kKvLossless) {
        EXPECT_EQ(cr.xxh32, xxh32(at(0), len));
        EXPECT_EQ(last_result_.xxh32, cr.xxh32);
      } else {
        // KV chunks carry xxh3-64 of the original in their header.
        KvChunkHeader h;
        ASSERT_TRUE(kv_read_header(at(16 << 20), clen, &h).ok());
        EXPECT_EQ(h.checksum, xxh3_64(at(0), len));
      }
    } else {
      EXPECT_GT(cr.error.rel_rmse, 0.0);
      EXPECT_LT(cr.error.rel_rmse, 0.1);
    }
  }
}

TEST_F(CompressEngineTest, BadInputCompletesWithErrors) {
  std::mt19937 rng(1);
  for (size_t i = 0; i < (1 << 20); ++i) *at(i) = static_cast<uint8_t>(rng() % 7);
  for (CompressAlgo a : {CompressAlgo::kDeflate, CompressAlgo::kLz4Block, CompressAlgo::kLz4Frame,
                         CompressAlgo::kZstd, CompressAlgo::kKvLossless}) {
    CodecParams p;
    size_t clen = 0, out = 0;
    ASSERT_TRUE(run(CompressTask::Op::kCompress, a, p, 0, 1 << 20, 8 << 20, 4 << 20, &clen).ok());
    // Destination too small for the output.
    EXPECT_EQ(run(CompressTask::Op::kCompress, a, p, 0, 1 << 20, 20 << 20, 64, &out), Code::kTooBig)
        << compress_algo_name(a);
    Status st = run(CompressTask::Op::kDecompress, a, p, 8 << 20, clen, 20 << 20, 1000, &out);
    EXPECT_TRUE(st == Code::kTooBig || st == Code::kCorrupted)
        << compress_algo_name(a) << " " << st.name();
    // Corrupted input: an error, or (for codecs without checksums) bytes that differ.
    for (int k = 0; k < 50; ++k) {
      std::memcpy(at(12 << 20), at(8 << 20), clen);
      at(12 << 20)[rng() % clen] ^= static_cast<uint8_t>(1 + rng() % 255);
      (void)run(CompressTask::Op::kDecompress, a, p, 12 << 20, clen, 20 << 20, 2 << 20, &out);
    }
    // Truncated input never decodes to the full original.
    st = run(CompressTask::Op::kDecompress, a, p, 8 << 20, clen / 2, 20 << 20, 2 << 20, &out);
    EXPECT_TRUE(!st.ok() || out != (1u << 20)) << compress_algo_name(a);
  }
  // Overlap and read-only destination.
  size_t out;
  EXPECT_EQ(run(CompressTask::Op::kCompress, CompressAlgo::kLz4Block, CodecParams{}, 0, 4096, 100,
                8192, &out),
            Code::kInvalidValue);
  std::vector<uint8_t> ro(4096);
  std::unique_ptr<Mmap> ro_map;
  ASSERT_TRUE(Mmap::create(ro.data(), ro.size(), kAccessLocalRead, -1, 0, &ro_map).ok());
  ASSERT_TRUE(ro_map->start().ok());
  Buf *s, *d;
  ASSERT_TRUE(inv_->get_by_data(map_.get(), at(0), 100, &s).ok());
  ASSERT_TRUE(inv_->get_by_addr(ro_map.get(), ro.data(), ro.size(), &d).ok());
  CompressTask* t;
  ASSERT_TRUE(eng_->task_alloc_init(CompressTask::Op::kCompress, CompressAlgo::kLz4Block,
                                    CodecParams{}, s, d, UserData{}, &t)
                  .ok());
  const uint64_t before = done_;
  ASSERT_TRUE(eng_->submit(t).ok());
  while (done_ == before) pe_->progress();
  EXPECT_EQ(last_status_, Code::kNotPermitted);
  ASSERT_TRUE(ro_map->stop().ok());
}

}  // namespace
}  // namespace dpukv
