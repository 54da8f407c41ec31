// pack_kv_tile for bf16 K and V into the AMX kernel's pair panels, 16 keys at a
// time (built with the flags src/cpu/CMakeLists.txt gives *_amx.cpp; only AMX
// hosts, which all have AVX-512, call it). Element by element, the transpose of K
// and the interleaving of V took a third of a call at density 0.1.
#include <immintrin.h>

#include "cpu/pack.hpp"

namespace stsa::cpu {
namespace {

constexpr int kKeys = 16;  // keys per step: one 16 x 16 transpose of 32-bit pairs

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

}  // namespace

bool pack_bf16_tile_amx(const RowSource& in, std::int64_t b, std::int64_t h, std::int64_t tile, int tile_k,
                        std::uint32_t* kt_pairs, std::uint32_t* v_pairs, KvFlags& flags) {
  const TensorView &k = in.k, &v = in.v;
  const int d_count = int(k.head_dim());
  if (k.dtype != DType::BF16 || v.dtype != DType::BF16 || k.stride[3] != 1 || v.stride[3] != 1 ||
      d_count % 32 != 0 || d_count > 512 || tile_k % kKeys != 0)
    return false;
  const std::int64_t head = in.head(h);
  const std::int64_t n0 = tile * tile_k;
  const std::int64_t valid = std::min<std::int64_t>(tile_k, k.tokens() - n0);
  const int words = d_count / 2;  // a K row's pairs
  const __m512i magnitude = _mm512_set1_epi16(0x7fff);
  // V's flags (KvFlags): an all-ones exponent is Inf or NaN; magnitudes order as
  // their bits do, so tiny is nonzero below 2^-64's bits.
  const __m512i exponent = _mm512_set1_epi16(0x7f80), tiny_bits = _mm512_set1_epi16(0x1f80);
  static_assert(0x1p-64f == kTinyV, "0x1f80 spells kTinyV");
  __mmask32 nonfinite = 0, tiny = 0;
  // Pairs of keys' V channels side by side: lanes 2i and 2i + 1 of the result are
  // channel i of the first and of the second key (first half; then i + 16).
  alignas(64) std::uint16_t low_index[32], high_index[32];
  for (int i = 0; i < 16; ++i) {
    low_index[2 * i] = std::uint16_t(i);
    low_index[2 * i + 1] = std::uint16_t(32 + i);
    high_index[2 * i] = std::uint16_t(16 + i);
    high_index[2 * i + 1] = std::uint16_t(48 + i);
  }
  const __m512i interleave_low = _mm512_load_si512(low_index), interleave_high = _mm512_load_si512(high_index);

  const std::uint16_t* k_rows[kKeys];
  const std::uint16_t* v_rows[kKeys];
  for (std::int64_t c0 = 0; c0 < tile_k; c0 += kKeys) {
    for (int i = 0; i < kKeys; ++i) {
      const std::int64_t c = c0 + i;
      const bool real = c < valid;
      const std::int64_t n = real ? in.token(n0 + c) : 0;
      k_rows[i] = real ? static_cast<const std::uint16_t*>(k.data) + k.offset(b, n, head, 0) : nullptr;
      v_rows[i] = real ? static_cast<const std::uint16_t*>(v.data) + v.offset(b, n, head, 0) : nullptr;
      if (c + kKeys < valid) {
        prefetch_row(k, b, in.token(n0 + c + kKeys), head);
        prefetch_row(v, b, in.token(n0 + c + kKeys), head);
      }
    }
    // K: 16 rows of pairs, 16 words at a time, transposed to 16 pair rows of 16 keys.
    for (int w0 = 0; w0 < words; w0 += 16) {
      __m512i r[16];
      for (int i = 0; i < kKeys; ++i)
        r[i] = k_rows[i] ? _mm512_loadu_si512(k_rows[i] + 2 * w0) : _mm512_setzero_si512();
      transpose_16x16(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(kt_pairs + std::int64_t(w0 + i) * tile_k + c0, r[i]);
    }
    // V: keys 2j and 2j + 1 interleaved channel by channel, 32 channels at a time.
    for (int j = 0; j < kKeys; j += 2) {
      std::uint32_t* out = v_pairs + (c0 + j) / 2 * d_count;
      for (int d0 = 0; d0 < d_count; d0 += 32) {
        const __m512i first = v_rows[j] ? _mm512_loadu_si512(v_rows[j] + d0) : _mm512_setzero_si512();
        const __m512i second = v_rows[j + 1] ? _mm512_loadu_si512(v_rows[j + 1] + d0) : _mm512_setzero_si512();
        for (const __m512i x : {first, second}) {
          const __m512i mag = _mm512_and_si512(x, magnitude);
          nonfinite |= _mm512_cmpge_epu16_mask(mag, exponent);
          tiny |= _mm512_mask_cmplt_epu16_mask(_mm512_test_epi16_mask(mag, mag), mag, tiny_bits);
        }
        _mm512_storeu_si512(out + d0, _mm512_permutex2var_epi16(first, interleave_low, second));
        _mm512_storeu_si512(out + d0 + 16, _mm512_permutex2var_epi16(first, interleave_high, second));
      }
    }
  }
  flags.nonfinite |= nonfinite != 0;
  flags.tiny |= tiny != 0;
  return true;
}

}  // namespace stsa::cpu
