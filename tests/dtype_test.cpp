// Scalar conversions against IEEE 754 by construction: every fp16 bit pattern
// decoded from its fields, and fp16 / bf16 encoding checked at (and one float
// step either side of) the midpoint between every pair of neighbouring values,
// where round-to-nearest-even decides. The attention tests cannot see these:
// the test support rounds its expected outputs with the same functions.
#include <gtest/gtest.h>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "stsa/dtype.hpp"
#include "stsa/error.hpp"

namespace stsa {
namespace {

bool is_f16_nan(std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }
bool is_bf16_nan(std::uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x007fu) != 0; }

// The value of an fp16 bit pattern from the format's definition (NaN: none).
double f16_value(std::uint16_t h) {
  const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  const double sign = (h & 0x8000u) ? -1.0 : 1.0;
  if (exponent == 0x1f) return sign * std::numeric_limits<double>::infinity();
  if (exponent == 0) return sign * std::ldexp(double(mantissa), -24);  // subnormal (and zero)
  return sign * std::ldexp(double(1024 + mantissa), exponent - 25);
}

TEST(DType, F16DecodesEveryBitPatternByItsFields) {
  for (std::uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const auto h = std::uint16_t(bits);
    const float got = f16_to_float(h);
    if (is_f16_nan(h)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << bits;
      continue;
    }
    EXPECT_EQ(double(got), f16_value(h)) << std::hex << bits;
    EXPECT_EQ(std::signbit(got), (h & 0x8000u) != 0) << std::hex << bits;  // -0 stays -0
  }
}

#if defined(__x86_64__)
// With flush-to-zero and denormals-are-zero on (torch.set_flush_denormal(True) sets
// them), fp16's subnormals, which are normal in fp32, still decode exactly.
TEST(DType, F16DecodesEveryBitPatternUnderFlushToZero) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // FTZ | DAZ
  int wrong = 0;
  for (std::uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const auto h = std::uint16_t(bits);
    const float got = f16_to_float(h);
    wrong += is_f16_nan(h) ? !std::isnan(got) : double(got) != f16_value(h) || std::signbit(got) != ((h & 0x8000u) != 0);
  }
  _mm_setcsr(saved);
  EXPECT_EQ(wrong, 0);
}
#endif

// Neighbouring finite fp16 values a < b (bits h, h + 1): their midpoint is exact
// in fp32 and rounds to the one with the even bit pattern; one fp32 step below
// or above it rounds down or up. The top pair is 65504 and the first value past
// the format (65536), whose "bits" are Inf: 65520 and above round to Inf.
TEST(DType, F16EncodesToTheNearestValueWithTiesToEven) {
  for (std::uint16_t h = 0; h < 0x7c00u; ++h) {
    const double a = f16_value(h), b = h == 0x7bffu ? 65536.0 : f16_value(std::uint16_t(h + 1));
    const auto mid = float((a + b) / 2);
    ASSERT_EQ(double(mid), (a + b) / 2) << "midpoint not exact in fp32";
    for (const float sign : {1.0f, -1.0f}) {
      const std::uint16_t s = sign < 0 ? 0x8000u : 0u;
      const auto up = std::uint16_t(h + 1), even = (h & 1u) ? up : h;
      EXPECT_EQ(float_to_f16(sign * float(a)), s | h) << std::hex << h;
      EXPECT_EQ(float_to_f16(sign * mid), s | even) << std::hex << h << " midpoint";
      EXPECT_EQ(float_to_f16(sign * std::nextafter(mid, 0.0f)), s | h) << std::hex << h << " below the midpoint";
      EXPECT_EQ(float_to_f16(sign * std::nextafter(mid, 1e30f)), s | up) << std::hex << h << " above the midpoint";
    }
  }
  EXPECT_EQ(float_to_f16(1e30f), 0x7c00u);
  EXPECT_EQ(float_to_f16(std::numeric_limits<float>::infinity()), 0x7c00u);
  EXPECT_EQ(float_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00u);
  EXPECT_EQ(float_to_f16(std::numeric_limits<float>::denorm_min()), 0u);  // far below half the smallest subnormal
  EXPECT_EQ(float_to_f16(-0.0f), 0x8000u);
}

