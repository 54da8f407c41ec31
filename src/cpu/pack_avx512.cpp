// pack_kv_tile for fp32, fp16 or bf16 K and V into the fp32 kernels' panels, 16 keys at a
// time (built with the flags src/cpu/CMakeLists.txt gives *_avx512.cpp; called only
// where the CPU has AVX-512). Element by element, the transpose of K took 14-15 ms
// of a 65 ms fp32 call at density 0.1, and fp16's conversion 7% of an fp16 call.
#include "cpu/intrinsics.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "cpu/pack.hpp"

namespace stsa::cpu {
namespace {

#include "cpu/transpose_avx512.hpp"

// Values [d0, d0 + 16) of a row of `count` elements of `dtype` (null: none) as fp32 bits,
// each exactly (fp16 and bf16 widen without rounding), zeros past its end: a head dim
// padded to the kernel's reads nothing of the next row.
__m512i load_values(const void* row, DType dtype, int d0, int count) {
  if (row == nullptr || d0 >= count) return _mm512_setzero_si512();
  const __mmask16 mask = d0 + 16 <= count ? __mmask16(0xffff) : __mmask16((1u << (count - d0)) - 1);
  if (dtype == DType::F32) return _mm512_maskz_loadu_epi32(mask, static_cast<const float*>(row) + d0);
  const __m256i bits = _mm256_maskz_loadu_epi16(mask, static_cast<const std::uint16_t*>(row) + d0);
  if (dtype == DType::F16) return _mm512_castps_si512(_mm512_cvtph_ps(bits));
  return _mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16);  // bf16: the upper half of its fp32
}

// The AVX-512 operations of the fp32-panel walk (pack_floats_walk.hpp).
struct Lanes {
  using Vector = __m512i;
  static constexpr int kWidth = 16;  // one 16 x 16 transpose
  struct Seen {
    __mmask16 nonfinite = 0, tiny = 0;
  };
  static Vector load(const void* row, DType dtype, int d0, int count) { return load_values(row, dtype, d0, count); }
  // Magnitudes order as their bits do: above the largest finite is Inf or NaN, and tiny is
  // nonzero below kTinyV's bits.
  static void see(Vector x, Seen& seen) {
    static_assert(0x1p-64f == kTinyV, "0x1f800000 spells kTinyV");
    const __m512i mag = _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff));
    seen.nonfinite |= _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7f7fffff));
    seen.tiny |= _mm512_mask_cmplt_epu32_mask(_mm512_test_epi32_mask(mag, mag), mag, _mm512_set1_epi32(0x1f800000));
  }
  static void store(float* out, Vector x) { _mm512_storeu_si512(out, x); }
  static void transpose(Vector (&r)[16]) { transpose_16x16(r); }
  static void report(const Seen& seen, KvFlags& flags) {
    flags.nonfinite |= seen.nonfinite != 0;
    flags.tiny |= seen.tiny != 0;
  }
};

#include "cpu/pack_floats_walk.hpp"

}  // namespace

bool load_row_avx512(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, float scale, float* out,
                     std::int64_t kernel_dim) {
  if (!widens_to_float(t.dtype) || t.stride[3] != 1) return false;
  const int d_count = int(t.head_dim());
  const std::byte* row = static_cast<const std::byte*>(t.data) + t.offset(b, n, h, 0) * element_size(t.dtype);
  const __m512 factor = _mm512_set1_ps(scale);
  for (int d0 = 0; d0 < d_count; d0 += 16) {
    const __m512 x = _mm512_mul_ps(_mm512_castsi512_ps(load_values(row, t.dtype, d0, d_count)), factor);
    _mm512_mask_storeu_ps(out + d0, d0 + 16 <= d_count ? __mmask16(0xffff) : __mmask16((1u << (d_count - d0)) - 1), x);
  }
  std::fill(out + d_count, out + std::max<std::int64_t>(kernel_dim, d_count), 0.0f);
  return true;
}

bool pack_floats_tile_avx512(const RowSource& in, std::int64_t b, std::int64_t h, std::int64_t tile, int tile_k,
                             float* kt, float* v_rows, KvFlags& flags, std::int64_t kernel_dim) {
  return pack_floats_tile_with<Lanes>(in, b, h, tile, tile_k, kt, v_rows, flags, kernel_dim);
}

}  // namespace stsa::cpu
