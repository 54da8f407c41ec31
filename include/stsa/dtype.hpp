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

float f16_to_float(std::uint16_t bits);
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
