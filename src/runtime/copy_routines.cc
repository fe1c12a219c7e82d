#include "runtime/copy_routines.h"

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace dpukv {
namespace {

void copy_libc(void* dst, const void* src, size_t n) {
  std::memcpy(dst, src, n);
}

void copy_rep_movsb(void* dst, const void* src, size_t n) {
  asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

// Aligns the destination with a normal copy, streams whole 256-byte blocks, and
// finishes the tail normally. The sfence orders the weakly ordered NT stores before
// the completion that publishes the task.
__attribute__((target("avx512f"))) void copy_nt_avx512(void* dst, const void* src, size_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  auto* s = static_cast<const uint8_t*>(src);
  size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
  if (head > n) head = n;
  std::memcpy(d, s, head);
  d += head, s += head, n -= head;
  while (n >= 256) {
    __m512i a = _mm512_loadu_si512(s);
    __m512i b = _mm512_loadu_si512(s + 64);
    __m512i c = _mm512_loadu_si512(s + 128);
    __m512i e = _mm512_loadu_si512(s + 192);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d), a);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + 64), b);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + 128), c);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + 192), e);
    d += 256, s += 256, n -= 256;
  }
  while (n >= 64) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d), _mm512_loadu_si512(s));
    d += 64, s += 64, n -= 64;
  }
  _mm_sfence();
  std::memcpy(d, s, n);
}

__attribute__((target("avx2"))) void copy_nt_avx2(void* dst, const void* src, size_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  auto* s = static_cast<const uint8_t*>(src);
  size_t head = (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31;
  if (head > n) head = n;
  std::memcpy(d, s, head);
  d += head, s += head, n -= head;
  while (n >= 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 64));
    __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 96), e);
    d += 128, s += 128, n -= 128;
  }
  _mm_sfence();
  std::memcpy(d, s, n);
}

}  // namespace

bool copy_kernel_supported(CopyKernel k) {
  switch (k) {
    case CopyKernel::kLibc:
    case CopyKernel::kRepMovsb:
    case CopyKernel::kAuto:
      return true;
    case CopyKernel::kNtAvx512:
      return __builtin_cpu_supports("avx512f");
    case CopyKernel::kNtAvx2:
      return __builtin_cpu_supports("avx2");
  }
  return false;
}

CopyFn copy_kernel_fn(CopyKernel k) {
  switch (k) {
    case CopyKernel::kRepMovsb:
      return copy_rep_movsb;
    case CopyKernel::kNtAvx512:
      return copy_nt_avx512;
    case CopyKernel::kNtAvx2:
      return copy_nt_avx2;
    default:
      return copy_libc;
  }
}

std::string_view copy_kernel_name(CopyKernel k) {
  switch (k) {
    case CopyKernel::kLibc:
      return "libc";
    case CopyKernel::kRepMovsb:
      return "rep-movsb";
    case CopyKernel::kNtAvx512:
      return "nt-avx512";
    case CopyKernel::kNtAvx2:
      return "nt-avx2";
    case CopyKernel::kAuto:
      return "auto";
  }
  return "?";
}

bool copy_kernel_from_name(std::string_view name, CopyKernel* out) {
  for (CopyKernel k : {CopyKernel::kLibc, CopyKernel::kRepMovsb, CopyKernel::kNtAvx512,
                       CopyKernel::kNtAvx2, CopyKernel::kAuto}) {
    if (copy_kernel_name(k) == name) {
      *out = k;
      return true;
    }
  }
  return false;
}

CopyKernel best_nt_kernel() {
  // Measured (docs/dma.md): 32-byte streaming stores beat 64-byte ones by 5-15% on
  // cold copies on the AMD EPYC (Zen 4) this project runs on, which splits 512-bit
  // stores; prefer AVX-512 only where AVX2 is absent.
  if (copy_kernel_supported(CopyKernel::kNtAvx2)) return CopyKernel::kNtAvx2;
  if (copy_kernel_supported(CopyKernel::kNtAvx512)) return CopyKernel::kNtAvx512;
  return CopyKernel::kLibc;
}

void CopyPolicy::resolve() {
  if (kernel == CopyKernel::kAuto) {
    small = copy_libc;
    large = copy_kernel_fn(best_nt_kernel());
  } else {
    CopyKernel k = copy_kernel_supported(kernel) ? kernel : CopyKernel::kLibc;
    small = large = copy_kernel_fn(k);
  }
}

}  // namespace dpukv
