// pack_kv_tile for fp32, fp16 or bf16 K and V into the fp32 kernels' panels on AVX2 hosts
// (built with the flags src/cpu/CMakeLists.txt gives *_avx2.cpp, F16C among them; called
// only where the CPU has AVX2 and not AVX-512, whose packer takes 16 keys at a time):
// 8 keys at a time, K through 8 x 8 transposes. Element by element, K's transpose took
// 14-15 ms of a 65 ms fp32 call at density 0.1.
#include "cpu/intrinsics.hpp"

#include <algorithm>
#include <cstring>

#include "cpu/pack.hpp"

namespace stsa::cpu {
namespace {

// Eight elements of `dtype` at `at` as fp32 bits, each exactly.
__m256i widened(const unsigned char* at, DType dtype) {
  if (dtype == DType::F32) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
  if (dtype == DType::F16) return _mm256_castps_si256(_mm256_cvtph_ps(bits));
  return _mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16);  // bf16: the upper half of its fp32
}

// Values [d0, d0 + 8) of a row of `count` elements of `dtype` (null: none) as fp32 bits,
// zeros past its end (a head dim padded to the kernel's reads nothing of the next row).
// The partial tail goes through a copy: AVX2 has no masked 16-bit loads.
__m256i load_values(const void* row, DType dtype, int d0, int count) {
  if (row == nullptr || d0 >= count) return _mm256_setzero_si256();
  const std::size_t size = dtype == DType::F32 ? 4 : 2;
  const unsigned char* at = static_cast<const unsigned char*>(row) + std::size_t(d0) * size;
  if (d0 + 8 <= count) return widened(at, dtype);
  alignas(32) unsigned char tail[32] = {};
  std::memcpy(tail, at, std::size_t(count - d0) * size);
  return widened(tail, dtype);
}

// An 8 x 8 matrix of 32-bit words (one row per register), transposed in place.
void transpose_8x8(__m256i (&r)[8]) {
  __m256i t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  __m256i u[8];
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // u[m] (rows 0-3) and u[4 + m] (rows 4-7): lane 0 holds column m, lane 1 column 4 + m.
  for (int m = 0; m < 4; ++m) {
    r[m] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x20);
    r[4 + m] = _mm256_permute2x128_si256(u[m], u[4 + m], 0x31);
  }
}

// The AVX2 operations of the fp32-panel walk (pack_floats_walk.hpp).
struct Lanes {
  using Vector = __m256i;
  static constexpr int kWidth = 8;  // one 8 x 8 transpose
  struct Seen {
    __m256i nonfinite = _mm256_setzero_si256(), tiny = _mm256_setzero_si256();
  };
  static Vector load(const void* row, DType dtype, int d0, int count) { return load_values(row, dtype, d0, count); }
  // As the AVX-512 walk's: magnitudes (non-negative as int32) order as their bits do; above
  // the largest finite is Inf or NaN, nonzero below kTinyV's bits is tiny.
  static void see(Vector x, Seen& seen) {
    static_assert(0x1p-64f == kTinyV, "0x1f800000 spells kTinyV");
    const __m256i mag = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
    seen.nonfinite = _mm256_or_si256(seen.nonfinite, _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f7fffff)));
    const __m256i zero = _mm256_cmpeq_epi32(mag, _mm256_setzero_si256());
    seen.tiny = _mm256_or_si256(seen.tiny,
                                _mm256_andnot_si256(zero, _mm256_cmpgt_epi32(_mm256_set1_epi32(0x1f800000), mag)));
  }
  static void store(float* out, Vector x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), x); }
  static void transpose(Vector (&r)[8]) { transpose_8x8(r); }
  static void report(const Seen& seen, KvFlags& flags) {
    flags.nonfinite |= !_mm256_testz_si256(seen.nonfinite, seen.nonfinite);
    flags.tiny |= !_mm256_testz_si256(seen.tiny, seen.tiny);
  }
};

#include "cpu/pack_floats_walk.hpp"

}  // namespace

bool pack_floats_tile_avx2(const RowSource& in, std::int64_t b, std::int64_t h, std::int64_t tile, int tile_k,
                           float* kt, float* v_rows, KvFlags& flags, std::int64_t kernel_dim) {
  return pack_floats_tile_with<Lanes>(in, b, h, tile, tile_k, kt, v_rows, flags, kernel_dim);
}

}  // namespace stsa::cpu
