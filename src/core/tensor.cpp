#include "stsa/tensor.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <unistd.h>

#include "stsa/error.hpp"

namespace stsa {
namespace {

void check_dims(std::int64_t batch, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim) {
  STSA_CHECK(batch > 0 && tokens > 0 && heads > 0 && head_dim > 0, InvalidArgument,
             "tensor sizes must be positive, got B=", batch, " N=", tokens, " H=", heads, " D=", head_dim);
  std::int64_t total = 0;
  const bool overflow = __builtin_mul_overflow(batch, tokens, &total) || __builtin_mul_overflow(total, heads, &total) ||
                        __builtin_mul_overflow(total, head_dim, &total) ||
                        __builtin_mul_overflow(total, std::int64_t(4), &total);
  STSA_CHECK(!overflow, ResourceError, "tensor of B=", batch, " N=", tokens, " H=", heads, " D=", head_dim,
             " overflows 64-bit byte counts");
}

// Byte range touched by elements at offsets sum(i_k * stride_k), 0 <= i_k < shape_k.
// Strides come from the caller, so every product and sum is overflow-checked and
// the range must not wrap the address space: an absurd stride is an error, not UB.
template <std::size_t R>
std::pair<const std::byte*, const std::byte*> extent(const void* data, std::size_t elem,
                                                     const std::array<std::int64_t, R>& shape,
                                                     const std::array<std::int64_t, R>& stride) {
  if (data == nullptr) return {nullptr, nullptr};
  std::int64_t lo = 0, hi = 0;
  bool overflow = false;
  for (std::size_t i = 0; i < R; ++i) {
    if (shape[i] <= 0) return {nullptr, nullptr};
    std::int64_t reach = 0;
    overflow |= __builtin_mul_overflow(shape[i] - 1, stride[i], &reach);
    overflow |= __builtin_add_overflow(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi);
  }
  const auto element = std::int64_t(elem);
  std::int64_t lo_bytes = 0, hi_bytes = 0;
  overflow |= __builtin_add_overflow(hi, std::int64_t(1), &hi_bytes);
  overflow |= __builtin_mul_overflow(hi_bytes, element, &hi_bytes);
  overflow |= __builtin_mul_overflow(lo, element, &lo_bytes);
  const auto base = reinterpret_cast<std::uintptr_t>(data);
  std::uintptr_t first = 0, last = 0;
  overflow |= __builtin_add_overflow(base, lo_bytes, &first);
  overflow |= __builtin_add_overflow(base, hi_bytes, &last);
  if (overflow) {
    std::string dims;
    for (std::size_t i = 0; i < R; ++i) dims += detail::concat(i ? ", " : "", shape[i], " (stride ", stride[i], ")");
    throw InvalidArgument(detail::concat("a tensor of shape [", dims, "] spans more bytes than the address space holds"));
  }
  const auto* byte = static_cast<const std::byte*>(data);
  return {byte + lo_bytes, byte + hi_bytes};
}

}  // namespace

void check_host_allocation(std::uint64_t bytes, const char* what) {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return;
  const std::uint64_t physical = std::uint64_t(pages) * std::uint64_t(page_size);
  STSA_CHECK(bytes <= physical, ResourceError, what, " needs ", bytes / (1u << 20), " MiB, more than this machine's ",
             physical / (1u << 20), " MiB of memory");
}

TensorView TensorView::contiguous(void* data, DType dtype, std::int64_t batch, std::int64_t tokens,
                                  std::int64_t heads, std::int64_t head_dim, MemoryLayout layout) {
  check_dims(batch, tokens, heads, head_dim);
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.shape = {batch, tokens, heads, head_dim};
  if (layout == MemoryLayout::BNHD)
    v.stride = {tokens * heads * head_dim, heads * head_dim, head_dim, 1};
  else
    v.stride = {heads * tokens * head_dim, head_dim, tokens * head_dim, 1};
  return v;
}

std::pair<const std::byte*, const std::byte*> TensorView::byte_extent() const {
  return extent<4>(data, element_size(dtype), shape, stride);
}

LseView LseView::contiguous(float* data, std::int64_t batch, std::int64_t heads, std::int64_t tokens) {
  check_dims(batch, tokens, heads, 1);
  LseView v;
  v.data = data;
  v.shape = {batch, heads, tokens};
  v.stride = {heads * tokens, tokens, 1};
  return v;
}

std::pair<const std::byte*, const std::byte*> LseView::byte_extent() const {
  return extent<3>(data, sizeof(float), shape, stride);
}

Tensor::Tensor(DType dtype, std::int64_t batch, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
               MemoryLayout layout) {
  check_dims(batch, tokens, heads, head_dim);
  check_host_allocation(std::uint64_t(batch * tokens * heads * head_dim) * element_size(dtype), "tensor");
  storage_.resize(std::size_t(batch * tokens * heads * head_dim) * element_size(dtype));
  shape_ = TensorView::contiguous(nullptr, dtype, batch, tokens, heads, head_dim, layout);
}

Tensor::Tensor(std::vector<std::byte> bytes, DType dtype, std::int64_t batch, std::int64_t tokens,
               std::int64_t heads, std::int64_t head_dim, MemoryLayout layout) {
  check_dims(batch, tokens, heads, head_dim);
  const std::uint64_t expected = std::uint64_t(batch * tokens * heads * head_dim) * element_size(dtype);
  STSA_CHECK(bytes.size() == expected, InvalidArgument, "tensor of ", batch, " x ", tokens, " x ", heads, " x ",
             head_dim, " ", to_string(dtype), " needs ", expected, " bytes, got ", bytes.size());
  storage_ = std::move(bytes);
  shape_ = TensorView::contiguous(nullptr, dtype, batch, tokens, heads, head_dim, layout);
}

LseBuffer::LseBuffer(std::int64_t batch, std::int64_t heads, std::int64_t tokens) {
  check_dims(batch, tokens, heads, 1);
  check_host_allocation(std::uint64_t(batch * heads * tokens) * sizeof(float), "LSE buffer");
  storage_.assign(std::size_t(batch * heads * tokens), 0.f);
  shape_ = LseView::contiguous(nullptr, batch, heads, tokens);
}

}  // namespace stsa
