// A 16 x 16 transpose of 32-bit words in AVX-512 registers, shared by the packers
// (pack_pairs_amx.cpp, pack_avx512.cpp). Included inside an anonymous namespace,
// after <immintrin.h>, by files built with the AVX-512 flags.

// A 16 x 16 matrix of 32-bit words (one row per register), transposed in place.
void transpose_16x16(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {  // words 2k, 2k + 1 of rows i, i + 1 side by side
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // Now r[4g + m], 128-bit lane L: column 4L + m of rows 4g .. 4g + 3.
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // Gather lane L of r[m], r[4 + m], r[8 + m], r[12 + m] into row 4L + m.
  for (int m = 0; m < 4; ++m) {
    const __m512i g01_even = _mm512_shuffle_i32x4(r[m], r[4 + m], 0x88);  // lanes 0, 2 of each
    const __m512i g01_odd = _mm512_shuffle_i32x4(r[m], r[4 + m], 0xdd);   // lanes 1, 3 of each
    const __m512i g23_even = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0x88);
    const __m512i g23_odd = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0xdd);
    r[m] = _mm512_shuffle_i32x4(g01_even, g23_even, 0x88);
    r[8 + m] = _mm512_shuffle_i32x4(g01_even, g23_even, 0xdd);
    r[4 + m] = _mm512_shuffle_i32x4(g01_odd, g23_odd, 0x88);
    r[12 + m] = _mm512_shuffle_i32x4(g01_odd, g23_odd, 0xdd);
  }
}
