#include "stsa/dtype.hpp"

#include <bit>
#include <cmath>

#include "stsa/error.hpp"

namespace stsa {

std::string_view to_string(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    case DType::F8E4M3: return "fp8_e4m3";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  if (name == "fp32" || name == "f32" || name == "float32") return DType::F32;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  if (name == "fp16" || name == "f16" || name == "float16") return DType::F16;
  if (name == "fp8" || name == "fp8_e4m3" || name == "e4m3" || name == "float8_e4m3fn") return DType::F8E4M3;
  throw InvalidArgument(detail::concat("dtype must be fp32, bf16, fp16 or fp8_e4m3, got '", name, "'"));
}

std::uint8_t float_to_f8e4m3(float f) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  const std::uint8_t sign = std::uint8_t((bits >> 24) & 0x80u);
  const std::uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x43e80000u) return sign | 0x7fu;  // NaN, Inf, or rounds past 448 (> 464)
  if (abs_bits < 0x3c800000u) {                      // below the smallest normal 2^-6
    const float scaled = std::bit_cast<float>(abs_bits) * 512.0f;  // units of 2^-9
    return sign | std::uint8_t(std::nearbyint(scaled));            // round to nearest even
  }
  const std::uint32_t rounded = abs_bits + 0x7ffffu + ((abs_bits >> 20) & 1u);
  return sign | std::uint8_t((rounded - (120u << 23)) >> 20);
}

std::uint16_t float_to_f16(float f) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = std::uint16_t((bits >> 16) & 0x8000u);
  const std::uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7e00u;        // NaN
  if (abs_bits >= 0x477ff000u) return sign | 0x7c00u;       // rounds to >= 65520: Inf
  if (abs_bits < 0x38800000u) {                             // below the smallest normal 2^-14
    const float scaled = std::bit_cast<float>(abs_bits) * 16777216.0f;  // units of 2^-24
    return sign | std::uint16_t(std::nearbyint(scaled));    // round to nearest even
  }
  std::uint32_t rounded = abs_bits + 0xfffu + ((abs_bits >> 13) & 1u);
  return sign | std::uint16_t((rounded - (112u << 23)) >> 13);
}

}  // namespace stsa
