// Copies of one (batch, token, head) row of D channels between a strided view
// and packed bytes, as raw element bits (the exchange never converts dtypes).
#pragma once

#include <cstddef>
#include <cstring>

#include "stsa/tensor.hpp"

namespace stsa::dist::detail {

inline std::size_t row_bytes(const TensorView& t) { return std::size_t(t.head_dim()) * element_size(t.dtype); }

inline void read_row(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, std::byte* out) {
  const std::int64_t elem = std::int64_t(element_size(t.dtype));
  const auto* in = static_cast<const std::byte*>(t.data) + t.offset(b, n, h, 0) * elem;
  if (t.stride[3] == 1) {
    std::memcpy(out, in, row_bytes(t));
    return;
  }
  for (std::int64_t c = 0; c < t.head_dim(); ++c) std::memcpy(out + c * elem, in + c * t.stride[3] * elem, std::size_t(elem));
}

inline void write_row(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, const std::byte* in) {
  const std::int64_t elem = std::int64_t(element_size(t.dtype));
  auto* out = static_cast<std::byte*>(t.data) + t.offset(b, n, h, 0) * elem;
  if (t.stride[3] == 1) {
    std::memcpy(out, in, row_bytes(t));
    return;
  }
  for (std::int64_t c = 0; c < t.head_dim(); ++c) std::memcpy(out + c * t.stride[3] * elem, in + c * elem, std::size_t(elem));
}

}  // namespace stsa::dist::detail
