// Copy routines the DMA engine chooses from, per copy size, on this CPU.
//
// glibc memcpy switches to non-temporal stores only for copies larger than about
// 3/4 of the shared cache (~190 MiB here), so mid-size cold copies pay a
// read-for-ownership on every destination line. A DMA engine writes data that the
// CPU will not read soon, so from nt_threshold up it streams the destination.
// See docs/dma.md for the measurements behind the defaults.
#pragma once

#include <cstddef>
#include <string_view>

namespace dpukv {

enum class CopyKernel : unsigned char {
  kLibc,      // glibc memcpy (ERMS / AVX inside)
  kRepMovsb,  // rep movsb: microcoded fast-string copy
  kNtAvx512,  // 64-byte non-temporal stores, needs AVX-512F
  kNtAvx2,    // 32-byte non-temporal stores, needs AVX2
  kAuto,      // kLibc below nt_threshold, the best NT kernel from there on
};

using CopyFn = void (*)(void* dst, const void* src, size_t n);

bool copy_kernel_supported(CopyKernel k);
CopyFn copy_kernel_fn(CopyKernel k);  // never kAuto
std::string_view copy_kernel_name(CopyKernel k);
bool copy_kernel_from_name(std::string_view name, CopyKernel* out);
// The fastest non-temporal kernel the CPU supports, or kLibc if none.
CopyKernel best_nt_kernel();

struct CopyPolicy {
  CopyKernel kernel = CopyKernel::kAuto;
  size_t nt_threshold = 256 * 1024;  // measured: see docs/dma.md
  CopyFn small = nullptr;            // resolved by resolve()
  CopyFn large = nullptr;

  void resolve();
  CopyFn pick(size_t n) const { return n >= nt_threshold ? large : small; }
};

}  // namespace dpukv
