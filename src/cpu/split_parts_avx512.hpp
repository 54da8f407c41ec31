// P, an fp32 matrix, as bf16 parts for the tile products' left operand: shared
// by the attention kernel (kernel_amx.cpp) and the router's tiles
// (routing_tiles_amx.cpp). Included inside an anonymous namespace, after
// <immintrin.h>, by files built with the AMX flags.

// p[rows][cols] (row stride `stride`; cols a multiple of 32) as kParts bf16
// parts: part j of row i at parts + j * part_stride + i * stride. One part: P
// rounded to nearest bf16. Three parts sum to P exactly: each is the
// remainder's upper 16 bits (truncation, so the remainders are exact in fp32
// and the parts exact in bf16); 24 significand bits fit in three parts of 8.
// Values below 2^-103 lose their last part (a part under 2^-126 converts to 0),
// and below 2^-118 the middle one too: at most 2^-7 of themselves, nothing next
// to a row's largest P = 1 unless their V is 2^95 times larger than its. Two
// parts: the second is the remainder rounded to nearest, so hi + mid is within
// 2^-16 of P (the remainder is below 2^-7 of P and keeps 8 bits).
template <int kParts>
void split_into_parts(const float* p, int rows, int cols, int stride, std::int64_t part_stride,
                      std::uint16_t* parts) {
  static_assert(kParts >= 1 && kParts <= 3);
  const __m512i upper = _mm512_set1_epi32(int(0xffff0000u));
  auto upper_half = [&](__m512 x) { return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), upper)); };
  for (int i = 0; i < rows; ++i)
    for (int c = 0; c < cols; c += 32) {
      const __m512 x0 = _mm512_loadu_ps(p + std::int64_t(i) * stride + c);
      const __m512 x1 = _mm512_loadu_ps(p + std::int64_t(i) * stride + c + 16);
      std::uint16_t* at = parts + std::int64_t(i) * stride + c;
      if constexpr (kParts == 1) {  // rounds to nearest (lanes 0-15 from the second operand)
        _mm512_storeu_si512(at, __m512i(_mm512_cvtne2ps_pbh(x1, x0)));
        continue;
      }
      const __m512 hi0 = upper_half(x0), hi1 = upper_half(x1);
      const __m512 r0 = _mm512_sub_ps(x0, hi0), r1 = _mm512_sub_ps(x1, hi1);
      // Values that are bf16 already only get packed.
      _mm512_storeu_si512(at, __m512i(_mm512_cvtne2ps_pbh(hi1, hi0)));
      if constexpr (kParts == 2) {
        _mm512_storeu_si512(at + part_stride, __m512i(_mm512_cvtne2ps_pbh(r1, r0)));  // rounds to nearest
      } else {
        const __m512 mid0 = upper_half(r0), mid1 = upper_half(r1);
        const __m512 lo0 = _mm512_sub_ps(r0, mid0), lo1 = _mm512_sub_ps(r1, mid1);
        _mm512_storeu_si512(at + part_stride, __m512i(_mm512_cvtne2ps_pbh(mid1, mid0)));
        _mm512_storeu_si512(at + 2 * part_stride, __m512i(_mm512_cvtne2ps_pbh(lo1, lo0)));
      }
    }
}
