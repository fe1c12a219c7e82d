#include "runtime/copy_routines.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace dpukv {
namespace {

TEST(CopyKernels, EveryKernelCopiesEverySizeAndAlignmentExactly) {
  std::vector<uint8_t> src(70000), dst(70000 + 128);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 17);
  for (CopyKernel k :
       {CopyKernel::kLibc, CopyKernel::kRepMovsb, CopyKernel::kNtAvx2, CopyKernel::kNtAvx512}) {
    if (!copy_kernel_supported(k)) continue;
    CopyFn fn = copy_kernel_fn(k);
    for (size_t n : {0ul, 1ul, 31ul, 63ul, 64ul, 65ul, 255ul, 256ul, 257ul, 4095ul, 65537ul}) {
      for (size_t so : {0ul, 1ul, 7ul}) {
        for (size_t dof : {0ul, 3ul, 33ul}) {
          std::memset(dst.data(), 0xEE, dst.size());
          fn(dst.data() + dof, src.data() + so, n);
          ASSERT_EQ(std::memcmp(dst.data() + dof, src.data() + so, n), 0)
              << copy_kernel_name(k) << " n=" << n << " so=" << so << " do=" << dof;
          // Nothing written past the end or before the start.
          ASSERT_EQ(dst[dof + n], 0xEE);
          if (dof) {
            ASSERT_EQ(dst[dof - 1], 0xEE);
          }
        }
      }
    }
  }
}

TEST(CopyKernels, NamesRoundTripAndAutoPolicyResolves) {
  CopyKernel k;
  ASSERT_TRUE(copy_kernel_from_name("nt-avx512", &k));
  EXPECT_EQ(k, CopyKernel::kNtAvx512);
  EXPECT_FALSE(copy_kernel_from_name("dma-magic", &k));
  CopyPolicy p;
  p.nt_threshold = 1000;
  p.resolve();
  EXPECT_EQ(p.pick(10), copy_kernel_fn(CopyKernel::kLibc));
  EXPECT_EQ(p.pick(1000), copy_kernel_fn(best_nt_kernel()));
}

}  // namespace
}  // namespace dpukv
