// Checks shared by every entry point that takes device tensors (the backend,
// the GPU router, the GPU permutation), so one rule gives one message.
#pragma once

#include <cstddef>
#include <string_view>
#include <utility>

#include "stsa/tensor.hpp"

namespace stsa::cuda_detail {

// Throws Unsupported unless the first and the last byte of `extent` are device
// (or managed) memory of `device`. `who` prefixes the message ("" or
// "cuda router: "), `hint` ends it.
//
// Only the two ends are looked at: cuMemGetAddressRange would also catch a
// tensor that spans two adjacent allocations, but for memory mapped through the
// virtual memory API (PyTorch's expandable segments) it answers per physical
// chunk, and would reject valid tensors that cross a chunk boundary.
// An empty extent (a zero-sized view: nothing is accessed) passes.
void require_device_memory(std::string_view who, std::string_view name,
                           std::pair<const std::byte*, const std::byte*> extent, int device, std::string_view hint);

// Throws Unsupported unless every (batch, token, head) row of `t` can move as
// 16-byte vectors: the head dim contiguous, the data pointer and the B, N and H
// strides in bytes multiples of 16 (a dimension of extent 1 is never stepped over).
void require_row_vectors(std::string_view who, std::string_view name, const TensorView& t);

// Throws Unsupported when k holds fewer heads than q's `heads` and grouping them is
// well formed (a count dividing `heads`): the kernels and the GPU router read K/V
// head h for query head h. Other counts are left to the shape checks that follow.
void refuse_grouped_kv(std::string_view who, const TensorView& k, std::int64_t heads);

}  // namespace stsa::cuda_detail
