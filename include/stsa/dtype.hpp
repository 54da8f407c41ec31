// Element types and their scalar conversions (round to nearest even).
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace stsa {

// F8E4M3 is OCP FP8 E4M3FN (PyTorch's float8_e4m3fn): 4 exponent bits (bias 7), 3
// mantissa bits, no infinities, NaN = S.1111.111, largest finite 448. It is an
// input type only: q, k and v may hold it, o may not (an fp8 O would lose more to
// its rounding than the sparsity costs). A model's per-tensor descales fold in
// exactly: q's and k's into the softmax scale, v's onto O.
enum class DType : std::uint8_t { F32, BF16, F16, F8E4M3 };

constexpr std::size_t element_size(DType t) { return t == DType::F32 ? 4 : t == DType::F8E4M3 ? 1 : 2; }
// Round-off of one element relative to its magnitude (half an ulp of 1): what storing a value costs.
constexpr double unit_roundoff(DType t) {
  return t == DType::F32 ? 0x1p-24 : t == DType::BF16 ? 0x1p-8 : t == DType::F16 ? 0x1p-11 : 0x1p-4;
}
// Whether o may have this type (every type but fp8).
constexpr bool is_output_dtype(DType t) { return t != DType::F8E4M3; }
// The O a caller gets by default for inputs of type t: the same type, bf16 for fp8
// (every fp8 value is exact in bf16).
constexpr DType default_output_dtype(DType t) { return is_output_dtype(t) ? t : DType::BF16; }
std::string_view to_string(DType t);
// "fp32"/"f32"/"float32", "bf16"/"bfloat16", "fp16"/"f16"/"float16",
// "fp8"/"fp8_e4m3"/"e4m3"/"float8_e4m3fn"; throws InvalidArgument.
DType parse_dtype(std::string_view name);

inline float bf16_to_float(std::uint16_t bits) {
  std::uint32_t u = std::uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}

// Exact for every fp16 value, without branches (so loops over it vectorise) and
// without subnormal fp32 operands (so a flush-to-zero mode cannot change it):
// the fields move into fp32's places and the exponent is rebiased; Inf and NaN
// get fp32's all-ones exponent; subnormals, m x 2^-24, are made as 2^-14 (1 +
// m / 1024) - 2^-14.
inline float f16_to_float(std::uint16_t bits) {
  constexpr std::uint32_t kExponentMask = 0x7c00u << 13;
  const std::uint32_t magnitude = std::uint32_t(bits & 0x7fffu) << 13;
  const std::uint32_t exponent = magnitude & kExponentMask;
  std::uint32_t u = magnitude + ((127u - 15u) << 23);
  if (exponent == kExponentMask) u += (128u - 16u) << 23;
  float value, smallest_normal;
  std::memcpy(&value, &u, 4);
  if (exponent == 0) {
    const std::uint32_t renormalised = u + (1u << 23), two_to_minus_14 = 113u << 23;
    std::memcpy(&value, &renormalised, 4);
    std::memcpy(&smallest_normal, &two_to_minus_14, 4);
    value -= smallest_normal;
  }
  std::memcpy(&u, &value, 4);
  u |= std::uint32_t(bits & 0x8000u) << 16;
  std::memcpy(&value, &u, 4);
  return value;
}
std::uint16_t float_to_f16(float f);

namespace detail {
// The fp32 bits of every E4M3FN magnitude (f8e4m3_to_float ORs the sign in):
// normals move their fields into fp32's places with the exponent rebiased
// (7 -> 127), subnormals are m x 2^-9, the one NaN magnitude is fp32's NaN.
constexpr std::array<std::uint32_t, 128> f8e4m3_magnitude_bits() {
  std::array<std::uint32_t, 128> bits{};
  for (std::uint32_t m = 1; m < 128; ++m)
    bits[m] = m < 8 ? std::bit_cast<std::uint32_t>(float(m) * 0x1p-9f) : (m << 20) + (120u << 23);
  bits[0x7f] = 0x7fc00000u;
  return bits;
}
inline constexpr std::array<std::uint32_t, 128> kF8E4M3MagnitudeBits = f8e4m3_magnitude_bits();
}  // namespace detail

// Exact for every E4M3FN value. A table lookup, because loops over it then
// vectorise (as gathers, under AVX2 and AVX-512), which no branch-free
// arithmetic form did with GCC 12.
inline float f8e4m3_to_float(std::uint8_t bits) {
  return std::bit_cast<float>(detail::kF8E4M3MagnitudeBits[bits & 0x7fu] | (std::uint32_t(bits & 0x80u) << 24));
}
// The bf16 bits of an E4M3FN value: its fp32 value's upper half, exact (4
// significant bits at most) and NaN as bf16's quiet NaN. (The AVX-512 packer
// converts 32 at a time: cpu::f8e4m3_to_bf16_avx512.)
inline std::uint16_t f8e4m3_to_bf16(std::uint8_t bits) {
  return std::uint16_t(std::bit_cast<std::uint32_t>(f8e4m3_to_float(bits)) >> 16);
}
// Round to nearest even; what rounds past 448 (|f| > 464), Inf and NaN become
// NaN, as PyTorch's and ml_dtypes' conversions do (E4M3FN has no infinity).
std::uint8_t float_to_f8e4m3(float f);

// Loads element i of a buffer of type t as float.
inline float load_as_float(const void* base, DType t, std::int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::BF16: return bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::F16: return f16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::F8E4M3: return f8e4m3_to_float(static_cast<const std::uint8_t*>(base)[i]);
  }
  return 0.f;
}

inline void store_from_float(void* base, DType t, std::int64_t i, float value) {
  switch (t) {
    case DType::F32: static_cast<float*>(base)[i] = value; break;
    case DType::BF16: static_cast<std::uint16_t*>(base)[i] = float_to_bf16(value); break;
    case DType::F16: static_cast<std::uint16_t*>(base)[i] = float_to_f16(value); break;
    case DType::F8E4M3: static_cast<std::uint8_t*>(base)[i] = float_to_f8e4m3(value); break;
  }
}

}  // namespace stsa
