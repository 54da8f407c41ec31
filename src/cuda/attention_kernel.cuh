// The tile-sparse flash-attention forward kernel (sm_80+: mma.sync, cp.async).
//
// One block computes one 128-row query tile of one (batch, head): it walks the
// plan's key tiles of that query tile, full ones first (no mask work), then
// partial ones (their bitmask applied); empty tiles are never listed, so their
// K/V are never loaded. Each 128-key tile is consumed as two 64-key chunks (one
// 64-bit mask word per row each) through a 3-stage cp.async pipeline in shared
// memory. Eight warps own 16 query rows each and keep Q, the scores and the
// output accumulator in registers; softmax is the online (flash) form in exp2
// units, fp32 throughout, with P rounded to the input type for the PV product.
//
// Ragged edges: K/V rows past the sequence are zero-filled in shared memory and
// their scores masked, Q rows past it are computed but never stored. A row whose
// every key is masked ends with sum 0 and gets O = 0, LSE = -inf.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "cuda/attention_params.hpp"
#include "cuda/output_store.cuh"
#include "cuda/ptx.cuh"
#include "cuda/work_items.hpp"

namespace stsa::cuda_detail {

template <class Element, int kHeadDimT>
struct AttentionTraits {
  using T = Element;
  static constexpr int kHeadDim = kHeadDimT;
  static constexpr int kBlockM = 128;  // query rows per block: one plan tile
  static constexpr int kTileN = 128;   // keys per plan tile
  static constexpr int kBlockN = 64;   // keys per pipeline chunk: one 64-bit mask word per row
  static constexpr int kChunksPerTile = kTileN / kBlockN;
  static constexpr int kMaskWordsPerRow = kTileN / 64;
  static constexpr int kWarps = 8;  // 16 query rows each
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStages = 3;
  // Shared-memory row pitch in elements: 16 extra bytes move consecutive rows to
  // different banks, so the 8 row addresses of an ldmatrix never conflict.
  static constexpr int kPitch = kHeadDim + 8;
  static constexpr int kVectorsPerRow = kHeadDim / 8;  // 16-byte vectors
  static constexpr int kSmemBytes = (kBlockM + 2 * kStages * kBlockN) * kPitch * int(sizeof(Element));

