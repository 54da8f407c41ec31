// pack_kv_tile for bf16 or fp16 K and V into the AMX kernel's pair panels, 16
// keys at a time (built with the flags src/cpu/CMakeLists.txt gives *_amx.cpp;
// only AMX hosts, which all have AVX-512, call it). Element by element, the
// transpose of K and the interleaving of V took a third of a bf16 call at density
// 0.1. fp16 rows are first split into their two bf16 parts (split_f16_to_bf16),
// each part then packed as a bf16 row is, into its own panel; fp8 rows are first
// converted to their bf16 bits (exactly), then packed as bf16 rows.
#include "cpu/intrinsics.hpp"

#include <algorithm>
#include <cstring>

#include "cpu/kernel.hpp"
#include "cpu/pack.hpp"

namespace stsa::cpu {
namespace {

#include "cpu/transpose_avx512.hpp"

constexpr int kKeys = 16;  // keys per step: one 16 x 16 transpose of 32-bit pairs

// Values [d0, d0 + 32) of a row of `count` 16-bit values (null: none), zeros past
// its end: a head dim padded to the kernel's reads nothing of the next row.
__m512i load_values(const std::uint16_t* row, int d0, int count) {
  if (row == nullptr || d0 >= count) return _mm512_setzero_si512();
  if (d0 + 32 <= count) return _mm512_loadu_si512(row + d0);
  return _mm512_maskz_loadu_epi16(__mmask32((1ull << (count - d0)) - 1), row + d0);
}

}  // namespace

bool pack_pairs_tile_amx(const RowSource& in, std::int64_t b, std::int64_t h, std::int64_t tile, int tile_k,
                         std::uint32_t* kt_pairs, std::uint32_t* v_pairs, KvFlags& flags, std::int64_t kernel_dim) {
  const TensorView &k = in.k, &v = in.v;
  const int d_count = int(k.head_dim());
  const int kd = int(std::max<std::int64_t>(kernel_dim, d_count));  // the panels' channels: the head's, then zeros
  const bool split = k.dtype == DType::F16, fp8 = k.dtype == DType::F8E4M3;
  if ((k.dtype != DType::BF16 && !split && !fp8) || v.dtype != k.dtype || k.stride[3] != 1 || v.stride[3] != 1 ||
      kd % 32 != 0 || kd > kMaxPairPanelDim || tile_k % kKeys != 0)
    return false;
  const int parts = split ? 2 : 1;
  const std::int64_t head = in.kv_head(h);
  const std::int64_t n0 = tile * tile_k;
  const std::int64_t valid = std::min<std::int64_t>(tile_k, k.tokens() - n0);
  const std::int64_t k_part = std::int64_t(kd / 2) * tile_k, v_part = std::int64_t(tile_k / 2) * kd;
  const int words = kd / 2;  // a K row's pairs
  const __m512i magnitude = _mm512_set1_epi16(0x7fff);
  // bf16 V's flags (KvFlags): an all-ones exponent is Inf or NaN; magnitudes order
  // as their bits do, so tiny is nonzero below 2^-64's bits. (fp16 V is never tiny,
  // nor its low parts; its Inf and NaN are reported by the split.)
  const __m512i exponent = _mm512_set1_epi16(0x7f80), tiny_bits = _mm512_set1_epi16(0x1f80);
  static_assert(0x1p-64f == kTinyV, "0x1f80 spells kTinyV");
  __mmask32 nonfinite = 0, tiny = 0;
  bool split_v_nonfinite = false, split_k_nonfinite = false;
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

  // [part][key]: where each key's row of bf16 values (or of one part's) is; null past the sequence.
  const std::uint16_t* k_rows[2][kKeys];
  const std::uint16_t* v_rows[2][kKeys];
  alignas(64) std::uint16_t k_split[kKeys][2][kMaxPairPanelDim], v_split[kKeys][2][kMaxPairPanelDim];
  for (std::int64_t c0 = 0; c0 < tile_k; c0 += kKeys) {
    const std::uint16_t* k_in[kKeys];
    const std::uint16_t* v_in[kKeys];
    if (fp8) {  // bf16 rows made in k_split / v_split's first part
      const std::uint8_t* k_bytes[kKeys];
      const std::uint8_t* v_bytes[kKeys];
      key_rows(in, b, head, n0, c0, valid, kKeys, k_bytes, v_bytes);
      for (int i = 0; i < kKeys; ++i) {
        k_in[i] = k_bytes[i] ? k_split[i][0] : nullptr;
        v_in[i] = v_bytes[i] ? v_split[i][0] : nullptr;
        if (k_bytes[i] == nullptr) continue;
        f8e4m3_to_bf16_avx512(k_bytes[i], d_count, k_split[i][0]);
        f8e4m3_to_bf16_avx512(v_bytes[i], d_count, v_split[i][0]);
      }
    } else {
      key_rows(in, b, head, n0, c0, valid, kKeys, k_in, v_in);
    }
    for (int i = 0; i < kKeys; ++i) {
      if (!split || k_in[i] == nullptr) {
        k_rows[0][i] = k_in[i];
        v_rows[0][i] = v_in[i];
        k_rows[1][i] = v_rows[1][i] = nullptr;
        continue;
      }
      split_k_nonfinite |= split_f16_to_bf16(k_in[i], d_count, k_split[i][0], k_split[i][1]);
      split_v_nonfinite |= split_f16_to_bf16(v_in[i], d_count, v_split[i][0], v_split[i][1]);
      for (int p = 0; p < 2; ++p) {
        k_rows[p][i] = k_split[i][p];
        v_rows[p][i] = v_split[i][p];
      }
    }
    for (int p = 0; p < parts; ++p) {
      // K: 16 rows of pairs, 16 words at a time, transposed to 16 pair rows of 16 keys.
      for (int w0 = 0; w0 < words; w0 += 16) {
        __m512i r[16];
        for (int i = 0; i < kKeys; ++i) r[i] = load_values(k_rows[p][i], 2 * w0, d_count);
        transpose_16x16(r);
        for (int i = 0; i < 16; ++i)
          _mm512_storeu_si512(kt_pairs + p * k_part + std::int64_t(w0 + i) * tile_k + c0, r[i]);
      }
      // V: keys 2j and 2j + 1 interleaved channel by channel, 32 channels at a time.
      for (int j = 0; j < kKeys; j += 2) {
        std::uint32_t* out = v_pairs + p * v_part + (c0 + j) / 2 * kd;
        for (int d0 = 0; d0 < kd; d0 += 32) {
          const __m512i first = load_values(v_rows[p][j], d0, d_count);
          const __m512i second = load_values(v_rows[p][j + 1], d0, d_count);
          if (!split)
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
  }
  flags.nonfinite |= nonfinite != 0 || split_v_nonfinite;
  flags.tiny |= tiny != 0;
  flags.k_nonfinite |= split_k_nonfinite;
  return true;
}

}  // namespace stsa::cpu
