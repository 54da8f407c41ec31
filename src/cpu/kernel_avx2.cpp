// The attention kernel for AVX2 + FMA (built with the flags src/cpu/CMakeLists.txt gives *_avx2.cpp).
#include <immintrin.h>

#include "cpu/kernel.hpp"

namespace stsa::cpu {
namespace {

struct Vec {
  static constexpr bool kHasBf16Dot = false;
  static constexpr int W = 8;
  using reg = __m256;
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg x) { _mm256_storeu_ps(p, x); }
  static reg zero() { return _mm256_setzero_ps(); }
  static reg set1(float x) { return _mm256_set1_ps(x); }
  static reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  static float reduce_max(reg x) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
  }
  static float reduce_add(reg x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static reg select(unsigned bits, reg x, reg fill) {
    const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(bits)), lane_bit), lane_bit);
    return _mm256_blendv_ps(fill, x, _mm256_castsi256_ps(set));
  }
  // 2^x = 2^n * 2^f, n = round(x), |f| <= 1/2, 2^f by kExp2Poly (kernel.hpp).
  // Clamping at -127 makes 2^n's exponent field 0, so -inf gives exactly 0; the
  // clamp keeps x when x is NaN (MAXPS returns its second operand then).
  static reg exp2(reg x) {
    x = _mm256_max_ps(_mm256_set1_ps(-127.0f), x);
    const reg n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const reg f = _mm256_sub_ps(x, n);
    reg p = _mm256_set1_ps(kExp2Poly[0]);
    for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Poly[i]));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  }
};

// 16 registers: 6 rows x 2 vectors (16 columns) of accumulators, 2 K loads, 1 broadcast.
constexpr int kQkRows = 6;
constexpr int kQkVecs = 2;
constexpr int kPvAccumulators = 12;
constexpr int kPvMaxVecs = 2;
// Softmax: 2 rows x (max or sum, shift) + the exp2 constants fit in 16.
constexpr int kSoftmaxRows = 2;

#include "cpu/kernel_impl.hpp"

}  // namespace

AttendFn attend_avx2(int head_dim) { return attend_for(head_dim); }

}  // namespace stsa::cpu
