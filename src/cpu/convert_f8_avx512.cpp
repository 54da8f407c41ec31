// fp8 (E4M3FN) rows to bf16 bits, 32 values at a time (built with the flags
// src/cpu/CMakeLists.txt gives *_avx512.cpp; called only where the CPU has
// AVX-512). The scalar f8e4m3_to_bf16 does not vectorise (GCC 12 will not mix the
// subnormals' fp32 step with 16-bit lanes), and element by element the conversion
// made an fp8 call 30% slower than a bf16 one on the AMX kernel.
#include "cpu/intrinsics.hpp"

#include "cpu/pack.hpp"

namespace stsa::cpu {

void f8e4m3_to_bf16_avx512(const std::uint8_t* src, std::int64_t count, std::uint16_t* dst) {
  // The eight subnormals' bf16 bits, by magnitude (the other lanes are never selected).
  alignas(64) std::uint16_t subnormals[32] = {};
  for (std::uint8_t m = 0; m < 8; ++m) subnormals[m] = f8e4m3_to_bf16(m);
  const __m512i subnormal_bits = _mm512_load_si512(subnormals);
  const __m512i magnitude_mask = _mm512_set1_epi16(0x7f), sign_mask = _mm512_set1_epi16(0x80);
  const __m512i rebias = _mm512_set1_epi16(120 << 7), eight = _mm512_set1_epi16(8);
  const __m512i nan_magnitude = _mm512_set1_epi16(0x7f), quiet_nan = _mm512_set1_epi16(0x7fc0);
  for (std::int64_t d = 0; d < count; d += 32) {
    const std::int64_t left = count - d;
    const __mmask32 lanes = left >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << left) - 1u);
    const __m512i x = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(lanes, src + d));
    const __m512i magnitude = _mm512_and_si512(x, magnitude_mask);
    __m512i out = _mm512_add_epi16(_mm512_slli_epi16(magnitude, 4), rebias);
    out = _mm512_mask_mov_epi16(out, _mm512_cmplt_epu16_mask(magnitude, eight),
                                _mm512_permutexvar_epi16(magnitude, subnormal_bits));
    out = _mm512_mask_mov_epi16(out, _mm512_cmpeq_epi16_mask(magnitude, nan_magnitude), quiet_nan);
    out = _mm512_or_si512(out, _mm512_slli_epi16(_mm512_and_si512(x, sign_mask), 8));
    _mm512_mask_storeu_epi16(dst + d, lanes, out);
  }
}

}  // namespace stsa::cpu