  static_assert(kBlockM == kWarps * 16, "each warp owns 16 query rows");
  static_assert(kHeadDim % 16 == 0, "head dim is consumed in 16-wide MMA steps");
  static_assert((kBlockM * kVectorsPerRow) % kThreads == 0 && (kBlockN * kVectorsPerRow) % kThreads == 0,
                "tile loads split evenly over the threads");
};

// Starts the asynchronous copy of `kRows` rows (tokens first_row...) of one head
// into shared memory; rows at or past `tokens` are zero-filled, never read.
template <class Traits, int kRows>
__device__ __forceinline__ void load_rows_async(typename Traits::T* shared, const typename Traits::T* head_base,
                                                std::int64_t token_stride, int first_row, int tokens) {
  constexpr int kVectors = Traits::kVectorsPerRow;
#pragma unroll
  for (int i = 0; i < kRows * kVectors / Traits::kThreads; ++i) {
    const int index = int(threadIdx.x) + i * Traits::kThreads;
    const int row = index / kVectors;
    const int column = (index % kVectors) * 8;
    const int token = first_row + row;
    const bool valid = token < tokens;
    const typename Traits::T* source = head_base + (valid ? std::int64_t(token) * token_stride + column : 0);
    cp_async_16(shared + row * Traits::kPitch + column, source, valid);
  }
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1) tile_sparse_attention_kernel(const AttentionParams p) {
  using T = typename Traits::T;
  constexpr int kD = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kPitch = Traits::kPitch;
  constexpr int kStages = Traits::kStages;
  constexpr int kChunksPerTile = Traits::kChunksPerTile;
  constexpr float kNegInf = -INFINITY;

  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* const q_smem = reinterpret_cast<T*>(shared_bytes);  // (kBlockM, kPitch)
  T* const k_smem = q_smem + kBlockM * kPitch;           // kStages x (kBlockN, kPitch)
  T* const v_smem = k_smem + kStages * kBlockN * kPitch;  // kStages x (kBlockN, kPitch)

  const int warp = int(threadIdx.x) / 32;
  const int lane = int(threadIdx.x) % 32;
  const int group = lane / 4;   // g: fragment row
  const int quad_lane = lane % 4;  // t: fragment column pair

  // One block per work item, in the launch's work order (work_items.hpp).
  const WorkSlot slot = work_slot(int(blockIdx.x), p.q_tiles, p.batch, p.head_count, p.work_order, p.heavy_ranks);
  const int batch = slot.batch;
  const int head = p.heads[slot.head_slot];
  const int q_tile = p.q_tile_order[slot.rank];
  const int q0 = q_tile * kBlockM;
  const int entry_begin = p.row_begin[q_tile];
  const int partial_begin = p.partial_begin[q_tile];
  const int chunks = (p.row_begin[q_tile + 1] - entry_begin) * kChunksPerTile;

  const T* const q_head = static_cast<const T*>(p.q) + batch * p.q_stride[0] + head * p.q_stride[2];
  const T* const k_head = static_cast<const T*>(p.k) + batch * p.k_stride[0] + head * p.k_stride[2];
  const T* const v_head = static_cast<const T*>(p.v) + batch * p.v_stride[0] + head * p.v_stride[2];

  // First key of chunk c: chunk c is half c % 2 of the (c / 2)-th listed key tile.
  auto chunk_first_key = [&](int c) {
    return p.key_tiles[entry_begin + c / kChunksPerTile] * Traits::kTileN + (c % kChunksPerTile) * kBlockN;
  };
  auto load_chunk = [&](int c, int stage) {
    const int first_key = chunk_first_key(c);
    load_rows_async<Traits, kBlockN>(k_smem + stage * kBlockN * kPitch, k_head, p.k_stride[1], first_key, p.tokens);
    load_rows_async<Traits, kBlockN>(v_smem + stage * kBlockN * kPitch, v_head, p.v_stride[1], first_key, p.tokens);
  };

  // Prologue: Q and the first kStages - 1 chunks; one commit group per chunk
  // (empty groups past the end keep the group count uniform).
  load_rows_async<Traits, kBlockM>(q_smem, q_head, p.q_stride[1], q0, p.tokens);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < chunks) load_chunk(s, s);
    cp_async_commit();
  }
  cp_async_wait<kStages - 2>();
  __syncthreads();

  // This warp's 16 query rows as MMA A fragments, one per 16-wide step of D.
  std::uint32_t q_frag[kD / 16][4];
  {
    const int row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
    const int column = (lane >> 4) * 8;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) ldmatrix_x4(q_frag[kk], q_smem + row * kPitch + kk * 16 + column);
  }

  float o_acc[kD / 8][4];  // (16 rows, kD) as kD/8 MMA accumulator tiles
