// The throughput loops for AVX-512: FMAs (what measure_fma_peak_gflops times) and
// VDPBF16PS bf16 dot products (measure_bf16_dot_peak_gflops).
#include "cpu/intrinsics.hpp"

#include "cpu/kernel.hpp"

namespace stsa::cpu {
namespace {

// 12 independent chains a = step(a), long enough to hide the step's latency (4 cycles for an
// FMA) on two pipes; returns a value that depends on all of them. Named variables, not an
// array: an array would live on the stack and the loop would time loads and stores instead.
template <class Step>
inline float run_chains(std::int64_t iterations, Step step) {
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
  for (std::int64_t it = 0; it < iterations; ++it) {
    a0 = step(a0);
    a1 = step(a1);
    a2 = step(a2);
    a3 = step(a3);
    a4 = step(a4);
    a5 = step(a5);
    a6 = step(a6);
    a7 = step(a7);
    a8 = step(a8);
    a9 = step(a9);
    a10 = step(a10);
    a11 = step(a11);
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

}  // namespace

float fma_chains_avx512(std::int64_t iterations) {
  const __m512 m = _mm512_set1_ps(0.999999f);
  const __m512 c = _mm512_set1_ps(1e-7f);
  return run_chains(iterations, [&](__m512 a) { return _mm512_fmadd_ps(a, m, c); });
}

int fma_chain_flops_per_iteration_avx512() { return 12 * 16 * 2; }

// VDPBF16PS: each lane adds two bf16 products, so an instruction is 64 FLOPs to an FMA's 32.
// Products of 2^-10 and 2^-20 (2^-29 per lane a step): the sums stay small and normal.
float bf16_dot_chains_avx512(std::int64_t iterations) {
  const __m512bh x = __m512bh(_mm512_set1_epi16(0x3a80));  // bf16 2^-10
  const __m512bh y = __m512bh(_mm512_set1_epi16(0x3580));  // bf16 2^-20
  return run_chains(iterations, [&](__m512 a) { return _mm512_dpbf16_ps(a, x, y); });
}

int bf16_dot_flops_per_iteration_avx512() { return 12 * 16 * 2 * 2; }

}  // namespace stsa::cpu
