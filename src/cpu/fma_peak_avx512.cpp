// The throughput loops for AVX-512: FMAs (what measure_fma_peak_gflops times) and
// VDPBF16PS bf16 dot products (measure_bf16_dot_peak_gflops).
#include "cpu/intrinsics.hpp"

#include "cpu/kernel.hpp"

namespace stsa::cpu {

// 12 independent chains hide the FMA latency (4 cycles) on two FMA pipes.
float fma_chains_avx512(std::int64_t iterations) {
  // Named variables, not an array: an array would live on the stack and the
  // loop would time loads and stores instead of FMAs.
  __m512 a0 = _mm512_set1_ps(0e-3f);
  __m512 a1 = _mm512_set1_ps(1e-3f);
  __m512 a2 = _mm512_set1_ps(2e-3f);
  __m512 a3 = _mm512_set1_ps(3e-3f);
  __m512 a4 = _mm512_set1_ps(4e-3f);
  __m512 a5 = _mm512_set1_ps(5e-3f);
  __m512 a6 = _mm512_set1_ps(6e-3f);
  __m512 a7 = _mm512_set1_ps(7e-3f);
  __m512 a8 = _mm512_set1_ps(8e-3f);
  __m512 a9 = _mm512_set1_ps(9e-3f);
  __m512 a10 = _mm512_set1_ps(10e-3f);
  __m512 a11 = _mm512_set1_ps(11e-3f);
  const __m512 m = _mm512_set1_ps(0.999999f);
  const __m512 c = _mm512_set1_ps(1e-7f);
  for (std::int64_t it = 0; it < iterations; ++it) {
    a0 = _mm512_fmadd_ps(a0, m, c);
    a1 = _mm512_fmadd_ps(a1, m, c);
    a2 = _mm512_fmadd_ps(a2, m, c);
    a3 = _mm512_fmadd_ps(a3, m, c);
    a4 = _mm512_fmadd_ps(a4, m, c);
    a5 = _mm512_fmadd_ps(a5, m, c);
    a6 = _mm512_fmadd_ps(a6, m, c);
    a7 = _mm512_fmadd_ps(a7, m, c);
    a8 = _mm512_fmadd_ps(a8, m, c);
    a9 = _mm512_fmadd_ps(a9, m, c);
    a10 = _mm512_fmadd_ps(a10, m, c);
    a11 = _mm512_fmadd_ps(a11, m, c);
    // Keeps the compiler from merging or hoisting the chains; costs no instruction.
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5));
    __asm__ volatile("" : "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
  }
  __m512 sum = _mm512_add_ps(a0, a1);
  sum = _mm512_add_ps(sum, a2);
  sum = _mm512_add_ps(sum, a3);
  sum = _mm512_add_ps(sum, a4);
  sum = _mm512_add_ps(sum, a5);
  sum = _mm512_add_ps(sum, a6);
  sum = _mm512_add_ps(sum, a7);
  sum = _mm512_add_ps(sum, a8);
  sum = _mm512_add_ps(sum, a9);
  sum = _mm512_add_ps(sum, a10);
  sum = _mm512_add_ps(sum, a11);
  return _mm512_reduce_add_ps(sum);
}

int fma_chain_flops_per_iteration_avx512() { return 12 * 16 * 2; }

// The same with VDPBF16PS: each lane adds two bf16 products, so an instruction is
// 64 FLOPs to an FMA's 32. 12 chains again: its latency is no longer than an FMA's.
float bf16_dot_chains_avx512(std::int64_t iterations) {
  __m512 a0 = _mm512_set1_ps(0e-3f);
  __m512 a1 = _mm512_set1_ps(1e-3f);
  __m512 a2 = _mm512_set1_ps(2e-3f);
  __m512 a3 = _mm512_set1_ps(3e-3f);
  __m512 a4 = _mm512_set1_ps(4e-3f);
  __m512 a5 = _mm512_set1_ps(5e-3f);
  __m512 a6 = _mm512_set1_ps(6e-3f);
  __m512 a7 = _mm512_set1_ps(7e-3f);
  __m512 a8 = _mm512_set1_ps(8e-3f);
  __m512 a9 = _mm512_set1_ps(9e-3f);
  __m512 a10 = _mm512_set1_ps(10e-3f);
  __m512 a11 = _mm512_set1_ps(11e-3f);
  // Products of 2^-10 and 2^-20 (2^-30 per lane a step): the sums stay small and normal.
  const __m512bh x = __m512bh(_mm512_set1_epi16(0x3a80));  // bf16 2^-10
  const __m512bh y = __m512bh(_mm512_set1_epi16(0x3580));  // bf16 2^-20
  for (std::int64_t it = 0; it < iterations; ++it) {
    a0 = _mm512_dpbf16_ps(a0, x, y);
    a1 = _mm512_dpbf16_ps(a1, x, y);
    a2 = _mm512_dpbf16_ps(a2, x, y);
    a3 = _mm512_dpbf16_ps(a3, x, y);
    a4 = _mm512_dpbf16_ps(a4, x, y);
    a5 = _mm512_dpbf16_ps(a5, x, y);
    a6 = _mm512_dpbf16_ps(a6, x, y);
    a7 = _mm512_dpbf16_ps(a7, x, y);
    a8 = _mm512_dpbf16_ps(a8, x, y);
    a9 = _mm512_dpbf16_ps(a9, x, y);
    a10 = _mm512_dpbf16_ps(a10, x, y);
    a11 = _mm512_dpbf16_ps(a11, x, y);
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5));
    __asm__ volatile("" : "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
  }
  __m512 sum = _mm512_add_ps(a0, a1);
  sum = _mm512_add_ps(sum, a2);
  sum = _mm512_add_ps(sum, a3);
  sum = _mm512_add_ps(sum, a4);
  sum = _mm512_add_ps(sum, a5);
  sum = _mm512_add_ps(sum, a6);
  sum = _mm512_add_ps(sum, a7);
  sum = _mm512_add_ps(sum, a8);
  sum = _mm512_add_ps(sum, a9);
  sum = _mm512_add_ps(sum, a10);
  sum = _mm512_add_ps(sum, a11);
  return _mm512_reduce_add_ps(sum);
}

int bf16_dot_flops_per_iteration_avx512() { return 12 * 16 * 2 * 2; }

}  // namespace stsa::cpu
