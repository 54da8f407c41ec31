// Element types and their scalar conversions (round to nearest even).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace stsa {

enum class DType : std::uint8_t { F32, BF16, F16 };

constexpr std::size_t element_size(DType t) { return t == DType::F32 ? 4 : 2; }
// Round-off of one element relative to its magnitude (half an ulp of 1): what storing a value costs.
constexpr double unit_roundoff(DType t) { return t == DType::F32 ? 0x1p-24 : t == DType::BF16 ? 0x1p-8 : 0x1p-11; }
std::string_view to_string(DType t);
DType parse_dtype(std::string_view name);  // "fp32"/"f32"/"float32", "bf16", "fp16"/"f16"; throws InvalidArgument

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

// Loads element i of a buffer of type t as float.
inline float load_as_float(const void* base, DType t, std::int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::BF16: return bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::F16: return f16_to_float(static_cast<const std::uint16_t*>(base)[i]);
  }
  return 0.f;
}

inline void store_from_float(void* base, DType t, std::int64_t i, float value) {
  switch (t) {
    case DType::F32: static_cast<float*>(base)[i] = value; break;
    case DType::BF16: static_cast<std::uint16_t*>(base)[i] = float_to_bf16(value); break;
    case DType::F16: static_cast<std::uint16_t*>(base)[i] = float_to_f16(value); break;
  }
}

}  // namespace stsa
