// The FMA-throughput loop for AVX2 + FMA (what measure_fma_peak_gflops times).
#include <immintrin.h>

#include "cpu/kernel.hpp"

namespace stsa::cpu {

// 12 independent chains hide the FMA latency (4-5 cycles) on two FMA pipes.
float fma_chains_avx2(std::int64_t iterations) {
  // Named variables, not an array: an array would live on the stack and the
  // loop would time loads and stores instead of FMAs.
  __m256 a0 = _mm256_set1_ps(0e-3f);
  __m256 a1 = _mm256_set1_ps(1e-3f);
  __m256 a2 = _mm256_set1_ps(2e-3f);
  __m256 a3 = _mm256_set1_ps(3e-3f);
  __m256 a4 = _mm256_set1_ps(4e-3f);
  __m256 a5 = _mm256_set1_ps(5e-3f);
  __m256 a6 = _mm256_set1_ps(6e-3f);
  __m256 a7 = _mm256_set1_ps(7e-3f);
  __m256 a8 = _mm256_set1_ps(8e-3f);
  __m256 a9 = _mm256_set1_ps(9e-3f);
  __m256 a10 = _mm256_set1_ps(10e-3f);
  __m256 a11 = _mm256_set1_ps(11e-3f);
  const __m256 m = _mm256_set1_ps(0.999999f);
  const __m256 c = _mm256_set1_ps(1e-7f);
  for (std::int64_t it = 0; it < iterations; ++it) {
    a0 = _mm256_fmadd_ps(a0, m, c);
    a1 = _mm256_fmadd_ps(a1, m, c);
    a2 = _mm256_fmadd_ps(a2, m, c);
    a3 = _mm256_fmadd_ps(a3, m, c);
    a4 = _mm256_fmadd_ps(a4, m, c);
    a5 = _mm256_fmadd_ps(a5, m, c);
    a6 = _mm256_fmadd_ps(a6, m, c);
    a7 = _mm256_fmadd_ps(a7, m, c);
    a8 = _mm256_fmadd_ps(a8, m, c);
    a9 = _mm256_fmadd_ps(a9, m, c);
    a10 = _mm256_fmadd_ps(a10, m, c);
    a11 = _mm256_fmadd_ps(a11, m, c);
    // Keeps the compiler from merging or hoisting the chains; costs no instruction.
    __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
    __asm__ volatile("" : "+x"(a6), "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
  }
  __m256 sum = _mm256_add_ps(a0, a1);
  sum = _mm256_add_ps(sum, a2);
  sum = _mm256_add_ps(sum, a3);
  sum = _mm256_add_ps(sum, a4);
  sum = _mm256_add_ps(sum, a5);
  sum = _mm256_add_ps(sum, a6);
  sum = _mm256_add_ps(sum, a7);
  sum = _mm256_add_ps(sum, a8);
  sum = _mm256_add_ps(sum, a9);
  sum = _mm256_add_ps(sum, a10);
  sum = _mm256_add_ps(sum, a11);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

int fma_chain_flops_per_iteration_avx2() { return 12 * 8 * 2; }

}  // namespace stsa::cpu