TEST(DType, NaNsStayNaNWithTheirSign) {
  // Every mantissa position of an fp32 NaN, including those that fp16 and bf16 drop.
  for (int bit = 0; bit < 23; ++bit)
    for (const std::uint32_t sign : {0u, 0x80000000u}) {
      const float nan = std::bit_cast<float>(sign | 0x7f800000u | (1u << bit));
      ASSERT_TRUE(std::isnan(nan));
      const std::uint16_t h = float_to_f16(nan), b = float_to_bf16(nan);
      EXPECT_TRUE(is_f16_nan(h)) << "fp16 of NaN bit " << bit << ": " << std::hex << h;
      EXPECT_TRUE(is_bf16_nan(b)) << "bf16 of NaN bit " << bit << ": " << std::hex << b;
      EXPECT_EQ((h & 0x8000u) != 0, sign != 0);
      EXPECT_EQ((b & 0x8000u) != 0, sign != 0);
      EXPECT_TRUE(std::isnan(f16_to_float(h)) && std::isnan(bf16_to_float(b)));
    }
  // And infinities are not NaNs.
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80u);
  EXPECT_EQ(float_to_f16(std::numeric_limits<float>::infinity()), 0x7c00u);
}

// bf16 is the top half of fp32: the midpoint between neighbours h and h + 1 is
// the fp32 pattern h:8000, exactly.
TEST(DType, Bf16EncodesToTheNearestValueWithTiesToEven) {
  for (std::uint32_t h = 0; h < 0x7f80u; ++h)
    for (const std::uint32_t s : {0u, 0x8000u}) {
      const std::uint32_t bits = (s | h) << 16;
      const std::uint16_t even = std::uint16_t(s | ((h & 1u) ? h + 1 : h));
      EXPECT_EQ(float_to_bf16(std::bit_cast<float>(bits)), s | h) << std::hex << h;
      EXPECT_EQ(float_to_bf16(std::bit_cast<float>(bits | 0x8000u)), even) << std::hex << h << " midpoint";
      EXPECT_EQ(float_to_bf16(std::bit_cast<float>(bits | 0x7fffu)), s | h) << std::hex << h << " below";
      EXPECT_EQ(float_to_bf16(std::bit_cast<float>(bits | 0x8001u)), s | (h + 1)) << std::hex << h << " above";
      EXPECT_EQ(bf16_to_float(std::uint16_t(s | h)), std::bit_cast<float>(bits));
    }
}

bool is_f8_nan(std::uint8_t b) { return (b & 0x7fu) == 0x7fu; }

// The value of an E4M3FN bit pattern from the format's definition (bias 7, no
// infinities; NaN: none).
double f8e4m3_value(std::uint8_t b) {
  const int exponent = (b >> 3) & 0xf, mantissa = b & 0x7;
  const double sign = (b & 0x80u) ? -1.0 : 1.0;
  if (exponent == 0) return sign * std::ldexp(double(mantissa), -9);  // subnormal (and zero)
  return sign * std::ldexp(double(8 + mantissa), exponent - 10);
}

