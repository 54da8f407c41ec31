// The plain parameter block of one attention launch (no CUDA types): device
// pointers and element strides of the tensors, the heads it covers and the plan.
#pragma once

#include <cstdint>

#include "cuda/output_order.hpp"

namespace stsa::cuda_detail {

// Heads are passed by value in the parameter block; more heads take more launches.
constexpr int kMaxHeadsPerLaunch = 64;

enum OutType : int { kOutF32 = 0, kOutBF16 = 1, kOutF16 = 2 };

struct AttentionParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // nullptr: not wanted
  // Element strides of batch, token and head (the head dim has stride 1).
  std::int64_t q_stride[3] = {}, k_stride[3] = {}, v_stride[3] = {}, o_stride[3] = {};
  std::int64_t lse_stride[3] = {};  // batch, head, token
  int tokens = 0;
  int batch = 0;
  int total_heads = 0;  // H of the tensors (heads[] may name a subset)
  int head_dim = 0;
  int head_count = 0;  // entries used in heads[]
  int heads[kMaxHeadsPerLaunch] = {};
  // Where the rows of heads[j] are stored: head o_heads[j] of o and lse (heads[j]
  // itself unless the output is scattered), at output_token() of their position.
  int o_heads[kMaxHeadsPerLaunch] = {};
  OutputOrder o_order;
  int out_type = kOutF32;
  float scale = 0.f;       // softmax scale (natural units)
  float scale_log2 = 0.f;  // scale * log2(e): scores go through exp2
  // The plan (DevicePlan::Arrays).
  const std::int32_t* row_begin = nullptr;
  const std::int32_t* partial_begin = nullptr;
  const std::int32_t* key_tiles = nullptr;
  const std::int32_t* mask_ids = nullptr;
  const std::uint64_t* masks = nullptr;
  const std::int32_t* q_tile_order = nullptr;
  int q_tiles = 0;
  int work_order = 0;   // WorkOrder (work_items.hpp)
  int heavy_ranks = 0;  // the heavy-first order's heavy ranks (a prefix of the ranks)
  // The persistent sm90 kernel's block schedule (block_schedule.hpp): block b walks
  // items block_items[block_item_begin[b] .. block_item_begin[b + 1]). Unused by sm80.
  const std::int32_t* block_item_begin = nullptr;
  const std::int32_t* block_items = nullptr;
  int snake = 0;  // without lists: the snake walk instead of round-robin (block_walk.hpp)
};

}  // namespace stsa::cuda_detail
