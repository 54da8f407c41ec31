// Routing on the GPU (plain C++17 interface to routing_kernels.cu).
//
// Three launches per call, all on one stream:
//   1. partials: grid (key split x row block, routed head, part of the row
//      block). A block takes up to kRoutingRows sampled rows (or half of them)
//      of one batch entry and one head and walks its key split in tiles of
//      kRoutingKeys keys. One warp per (output, 16 rows) (output 0: dense,
//      output 1 + c: candidate c) keeps that output's online-softmax state,
//      each with its own running maximum, so a mask whose keys score far below
//      the dense maximum loses no precision. Scores and P.V run on tensor
//      cores (mma.sync m16n8k16, fp32 accumulation) in registers; the mask
//      predicate is evaluated per key from mask_predicate.hpp.
//   2. combine: per (head, sampled row) the splits are merged and the squared
//      output errors of each candidate against dense are formed (fp64 sums).
//   3. reduce: per head, the rows' sums in a fixed order (deterministic).
#pragma once

#include <cstdint>

#include "cuda/mask_predicate.hpp"

namespace stsa::cuda_detail {

constexpr int kRoutingRows = 64;  // sampled rows per block: a head's 64 default samples read its K/V once
constexpr int kRoutingKeys = 64;  // keys per tile
constexpr int kMaxRoutingCandidates = 3;
constexpr int kRoutingOutputs = 1 + kMaxRoutingCandidates;  // partial slots per row: dense + candidates
constexpr int kRoutingRowGroups = kRoutingRows / 16;        // m16 row groups of a row block
constexpr int kRoutingStats = 2 + kMaxRoutingCandidates;    // per row and head: |O_dense|^2, errors, kept pairs

struct RoutingParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  std::int64_t q_stride[3] = {}, k_stride[3] = {}, v_stride[3] = {};  // elements: batch, token, head
  std::int32_t tokens = 0;
  std::int32_t head_dim = 0;
  bool bf16 = true;         // else fp16
  float scale_log2 = 0;     // softmax scale times log2(e): scores live in the log2 domain

  PredicateGrid grid;
  std::int32_t candidates = 0;
  PredicateMask masks[kMaxRoutingCandidates];

  // Row blocks: each holds up to kRoutingRows sampled rows of one batch entry.
  const std::int32_t* row_positions = nullptr;  // [row_blocks][kRoutingRows] token positions, -1: padding
  const std::int32_t* row_batch = nullptr;      // [row_blocks]
  std::int32_t row_blocks = 0;
  const std::int32_t* heads = nullptr;          // [head_count] head indices into q, k, v
  std::int32_t head_count = 0;
  std::int32_t splits = 1;           // key splits per (head, row block)
  std::int32_t tiles_per_split = 1;  // key tiles of each split (the last split may hold fewer)

  // Workspace. Partials are indexed by slot = ((head * row_blocks + row block) * splits + split) * kRoutingOutputs
  // + output, then row (and channel for acc).
  // [slots][kRoutingRows]: running maximum (log2 domain). NaN in the dense output's slot (output 0) flags a
  // non-finite score in the row; candidate slots never carry it (combine reads the flag across outputs).
  float* part_max = nullptr;
  float* part_sum = nullptr;         // [slots][kRoutingRows]: sum of P relative to that maximum
  float* part_acc = nullptr;         // [slots][kRoutingRows][head_dim]: P.V relative to that maximum
  std::int32_t* part_kept = nullptr; // [slots][kRoutingRows]: allowed (row, key) pairs
  double* row_stats = nullptr;       // [head_count][row_blocks * kRoutingRows][kRoutingStats]
  double* head_stats = nullptr;      // [head_count][kRoutingStats]: |O_dense|^2, error per candidate, kept pairs
};

// Head dims the kernels are built for: multiples of 16 up to 128.
bool routing_head_dim_supported(int head_dim);
// Dynamic shared memory of the partials block for `head_dim` and 2 or 3
// candidates (bytes; 0 for a shape that is not built).
int routing_shared_bytes(int head_dim, int candidates);

// Enqueues the three launches on `stream` (a cudaStream_t). The caller checked
// every shape, pointer and alignment.
void launch_routing(const RoutingParams& params, void* stream);

}  // namespace stsa::cuda_detail