TEST(DType, F8E4M3DecodesEveryBitPatternByItsFields) {
  EXPECT_EQ(f8e4m3_value(0x7e), 448.0);  // the format's largest finite value
  EXPECT_EQ(f8e4m3_value(0x01), 0x1p-9);
#if defined(__x86_64__)
  const unsigned saved = _mm_getcsr();
  for (const unsigned mode : {saved, saved | 0x8040u}) {  // and under FTZ | DAZ
    _mm_setcsr(mode);
#endif
    for (std::uint32_t bits = 0; bits <= 0xffu; ++bits) {
      const auto b = std::uint8_t(bits);
      const float got = f8e4m3_to_float(b);
      if (is_f8_nan(b)) {
        EXPECT_TRUE(std::isnan(got)) << std::hex << bits;
        EXPECT_EQ(f8e4m3_to_bf16(b), (b & 0x80u ? 0x8000u : 0u) | 0x7fc0u) << std::hex << bits;  // quiet NaN
        continue;
      }
      EXPECT_EQ(double(got), f8e4m3_value(b)) << std::hex << bits;
      EXPECT_EQ(std::signbit(got), (b & 0x80u) != 0) << std::hex << bits;
      EXPECT_EQ(load_as_float(&b, DType::F8E4M3, 0), got);
      EXPECT_EQ(bf16_to_float(f8e4m3_to_bf16(b)), got) << std::hex << bits;  // exact in bf16
    }
#if defined(__x86_64__)
  }
  _mm_setcsr(saved);
#endif
}

// As for fp16: the midpoint of neighbours rounds to the even pattern, a float
// step either side to the nearer one. Past the top pair (448 and the NaN pattern
// 0x7f, "480"): 464 rounds down to 448, anything above is NaN (E4M3FN has no
// infinity), as are Inf and NaN themselves.
TEST(DType, F8E4M3EncodesToTheNearestValueWithTiesToEven) {
  for (std::uint8_t b = 0; b < 0x7e; ++b) {
    const double a = f8e4m3_value(b), next = f8e4m3_value(std::uint8_t(b + 1));
    const auto mid = float((a + next) / 2);
    ASSERT_EQ(double(mid), (a + next) / 2);
    for (const float sign : {1.0f, -1.0f}) {
      const std::uint8_t s = sign < 0 ? 0x80u : 0u;
      const auto up = std::uint8_t(b + 1), even = (b & 1u) ? up : b;
      EXPECT_EQ(float_to_f8e4m3(sign * float(a)), s | b) << std::hex << int(b);
      EXPECT_EQ(float_to_f8e4m3(sign * mid), s | even) << std::hex << int(b) << " midpoint";
      EXPECT_EQ(float_to_f8e4m3(sign * std::nextafter(mid, 0.0f)), s | b) << std::hex << int(b) << " below";
      EXPECT_EQ(float_to_f8e4m3(sign * std::nextafter(mid, 1e9f)), s | up) << std::hex << int(b) << " above";
    }
  }
  EXPECT_EQ(float_to_f8e4m3(448.0f), 0x7e);
  EXPECT_EQ(float_to_f8e4m3(464.0f), 0x7e);
  EXPECT_EQ(float_to_f8e4m3(-464.0f), 0xfe);
  for (const float x : {std::nextafter(464.0f, 1e9f), 480.0f, 1e30f, std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_TRUE(is_f8_nan(float_to_f8e4m3(x))) << x;
    EXPECT_TRUE(is_f8_nan(float_to_f8e4m3(-x))) << -x;
  }
  EXPECT_EQ(float_to_f8e4m3(0x1p-11f), 0x00);  // a quarter of the smallest subnormal
  EXPECT_EQ(float_to_f8e4m3(-0.0f), 0x80);
}

TEST(DType, NamesParseAndPrint) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::F8E4M3}) EXPECT_EQ(parse_dtype(to_string(t)), t);
  EXPECT_EQ(parse_dtype("float16"), DType::F16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::BF16);
  EXPECT_EQ(parse_dtype("float32"), DType::F32);
  for (const char* name : {"fp8", "e4m3", "float8_e4m3fn"}) EXPECT_EQ(parse_dtype(name), DType::F8E4M3);
  EXPECT_THROW(parse_dtype("fp8_e5m2"), InvalidArgument);
  EXPECT_THROW(parse_dtype("int8"), InvalidArgument);
  EXPECT_EQ(element_size(DType::F8E4M3), 1u);
  EXPECT_FALSE(is_output_dtype(DType::F8E4M3));
  EXPECT_TRUE(is_output_dtype(DType::BF16));
}

}  // namespace
}  // namespace stsa