#pragma unroll
  for (int n = 0; n < kD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o_acc[n][e] = 0.f;
  // Per thread: rows g and g + 8 of the warp's 16 rows.
  float row_max[2] = {kNegInf, kNegInf};  // running max of raw scores
  float row_sum[2] = {0.f, 0.f};          // this thread's share of sum exp2(score * scale_log2 - max)
  const int tile_row[2] = {warp * 16 + group, warp * 16 + group + 8};

  for (int c = 0; c < chunks; ++c) {
    cp_async_wait<kStages - 2>();  // chunk c has landed (this thread's copies) ...
    __syncthreads();               // ... and everyone's; everyone is also done with chunk c - 1
    if (c + kStages - 1 < chunks) load_chunk(c + kStages - 1, (c + kStages - 1) % kStages);
    cp_async_commit();

    const T* const k_chunk = k_smem + (c % kStages) * kBlockN * kPitch;
    const T* const v_chunk = v_smem + (c % kStages) * kBlockN * kPitch;

    // S = Q K^T for this warp's 16 rows and the chunk's 64 keys: (16, 64) as 8 tiles of 16x8.
    float s[kBlockN / 8][4];
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < kBlockN / 16; ++np) {
        // Matrices: (keys +0..7, d lo), (keys +0..7, d hi), (keys +8..15, d lo), (keys +8..15, d hi).
        std::uint32_t kb[4];
        const int key = np * 16 + (lane >> 4) * 8 + (lane & 7);
        const int column = kk * 16 + ((lane >> 3) & 1) * 8;
        ldmatrix_x4(kb, k_chunk + key * kPitch + column);
        mma_16x8x16<T>(s[2 * np], q_frag[kk], kb[0], kb[1]);
        mma_16x8x16<T>(s[2 * np + 1], q_frag[kk], kb[2], kb[3]);
      }
    }

    // Mask: partial tiles by their bitmask, the ragged last tile by bounds.
    const int entry = entry_begin + c / kChunksPerTile;
    const int first_key = chunk_first_key(c);
    if (entry >= partial_begin) {
      const std::uint64_t* mask = p.masks + std::int64_t(p.mask_ids[entry]) * kBlockM * Traits::kMaskWordsPerRow +
                                  c % kChunksPerTile;
      const std::uint64_t words[2] = {mask[tile_row[0] * Traits::kMaskWordsPerRow],
                                      mask[tile_row[1] * Traits::kMaskWordsPerRow]};
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int bit = n * 8 + quad_lane * 2 + e;
          if (!((words[0] >> bit) & 1u)) s[n][e] = kNegInf;
          if (!((words[1] >> bit) & 1u)) s[n][2 + e] = kNegInf;
        }
    }
    if (first_key + kBlockN > p.tokens) {
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (first_key + n * 8 + quad_lane * 2 + e >= p.tokens) {
            s[n][e] = kNegInf;
            s[n][2 + e] = kNegInf;
          }
    }

    // Online softmax. The four lanes of a quad share each row: reduce over them.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float chunk_max = row_max[r];
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) chunk_max = fmaxf(chunk_max, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, 1));
      chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, 2));
      // A row with nothing allowed so far keeps max -inf; subtract 0 then, so
      // exp2(-inf - 0) = 0 instead of exp2(-inf + inf) = NaN.
      float offset = (chunk_max == kNegInf ? 0.f : chunk_max) * p.scale_log2;
      float previous = row_max[r] * p.scale_log2;  // -inf while row_max is: rescale 0
      if (fabsf(offset) == INFINITY) {  // |s| x scale_log2 past FLT_MAX: see softmax_update (sm90)
#pragma unroll
        for (int n = 0; n < kBlockN / 8; ++n) {
          s[n][2 * r] -= chunk_max;
          s[n][2 * r + 1] -= chunk_max;
        }
        previous = (row_max[r] - chunk_max) * p.scale_log2;
        offset = 0.f;
      }
      const float rescale = fast_exp2(previous - offset);
      row_max[r] = chunk_max;
      row_sum[r] *= rescale;
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        o_acc[n][2 * r] *= rescale;
        o_acc[n][2 * r + 1] *= rescale;
      }
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) {
        s[n][2 * r] = fast_exp2(fmaf(s[n][2 * r], p.scale_log2, -offset));
        s[n][2 * r + 1] = fast_exp2(fmaf(s[n][2 * r + 1], p.scale_log2, -offset));
        row_sum[r] += s[n][2 * r] + s[n][2 * r + 1];
      }
    }

    // O += P V. The accumulator layout of S tiles 2j and 2j+1 is exactly the A
    // fragment of keys 16j..16j+15, so P goes from registers straight into the MMA.
#pragma unroll
    for (int j = 0; j < kBlockN / 16; ++j) {
      const std::uint32_t p_frag[4] = {
          pack_pair<T>(s[2 * j][0], s[2 * j][1]), pack_pair<T>(s[2 * j][2], s[2 * j][3]),
          pack_pair<T>(s[2 * j + 1][0], s[2 * j + 1][1]), pack_pair<T>(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kD / 16; ++dp) {
        // Transposed matrices: (keys +0..7, d lo), (keys +8..15, d lo), (keys +0..7, d hi), (keys +8..15, d hi).
        std::uint32_t vb[4];
        const int key = j * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
        const int column = dp * 16 + (lane >> 4) * 8;
        ldmatrix_x4_trans(vb, v_chunk + key * kPitch + column);
        mma_16x8x16<T>(o_acc[2 * dp], p_frag, vb[0], vb[1]);
        mma_16x8x16<T>(o_acc[2 * dp + 1], p_frag, vb[2], vb[3]);
      }
    }
  }
  cp_async_wait<0>();  // only empty groups can remain; leave nothing in flight

  // Epilogue: O = acc / sum, LSE = ln(sum) + max * scale; empty rows O = 0, LSE = -inf.
  // Both rows' quad sums first: the shuffles run with the whole warp, before
  // any lane leaves for a row past the sequence.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = row_sum[r];
    const int token = q0 + tile_row[r];
    if (token >= p.tokens) continue;
    const bool empty = sum == 0.f;  // NaN sums are not empty: they propagate
    const float inverse = empty ? 0.f : 1.f / sum;
    const OutputRow out = output_row(p, batch, slot.head_slot, token);
#pragma unroll
    for (int n = 0; n < kD / 8; ++n)
      store_output_pair(p, out.o + n * 8 + quad_lane * 2, o_acc[n][2 * r] * inverse, o_acc[n][2 * r + 1] * inverse);
    if (p.lse != nullptr && quad_lane == 0) p.lse[out.lse] = empty ? kNegInf : logf(sum) + row_max[r] * p.scale;
  }
}

}  // namespace stsa::cuda_detail
