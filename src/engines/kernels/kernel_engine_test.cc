#include "engines/kernels/kernel_engine.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "engines/compress/checksum.h"
#include "engines/compress/kv_synth.h"

namespace dpukv {
namespace {

struct Batch {
  std::vector<std::vector<uint16_t>> in;
  std::vector<std::vector<uint8_t>> out;
  std::vector<const uint8_t*> src;
  std::vector<size_t> src_len, dst_cap, out_len;
  std::vector<uint8_t*> dst;
  std::vector<uint64_t> value;
  std::vector<Status> status;
  KernelArgs args;
  Batch(uint32_t n, const KvShape& sh, size_t out_cap) {
    in.resize(n), out.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      kv_synth(KvDataset::kRealistic, KvDtype::kBf16, sh, 100 + i, &in[i]);
      out[i].resize(out_cap);
      src.push_back(reinterpret_cast<const uint8_t*>(in[i].data()));
      src_len.push_back(in[i].size() * 2);
      dst.push_back(out[i].data());
      dst_cap.push_back(out_cap);
    }
    out_len.assign(n, 0), value.assign(n, 0), status.assign(n, Code::kUnknown);
    args.count = n;
    args.src = src.data(), args.src_len = src_len.data(), args.dst = dst.data(),
    args.dst_cap = dst_cap.data();
    args.out_len = out_len.data(), args.out_value = value.data(), args.status = status.data();
    args.params.shape = sh;
  }
};

uint32_t kernel(KernelEngine* e, const char* name) {
  uint32_t id = 0;
  EXPECT_TRUE(e->find(name, &id).ok());
  return id;
}

TEST(KernelEngine, QuantizeAndChecksumMatchTheLibrary) {
  std::unique_ptr<KernelEngine> e;
  ASSERT_TRUE(KernelEngine::create(KernelEngineOptions{}, &e).ok());
  const KvShape sh{2, 256, 256};
  Batch b(7, sh, 1 << 20);
  b.args.params.codec = KvCodec::kInt8;
  SyncEvent done;
  ASSERT_TRUE(e->launch(kernel(e.get(), "quantize"), &b.args, 3, nullptr, 0, &done, 1).ok());
  done.wait_gt(0);
  KvScratch scratch(sh.elements() * 2);
  for (uint32_t i = 0; i < 7; ++i) {
    ASSERT_TRUE(b.status[i].ok());
    std::vector<uint8_t> ref(1 << 20);
    size_t n;
    ASSERT_TRUE(kv_encode(b.args.params, b.src[i], b.src_len[i], ref.data(), ref.size(), &scratch,
                          &n, nullptr)
                    .ok());
    ASSERT_EQ(n, b.out_len[i]);
    EXPECT_EQ(std::memcmp(ref.data(), b.out[i].data(), n), 0);
  }
  SyncEvent sums;
  ASSERT_TRUE(e->launch(kernel(e.get(), "checksum"), &b.args, 2, nullptr, 0, &sums, 5).ok());
  sums.wait_gt(4);
  for (uint32_t i = 0; i < 7; ++i) EXPECT_EQ(b.value[i], xxh3_64(b.src[i], b.src_len[i]));
}

TEST(KernelEngine, LaunchWaitsForItsEventAndChainsInAnyOrder) {
  KernelEngineOptions o;
  o.num_threads = 1;  // one worker: the waiting launch sits in front of the one it waits for
  std::unique_ptr<KernelEngine> e;
  ASSERT_TRUE(KernelEngine::create(o, &e).ok());
  const KvShape sh{1, 64, 128};
  Batch a(2, sh, 1 << 20), g(2, sh, 1 << 20);
  a.args.params.codec = KvCodec::kInt4;
  g.args.token_begin = 8, g.args.token_end = 24;
  SyncEvent go, a_done, g_done;
  // g waits for a, which waits for go; g is launched first.
  ASSERT_TRUE(e->launch(kernel(e.get(), "gather"), &g.args, 2, &a_done, 9, &g_done, 1).ok());
  ASSERT_TRUE(e->launch(kernel(e.get(), "quantize"), &a.args, 1, &go, 0, &a_done, 10).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(a_done.get(), 0u) << "ran before its wait event";
  EXPECT_EQ(g_done.get(), 0u);
  go.set(1);
  g_done.wait_gt(0);
  EXPECT_EQ(a_done.get(), 10u);
  for (uint32_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(a.status[i].ok());
    ASSERT_TRUE(g.status[i].ok());
    const size_t row = 128 * 2;
    ASSERT_EQ(g.out_len[i], 16 * row);
    EXPECT_EQ(std::memcmp(g.out[i].data(), g.src[i] + 8 * row, 16 * row), 0);
  }
  // A gather with a bad token range fails per chunk, nothing else.
  g.args.token_end = 65;
  SyncEvent bad;
  ASSERT_TRUE(e->launch(kernel(e.get(), "gather"), &g.args, 1, nullptr, 0, &bad, 1).ok());
  bad.wait_gt(0);
  EXPECT_EQ(g.status[0], Code::kInvalidValue);
  uint32_t id;
  EXPECT_EQ(e->find("nope", &id), Code::kNotFound);
  EXPECT_EQ(e->launch(99, &g.args, 1, nullptr, 0, nullptr, 0), Code::kInvalidValue);
}

}  // namespace
}  // namespace dpukv
