// Strided views of attention tensors and a small owning tensor for tools and tests.
//
// Every attention tensor is addressed logically as [B, N, H, D] (batch, token,
// head, channel); the memory layout is only a choice of strides, so both
// [B, N, H, D] and [B, H, N, D] storage are views of the same kind.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "stsa/dtype.hpp"

namespace stsa {

enum class MemoryLayout : std::uint8_t { BNHD, BHND };

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  std::array<std::int64_t, 4> shape{0, 0, 0, 0};   // B, N, H, D
  std::array<std::int64_t, 4> stride{0, 0, 0, 0};  // in elements, for B, N, H, D

  static TensorView contiguous(void* data, DType dtype, std::int64_t batch, std::int64_t tokens,
                               std::int64_t heads, std::int64_t head_dim, MemoryLayout layout);

  std::int64_t batch() const { return shape[0]; }
  std::int64_t tokens() const { return shape[1]; }
  std::int64_t heads() const { return shape[2]; }
  std::int64_t head_dim() const { return shape[3]; }
  std::int64_t numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  std::int64_t offset(std::int64_t b, std::int64_t n, std::int64_t h, std::int64_t d) const {
    return b * stride[0] + n * stride[1] + h * stride[2] + d * stride[3];
  }
  float load(std::int64_t b, std::int64_t n, std::int64_t h, std::int64_t d) const {
    return load_as_float(data, dtype, offset(b, n, h, d));
  }
  void store(std::int64_t b, std::int64_t n, std::int64_t h, std::int64_t d, float x) const {
    store_from_float(data, dtype, offset(b, n, h, d), x);
  }
  // [first, last) byte range that the view may touch (for aliasing checks).
  std::pair<const std::byte*, const std::byte*> byte_extent() const;
};

// Log-sum-exp per row, logically [B, H, N], fp32. data == nullptr means "not wanted".
struct LseView {
  float* data = nullptr;
  std::array<std::int64_t, 3> shape{0, 0, 0};   // B, H, N
  std::array<std::int64_t, 3> stride{0, 0, 0};  // in elements

  static LseView contiguous(float* data, std::int64_t batch, std::int64_t heads, std::int64_t tokens);
  std::int64_t offset(std::int64_t b, std::int64_t h, std::int64_t n) const {
    return b * stride[0] + h * stride[1] + n * stride[2];
  }
  float& at(std::int64_t b, std::int64_t h, std::int64_t n) const { return data[offset(b, h, n)]; }
  std::pair<const std::byte*, const std::byte*> byte_extent() const;
};

// Whether two byte_extent() ranges share a byte (the aliasing checks of every entry point).
inline bool extents_overlap(std::pair<const std::byte*, const std::byte*> a,
                            std::pair<const std::byte*, const std::byte*> b) {
  return a.first < b.second && b.first < a.second;
}

// Throws ResourceError if `bytes` exceeds this machine's physical memory (checked before allocating).
void check_host_allocation(std::uint64_t bytes, const char* what);

// Owning contiguous tensor; its view() is what the library takes.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, std::int64_t batch, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
         MemoryLayout layout = MemoryLayout::BNHD);
  // Takes `bytes` (the tensor's contents in `layout`'s C order, e.g. a file's data)
  // without copying; throws InvalidArgument when their size is not the shape's.
  Tensor(std::vector<std::byte> bytes, DType dtype, std::int64_t batch, std::int64_t tokens, std::int64_t heads,
         std::int64_t head_dim, MemoryLayout layout = MemoryLayout::BNHD);
  // The view is made on each call from the bytes the tensor holds now, so a
  // copy sees its own bytes and a moved-from tensor a null view.
  TensorView view() const {
    TensorView v = shape_;
    v.data = storage_.empty() ? nullptr : const_cast<std::byte*>(storage_.data());
    return v;
  }
  DType dtype() const { return shape_.dtype; }
  std::size_t bytes() const { return storage_.size(); }

 private:
  std::vector<std::byte> storage_;
  TensorView shape_;  // dtype, shape and strides; data comes from storage_
};

// Owning [B, H, N] fp32 buffer for LSE (copies and moves as Tensor's).
class LseBuffer {
 public:
  LseBuffer() = default;
  LseBuffer(std::int64_t batch, std::int64_t heads, std::int64_t tokens);
  LseView view() {
    LseView v = shape_;
    v.data = storage_.empty() ? nullptr : storage_.data();
    return v;
  }

 private:
  std::vector<float> storage_;
  LseView shape_;  // shape and strides; data comes from storage_
};

}  // namespace stsa
