// fp16 Q, K and V for the AMX kernel, whose tile products take bf16 only: each
// value as two bf16 parts (kernel.hpp). Built with the AMX file flags, which
// include AVX-512 BF16 and F16C.
#include "cpu/intrinsics.hpp"

#include "cpu/kernel.hpp"

namespace stsa::cpu {

bool split_f16_to_bf16(const std::uint16_t* f16, std::int64_t count, std::uint16_t* high, std::uint16_t* low) {
  // Inf (either sign) and NaN (quiet or signalling).
  constexpr int kNonFinite = 0x01 | 0x08 | 0x10 | 0x80;
  __mmask16 nonfinite = 0;
  for (std::int64_t i = 0; i < count; i += 32) {
    // The last 32 values may be fewer: masked loads (zeros, which split into zeros) and stores.
    const std::int64_t left = count - i;
    const __mmask32 lanes = left >= 32 ? ~__mmask32(0) : (__mmask32(1) << left) - 1;
    const __m512 x0 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(__mmask16(lanes), f16 + i));
    const __m512 x1 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(__mmask16(lanes >> 16), f16 + i + 16));
    const __m512bh hi = _mm512_cvtne2ps_pbh(x1, x0);  // rounds to nearest; lanes 0-15 from x0
    const __m512i hi_bits = __m512i(hi);
    // The parts back in fp32 (a bf16 is the upper half of its fp32), and the remainders.
    const auto widen = [](__m256i bf16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16), 16));
    };
    const __m512 hi0 = widen(_mm512_castsi512_si256(hi_bits)), hi1 = widen(_mm512_extracti64x4_epi64(hi_bits, 1));
    const __mmask16 bad0 = _mm512_fpclass_ps_mask(x0, kNonFinite), bad1 = _mm512_fpclass_ps_mask(x1, kNonFinite);
    nonfinite |= bad0 | bad1;
    // Exact: both have at most 11 significant bits and the same scale.
    const __m512 lo0 = _mm512_maskz_sub_ps(__mmask16(~bad0), x0, hi0);
    const __m512 lo1 = _mm512_maskz_sub_ps(__mmask16(~bad1), x1, hi1);
    _mm512_mask_storeu_epi16(high + i, lanes, hi_bits);
    _mm512_mask_storeu_epi16(low + i, lanes, __m512i(_mm512_cvtne2ps_pbh(lo1, lo0)));
  }
  return nonfinite != 0;
}

}  // namespace stsa::cpu
