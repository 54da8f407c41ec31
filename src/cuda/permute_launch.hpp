// Token permutation on the GPU (plain C++ interface to permute_kernels.cu).
// One launch moves one tensor: destination row (b, position p in the `to`
// order, dst head) <- source row (b, position of the same token in the `from`
// order, src head). Gather and scatter differ only in which side is packed.
#pragma once

#include <cstdint>

namespace stsa::cuda_detail {

constexpr int kMaxPermuteHeads = 64;

// The token grid, enough to map positions between the two orders on the device.
struct PermuteGrid {
  std::int64_t frames = 1;
  std::int64_t per_frame = 1;
  std::int64_t text_tokens = 0;
  bool text_before = false;
  bool from_spatial_major = false;  // order of the source rows
  bool to_spatial_major = false;    // order of the destination rows
};

struct PermuteParams {
  const void* src = nullptr;
  void* dst = nullptr;
  std::int64_t src_stride[4] = {}, dst_stride[4] = {};  // elements: batch, token, head, dim
  std::int64_t batch = 0, tokens = 0, head_dim = 0;
  int head_count = 0;
  int src_heads[kMaxPermuteHeads] = {};
  int dst_heads[kMaxPermuteHeads] = {};
  int element_bytes = 2;
  PermuteGrid grid;
};

// 16-byte vectors when both sides have a contiguous head dim and 16-byte aligned
// rows, element copies otherwise (the caller checked shapes and memory).
void launch_permute_rows(const PermuteParams& params, void* stream);

struct PermuteLseParams {
  const float* src = nullptr;
  float* dst = nullptr;
  std::int64_t src_stride[3] = {}, dst_stride[3] = {};  // batch, head, token
  std::int64_t batch = 0, tokens = 0;
  int head_count = 0;
  int src_heads[kMaxPermuteHeads] = {};
  int dst_heads[kMaxPermuteHeads] = {};
  PermuteGrid grid;
};

void launch_permute_lse(const PermuteLseParams& params, void* stream);

}  // namespace stsa::cuda_detail
