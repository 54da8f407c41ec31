// The AVX-512 vector interface of kernel_impl.hpp and its register budget,
// shared by kernel_avx512.cpp and kernel_amx.cpp. Included inside an anonymous
// namespace, after <immintrin.h>, by files built with the AVX-512 flags.

struct Vec {
  static constexpr int W = 16;
  using reg = __m512;
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, reg x) { _mm512_storeu_ps(p, x); }
  static reg zero() { return _mm512_setzero_ps(); }
  static reg set1(float x) { return _mm512_set1_ps(x); }
  static reg fmadd(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg max(reg a, reg b) { return _mm512_max_ps(a, b); }
  static float reduce_max(reg x) { return _mm512_reduce_max_ps(x); }
  static float reduce_add(reg x) { return _mm512_reduce_add_ps(x); }
  static reg select(unsigned bits, reg x, reg fill) { return _mm512_mask_blend_ps(__mmask16(bits), fill, x); }
  // VDPBF16PS: per lane acc + a.hi * b.hi + a.lo * b.lo, the products exact in fp32
  // and each sum rounded (two FMAs); bf16 subnormal inputs count as zero.
  static constexpr bool kHasBf16Dot = true;
  using pairs = __m512i;  // 16 lanes of two bf16
  static pairs load_pairs(const std::uint32_t* p) { return _mm512_loadu_si512(p); }
  static reg dot_pairs(reg acc, std::uint32_t a, pairs b) {
    return _mm512_dpbf16_ps(acc, __m512bh(_mm512_set1_epi32(int(a))), __m512bh(b));
  }
  // 2W values (lo's lanes, then hi's) rounded to nearest bf16, as W pairs of neighbours:
  // pair j holds values 2j (low half) and 2j + 1.
  static pairs round_to_pairs(reg lo, reg hi) { return __m512i(_mm512_cvtne2ps_pbh(hi, lo)); }
  static void store_pairs(std::uint32_t* p, pairs x) { _mm512_storeu_si512(p, x); }
  // 2^x = 2^n * 2^f, n = round(x), |f| <= 1/2, 2^f by kExp2Poly (kernel.hpp). Below
  // x = -150 the result rounds to 0 anyway; those
  // lanes (-inf: every masked score) are zeroed through SCALEF's zero-mask and
  // computed from x = 0, because an underflowing SCALEF takes a microcode assist per
  // vector on Intel cores, which made a partial tile cost 2.8x a full one on the AMX
  // path. Everything from -150 up is computed as before, subnormal results included.
  // NaN is kept (the comparison is unordered-true for it).
  static reg exp2(reg x) { return exp2_by(x, kExp2Poly); }
  // For P rounded to bf16 next (kExp2PolyForBf16): 2^-18.5 relative error, two FMAs fewer.
  static reg exp2_for_bf16(reg x) { return exp2_by(x, kExp2PolyForBf16); }
  template <std::size_t kTerms>
  static reg exp2_by(reg x, const float (&poly)[kTerms]) {
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-150.0f), _CMP_NLT_UQ);
    const reg n = _mm512_maskz_roundscale_ps(keep, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const reg f = _mm512_maskz_sub_ps(keep, x, n);
    reg p = _mm512_set1_ps(poly[0]);
    for (std::size_t i = 1; i < kTerms; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(poly[i]));
    return _mm512_maskz_scalef_ps(keep, p, n);
  }
};

// 32 registers: 6 rows x 4 vectors (64 columns) of accumulators, 4 K loads, 1 broadcast.
constexpr int kQkRows = 6;
constexpr int kQkVecs = 4;
constexpr int kPvAccumulators = 24;
constexpr int kPvMaxVecs = 6;
// Softmax: 4 rows x (max or sum, shift) + the exp2 constants and temporaries fit in 32.
constexpr int kSoftmaxRows = 4;
