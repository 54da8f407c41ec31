// The tile-sparse flash-attention forward kernel for Hopper (sm_90a).
//
// Work item: one 128-row query tile of one (batch, head), i.e. one row of the
// plan. Items are walked heaviest query tile first (q_tile_order) in a work
// order (work_items.hpp) and handed out statically: the grid has at most one
// block per SM, and each block walks its items by arithmetic (round-robin or
// snake, block_walk.hpp) or from a list the host computed for it
// (block_schedule.hpp: balanced by kept key tiles), so no atomics and no
// hand-off of items from the producer to the consumers.
//
// A block is three warpgroups with fixed roles (warp specialization):
//   producer (warpgroup 0, one thread): TMA loads of Q and of every kept key
//     tile's K and V into a ring of shared-memory stages, gated by mbarriers;
//     it runs ahead into the next item while the consumers finish this one;
//   consumers (warpgroups 1, 2): 64 query rows each; S = Q K^T with wgmma from
//     shared memory, mask (partial tiles: bitmask; last tile: bounds), online
//     softmax in registers (exp2 units, fp32), O += P V with P from registers.
// Full tiles skip all mask work; empty tiles are never listed, hence never loaded.
// The order of the waits, arrivals, loads and shared-memory reads of all three
// schedules is model-checked on the host, every interleaving of small cases
// (tests/sm90_protocol_test.cpp): change the two together.
//
// Shared memory holds every tile as 64-column (128-byte) blocks with the 128-byte
// swizzle that TMA writes and wgmma reads: [column block][row][64 elements].
//
// Ragged edges: TMA zero-fills rows past the sequence; scores of keys past it are
// masked; query rows past it are computed and never stored. A row with no allowed
// key ends with sum 0 and gets O = 0, LSE = -inf (same contract as the sm80 kernel).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/attention_launch.hpp"
#include "cuda/attention_params.hpp"
#include "cuda/block_walk.hpp"
#include "cuda/output_store.cuh"
#include "cuda/ptx.cuh"
#include "cuda/ptx_sm90.cuh"
#include "cuda/sm90_tile_layout.hpp"
#include "cuda/wgmma_ops.cuh"
#include "cuda/work_items.hpp"

namespace stsa::cuda_detail {

// What one sm90 launch receives: the TMA descriptors of Q, K and V (built on the
// host for these exact tensors) and the common parameter block.
struct Sm90AttentionParams {  // 64-byte aligned through CUtensorMap
  CUtensorMap q_map;
  CUtensorMap k_map;
  CUtensorMap v_map;
  AttentionParams common;
  std::uint64_t* barrier_timeout_report;  // barrier_timeout.hpp; null: a timed-out wait just traps
};

template <class Element, int kHeadDimT, Sm90Schedule kScheduleT>
struct Sm90Traits {
  using T = Element;
  static constexpr int kHeadDim = kHeadDimT;
  static constexpr Sm90Schedule kSchedule = kScheduleT;
  static constexpr bool kOverlap = kSchedule != Sm90Schedule::Serial;  // S(t) with P V(t-1)
  static constexpr bool kPingPong = kSchedule == Sm90Schedule::PingPong;
  static constexpr int kBlockM = 128;  // query rows per item: one plan tile
  static constexpr int kBlockN = 128;  // keys per stage: one plan tile
  static constexpr int kConsumerGroups = 2;
  static constexpr int kRowsPerGroup = kBlockM / kConsumerGroups;  // 64: one wgmma M
  static constexpr int kConsumerWarps = kConsumerGroups * 4;
  static constexpr int kThreads = 128 * (1 + kConsumerGroups);
  // D = 128: 32 KB per K or V stage, so 2 stages (+ Q) = 160 KB; D = 64 takes 4 (sm90_tile_layout.hpp).
  static constexpr int kStages = sm90_layout::stages(kHeadDim);
  static constexpr int kColumnBlocks = kHeadDim / 64;  // 128-byte swizzle spans per row
  static constexpr int kBlockBytes = int(sm90_layout::column_block_bytes(128));  // 128 rows of Q, K or V
  static constexpr int kQBytes = int(sm90_layout::tile_bytes(kHeadDim));
  static constexpr int kTileBytes = int(sm90_layout::tile_bytes(kHeadDim));  // K or V of one stage
  static constexpr int kMaskWordsPerRow = kBlockN / 64;
  // q full/empty; k, v full/empty per stage; the consumer groups' turns (ping-pong)
  static constexpr int kBarriers = sm90_layout::barrier_count(kHeadDim);
  static constexpr int kSmemBytes = 1024 /* alignment slack */ + kQBytes + 2 * kStages * kTileBytes + 8 * kBarriers;
  // Registers: the producer warpgroup gives most of its share to the consumers.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;

  static_assert(sizeof(Element) == 2, "bf16 / fp16 only");
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims 64 and 128");
  static_assert(kBlockM == kBlockN && kBlockM * 128 == kBlockBytes, "Q and K/V column blocks share one shape");
  static_assert(kBlockM == 128 && kQBytes + 2 * kStages * kTileBytes == int(sm90_layout::barriers_offset(kHeadDim)),
                "the layout host code names barriers by (sm90_tile_layout.hpp)");
  static_assert(kProducerRegisters * 128 + kConsumerRegisters * 128 * kConsumerGroups <= 65536, "register file");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");
};

// wgmma dispatch on element type and N.
template <class T>
__device__ __forceinline__ void wgmma_scores(float (&s)[64], std::uint64_t desc_q, std::uint64_t desc_k,
                                             int accumulate) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    wgmma_m64n128k16_ss_bf16(s, desc_q, desc_k, accumulate);
  else
    wgmma_m64n128k16_ss_f16(s, desc_q, desc_k, accumulate);
}

template <class T, int kAccumulators>
__device__ __forceinline__ void wgmma_values(float (&o)[kAccumulators], const std::uint32_t (&p)[4],
                                             std::uint64_t desc_v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if constexpr (kAccumulators == 64)
      wgmma_m64n128k16_rs_tb_bf16(o, p, desc_v, 1);
    else
      wgmma_m64n64k16_rs_tb_bf16(o, p, desc_v, 1);
  } else {
    if constexpr (kAccumulators == 64)
      wgmma_m64n128k16_rs_tb_f16(o, p, desc_v, 1);
    else
      wgmma_m64n64k16_rs_tb_f16(o, p, desc_v, 1);
  }
}

// The items this block walks, in order: a list the host computed
// (block_schedule.hpp, the balanced schedule), or, without one, by arithmetic
// (block_walk.hpp): round-robin, block b takes items b, b + G, b + 2G, ... (G
// blocks), or snake. The arithmetic walks are the defaults: on an H200 the
// lists ran 9-12% slower even where they name the same items (third run,
// bench/NOTES.md).
struct BlockItems {
  const std::int32_t* items = nullptr;  // nullptr: walk
  BlockWalk walk;
  __device__ __forceinline__ int count() const { return walk.count; }
  __device__ __forceinline__ int at(int k) const { return items != nullptr ? items[k] : walk.at(k); }
};

__device__ __forceinline__ BlockItems block_items(const AttentionParams& p) {
  if (p.block_items == nullptr)
    return {nullptr, block_walk(p.q_tiles * p.batch * p.head_count, int(blockIdx.x), int(gridDim.x), p.snake != 0)};
  const int begin = p.block_item_begin[blockIdx.x];
  return {p.block_items + begin, BlockWalk{0, 0, 1, p.block_item_begin[blockIdx.x + 1] - begin}};
}

// Where one work item's data lives.
struct WorkItem {
  int q_tile, batch, head_slot, head, entry_begin, partial_begin, tiles;
};

__device__ __forceinline__ WorkItem decode_item(const AttentionParams& p, int item) {
  const WorkSlot slot = work_slot(item, p.q_tiles, p.batch, p.head_count, p.work_order, p.heavy_ranks);
  WorkItem w;
  w.q_tile = p.q_tile_order[slot.rank];
  w.batch = slot.batch;
  w.head_slot = slot.head_slot;
  w.head = p.heads[slot.head_slot];
  w.entry_begin = p.row_begin[w.q_tile];
  w.partial_begin = p.partial_begin[w.q_tile];
  w.tiles = p.row_begin[w.q_tile + 1] - w.entry_begin;
  return w;
}

// What a consumer thread keeps across tiles: where its rows and the stages are.
struct ConsumerContext {
  int lane = 0, quad_lane = 0;  // quad_lane: fragment column pair t
  int tile_row[2] = {};         // this thread's two rows of the 128-row tile (g, g + 8 of its warp)
  std::uint32_t q_address = 0, k_address = 0, v_address = 0;
  int q_first_row = 0;  // first of this warpgroup's 64 rows
  std::uint64_t *q_empty = nullptr, *k_full = nullptr, *k_empty = nullptr, *v_full = nullptr, *v_empty = nullptr;
};

// Online-softmax state of this thread's two rows (exp2 units; max of raw scores).
struct SoftmaxState {
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};  // this thread's share; the quad's lanes are summed at the end
};

// The mask of one kept tile, fetched while its scores are computed.
struct TileMask {
  int first_key = 0;
  bool partial = false;
  std::uint64_t words[2][2] = {{~0ull, ~0ull}, {~0ull, ~0ull}};  // [row][64-key half]
};

template <class Traits>
__device__ __forceinline__ TileMask fetch_tile_mask(const AttentionParams& p, const ConsumerContext& c,
                                                    const WorkItem& w, int t) {
  TileMask m;
  const int entry = w.entry_begin + t;
  m.first_key = p.key_tiles[entry] * Traits::kBlockN;
  m.partial = entry >= w.partial_begin;
  if (m.partial) {
    const std::uint64_t* mask = p.masks + std::int64_t(p.mask_ids[entry]) * Traits::kBlockM * Traits::kMaskWordsPerRow;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) m.words[r][h] = mask[c.tile_row[r] * Traits::kMaskWordsPerRow + h];
  }
  return m;
}

// S = Q K^T for this warpgroup's 64 rows x 128 keys: D/16 wgmma, K = head dim in
// steps of 16 (32 bytes inside a 128-byte swizzle row, then the next column block).
template <class Traits>
__device__ __forceinline__ void issue_scores(float (&s)[64], const ConsumerContext& c, std::uint32_t k_stage) {
  pin_registers(s);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Traits::kHeadDim / 16; ++kk) {
    const std::uint32_t q_offset = sm90_layout::k_major_step_offset(kk, c.q_first_row, Traits::kBlockM);
    const std::uint32_t k_offset = sm90_layout::k_major_step_offset(kk, 0, Traits::kBlockN);
    wgmma_scores<typename Traits::T>(s, matrix_descriptor(c.q_address + q_offset, 16, sm90_layout::kGroupBytes),
                                     matrix_descriptor(k_stage + k_offset, 16, sm90_layout::kGroupBytes), kk > 0);
  }
  wgmma_commit();
}

// O += P V: V is [key][d] in shared memory (N-major for this product), 16 keys per
// step = two 8-key groups of 1024 bytes; LBO steps between 64-column blocks.
template <class Traits>
__device__ __forceinline__ void issue_values(float (&o_acc)[Traits::kHeadDim / 2], std::uint32_t (&p_frag)[8][4],
                                             std::uint32_t v_stage) {
  // Rescaled O and packed P are written by ordinary instructions: they must be
  // complete before the fence (the compiler may not sink them past it).
  pin_registers(o_acc);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) pin_registers(p_frag[kk]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
    wgmma_values<typename Traits::T>(
        o_acc, p_frag[kk],
        matrix_descriptor(v_stage + sm90_layout::mn_major_step_offset(kk),
                          sm90_layout::column_block_bytes(Traits::kBlockN), sm90_layout::kGroupBytes));
  wgmma_commit();
}

// Partial tiles: their bitmask; the ragged last tile: bounds. Full tiles: nothing.
template <class Traits>
__device__ __forceinline__ void apply_tile_mask(float (&s)[64], const TileMask& m, const ConsumerContext& c,
                                                int tokens) {
  if (m.partial) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int bit = (j % 8) * 8 + c.quad_lane * 2 + e;
          if (!((m.words[r][j / 8] >> bit) & 1u)) s[4 * j + 2 * r + e] = -INFINITY;
        }
  }
  if (m.first_key + Traits::kBlockN > tokens) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (m.first_key + j * 8 + c.quad_lane * 2 + e >= tokens) {
          s[4 * j + e] = -INFINITY;
          s[4 * j + 2 + e] = -INFINITY;
        }
  }
}

// Online softmax over one tile's scores: updates max and sum, turns s into
// unnormalised probabilities, and returns the factor the output accumulator
// must be scaled by (the caller applies it: a kernel that overlaps P V of the
// previous tile may only do so once that product has landed). The four lanes of
// a quad share each row.
__device__ __forceinline__ void softmax_update(float (&s)[64], SoftmaxState& state, float scale_log2,
                                               float (&rescale)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float tile_max = state.row_max[r];
#pragma unroll
    for (int j = 0; j < 16; ++j) tile_max = fmaxf(tile_max, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    // Nothing allowed yet: subtract 0 so exp2(-inf) = 0 rather than NaN.
    float offset = (tile_max == -INFINITY ? 0.f : tile_max) * scale_log2;
    float previous = state.row_max[r] * scale_log2;  // -inf while row_max is: rescale 0
    if (fabsf(offset) == INFINITY) {
      // Scores whose product with scale_log2 passes FLT_MAX (scale > ln 2, |s| ~1e38) while the
      // reference's stay finite: shift the row by its max first, as the CPU kernels do. Rare,
      // and the quad agrees (tile_max is the quad's), so the branch costs one test per row.
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        s[4 * j + 2 * r] -= tile_max;
        s[4 * j + 2 * r + 1] -= tile_max;
      }
      previous = (state.row_max[r] - tile_max) * scale_log2;
      offset = 0.f;
    }
    rescale[r] = fast_exp2(previous - offset);
    state.row_max[r] = tile_max;
    state.row_sum[r] *= rescale[r];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      s[4 * j + 2 * r] = fast_exp2(fmaf(s[4 * j + 2 * r], scale_log2, -offset));
      s[4 * j + 2 * r + 1] = fast_exp2(fmaf(s[4 * j + 2 * r + 1], scale_log2, -offset));
      state.row_sum[r] += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
    }
  }
}

template <int kAccumulators>
__device__ __forceinline__ void rescale_output(float (&o_acc)[kAccumulators], const float (&rescale)[2]) {
#pragma unroll
  for (int j = 0; j < kAccumulators / 4; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      o_acc[4 * j + 2 * r] *= rescale[r];
      o_acc[4 * j + 2 * r + 1] *= rescale[r];
    }
}

// P as wgmma A fragments: keys 16kk..16kk+15 are accumulator blocks 2kk and 2kk+1,
// laid out exactly as the A operand wants them (rounded to the input type).
template <class T>
__device__ __forceinline__ void pack_probabilities(const float (&s)[64], std::uint32_t (&p_frag)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) p_frag[kk][i] = pack_pair<T>(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
}

__device__ __forceinline__ void release(const ConsumerContext& c, std::uint64_t* barrier) {
  __syncwarp();
  if (c.lane == 0) mbarrier_arrive(barrier);
}

// Ping-pong (FlashAttention-3's warp-scheduler barriers): a consumer warpgroup
// issues a tile's products only in its turn and then hands the turn to the
// other group, so while one group runs its softmax the other's products have
// the tensor cores, instead of both groups' products and softmaxes coinciding.
// The turns are two mbarriers rather than named barriers: a wait that never
// ends then traps after 5 s like every other wait here, instead of hanging.
// turn[g] completes a phase when the other group's 4 warps have handed over;
// group g's k-th wait is for phase k (parity k & 1). Group 1 grants group 0 the
// first turn. A group hands over phase k+1 only after its own turn k, which
// follows the other group's wait for phase k: no barrier runs two phases ahead
// of its waiter. Both groups take the same number of turns (same items, same
// tiles).
template <bool kEnabled>
struct ConsumerTurns {
  std::uint64_t* mine = nullptr;    // this group's turn barrier
  std::uint64_t* theirs = nullptr;  // the other group's
  int lane = 0;
  std::uint32_t taken = 0;  // turns this group has waited for

  __device__ __forceinline__ void hand_over() const {
    __syncwarp();
    if (lane == 0) mbarrier_arrive(theirs);
  }
  __device__ __forceinline__ void grant_first(int group) const {
    if constexpr (kEnabled)
      if (group == 1) hand_over();
  }
  __device__ __forceinline__ void wait() {
    if constexpr (kEnabled) mbarrier_wait(mine, taken++ & 1);
  }
  __device__ __forceinline__ void pass() const {
    if constexpr (kEnabled) hand_over();
  }
};

// One item, tile after tile: S, softmax, P V, each waited for before the next.
template <class Traits>
__device__ __forceinline__ void consume_item(const AttentionParams& p, const ConsumerContext& c, const WorkItem& w,
                                             int kv_use, float (&o_acc)[Traits::kHeadDim / 2],
                                             SoftmaxState& state) {
  for (int t = 0; t < w.tiles; ++t, ++kv_use) {
    const int stage = kv_use % Traits::kStages;
    const std::uint32_t ready_parity = (kv_use / Traits::kStages) & 1;
    float s[64];
    mbarrier_wait(&c.k_full[stage], ready_parity);
    issue_scores<Traits>(s, c, c.k_address + stage * Traits::kTileBytes);
    const TileMask mask = fetch_tile_mask<Traits>(p, c, w, t);  // overlaps the tensor cores
    wgmma_wait<0>();
    pin_registers(s);
    release(c, &c.k_empty[stage]);
    if (t == w.tiles - 1) release(c, c.q_empty);  // done with Q: the next item's may load

    apply_tile_mask<Traits>(s, mask, c, p.tokens);
    float rescale[2];
    softmax_update(s, state, p.scale_log2, rescale);
    rescale_output(o_acc, rescale);
    std::uint32_t p_frag[8][4];
    pack_probabilities<typename Traits::T>(s, p_frag);

    mbarrier_wait(&c.v_full[stage], ready_parity);
    pin_registers(o_acc);
    issue_values<Traits>(o_acc, p_frag, c.v_address + stage * Traits::kTileBytes);
    wgmma_wait<0>();
    pin_registers(o_acc);
    release(c, &c.v_empty[stage]);
  }
}

// Intra-warpgroup overlap: the tensor cores compute the scores of tile t while
// they also run P V of tile t-1, and the softmax of tile t runs while that P V
// finishes. Registers a wgmma reads or writes are never written by other
// instructions while it may run: P is packed and O rescaled only when no product
// that uses them is in flight (ptxas serializes the wgmma otherwise, C7513).
// With ping-pong, a turn covers the issue of S(t) and P V(t-1), as in
// FlashAttention-3; the last P V of an item is issued outside any turn.
template <class Traits>
__device__ __forceinline__ void consume_item_overlapped(const AttentionParams& p, const ConsumerContext& c,
                                                        const WorkItem& w, int kv_use,
                                                        float (&o_acc)[Traits::kHeadDim / 2], SoftmaxState& state,
                                                        ConsumerTurns<Traits::kPingPong>& turns) {
  if (w.tiles == 0) return;
  auto stage_of = [&](int t) { return (kv_use + t) % Traits::kStages; };
  auto parity_of = [&](int t) { return std::uint32_t(((kv_use + t) / Traits::kStages) & 1); };
  float s[64];
  std::uint32_t p_frag[8][4];
  float rescale[2];

  // Tile 0: nothing to overlap with yet.
  turns.wait();
  mbarrier_wait(&c.k_full[stage_of(0)], parity_of(0));
  issue_scores<Traits>(s, c, c.k_address + stage_of(0) * Traits::kTileBytes);
  turns.pass();
  {
    const TileMask mask = fetch_tile_mask<Traits>(p, c, w, 0);
    wgmma_wait<0>();
    pin_registers(s);
    release(c, &c.k_empty[stage_of(0)]);
    if (w.tiles == 1) release(c, c.q_empty);
    apply_tile_mask<Traits>(s, mask, c, p.tokens);
    softmax_update(s, state, p.scale_log2, rescale);
    pack_probabilities<typename Traits::T>(s, p_frag);
  }

  for (int t = 1; t < w.tiles; ++t) {
    const int stage = stage_of(t), previous = stage_of(t - 1);
    turns.wait();
    mbarrier_wait(&c.k_full[stage], parity_of(t));
    issue_scores<Traits>(s, c, c.k_address + stage * Traits::kTileBytes);
    rescale_output(o_acc, rescale);  // to tile t-1's max, before P V of tile t-1 adds to it
    mbarrier_wait(&c.v_full[previous], parity_of(t - 1));
    issue_values<Traits>(o_acc, p_frag, c.v_address + previous * Traits::kTileBytes);
    turns.pass();
    const TileMask mask = fetch_tile_mask<Traits>(p, c, w, t);

    wgmma_wait<1>();  // the scores (the older group) have landed; P V may still run
    pin_registers(s);
    release(c, &c.k_empty[stage]);
    if (t == w.tiles - 1) release(c, c.q_empty);
    apply_tile_mask<Traits>(s, mask, c, p.tokens);
    softmax_update(s, state, p.scale_log2, rescale);

    wgmma_wait<0>();  // P V of tile t-1 is in o_acc; its P fragments are free again
    pin_registers(o_acc);
    release(c, &c.v_empty[previous]);
    pack_probabilities<typename Traits::T>(s, p_frag);
  }

  const int last = stage_of(w.tiles - 1);
  rescale_output(o_acc, rescale);
  mbarrier_wait(&c.v_full[last], parity_of(w.tiles - 1));
  issue_values<Traits>(o_acc, p_frag, c.v_address + last * Traits::kTileBytes);
  wgmma_wait<0>();
  pin_registers(o_acc);
  release(c, &c.v_empty[last]);
}

// O = acc / sum, LSE = ln(sum) + max * scale; rows with nothing allowed get
// O = 0 and LSE = -inf; rows past the sequence are not stored.
template <class Traits>
__device__ __forceinline__ void store_output(const AttentionParams& p, const ConsumerContext& c, const WorkItem& w,
                                             const float (&o_acc)[Traits::kHeadDim / 2], const SoftmaxState& state) {
  // Both rows' quad sums first: the shuffles run with the whole warp, before
  // any lane leaves for a row past the sequence.
  float row_sums[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sums[r] = state.row_sum[r];
    row_sums[r] += __shfl_xor_sync(0xffffffffu, row_sums[r], 1);
    row_sums[r] += __shfl_xor_sync(0xffffffffu, row_sums[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = row_sums[r];
    const int token = w.q_tile * Traits::kBlockM + c.tile_row[r];
    if (token >= p.tokens) continue;
    const bool empty = sum == 0.f;  // NaN sums are not empty: they propagate
    const float inverse = empty ? 0.f : 1.f / sum;
    const OutputRow out = output_row(p, w.batch, w.head_slot, token);
#pragma unroll
    for (int j = 0; j < Traits::kHeadDim / 8; ++j)
      store_output_pair(p, out.o + j * 8 + c.quad_lane * 2, o_acc[4 * j + 2 * r] * inverse,
                        o_acc[4 * j + 2 * r + 1] * inverse);
    if (p.lse != nullptr && c.quad_lane == 0)
      p.lse[out.lse] = empty ? -INFINITY : logf(sum) + state.row_max[r] * p.scale;
  }
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    tile_sparse_attention_sm90_kernel(const __grid_constant__ Sm90AttentionParams params) {
#if STSA_SM90_ENABLED
  constexpr int kD = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  constexpr int kBlockBytes = Traits::kBlockBytes;
  const AttentionParams& p = params.common;

  // Shared memory, from a 1024-byte aligned base (the 128-byte swizzle repeats every 1024 bytes).
  extern __shared__ unsigned char raw_shared[];
  const std::uint32_t raw_address = shared_address(raw_shared);
  unsigned char* const base = raw_shared + ((1024 - (raw_address & 1023)) & 1023);
  unsigned char* const q_smem = base;
  unsigned char* const k_smem = q_smem + Traits::kQBytes;
  unsigned char* const v_smem = k_smem + kStages * Traits::kTileBytes;
  auto* const barriers = reinterpret_cast<std::uint64_t*>(v_smem + kStages * Traits::kTileBytes);
  std::uint64_t* const q_full = barriers;
  std::uint64_t* const q_empty = barriers + 1;
  std::uint64_t* const k_full = barriers + 2;
  std::uint64_t* const k_empty = k_full + kStages;
  std::uint64_t* const v_full = k_empty + kStages;
  std::uint64_t* const v_empty = v_full + kStages;
  std::uint64_t* const turn = v_empty + kStages;  // [consumer group]

  const int warp_group = int(threadIdx.x) / 128;
  const int lane = int(threadIdx.x) % 32;

  if (threadIdx.x == 0) {
    barrier_timeout_report = params.barrier_timeout_report;  // read only by a wait that timed out
    mbarrier_init(q_full, 1);
    mbarrier_init(q_empty, Traits::kConsumerWarps);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&k_full[s], 1);
      mbarrier_init(&v_full[s], 1);
      mbarrier_init(&k_empty[s], Traits::kConsumerWarps);
      mbarrier_init(&v_empty[s], Traits::kConsumerWarps);
    }
    for (int g = 0; g < Traits::kConsumerGroups; ++g) mbarrier_init(&turn[g], Traits::kConsumerWarps / 2);
    mbarrier_init_fence();
  }
  __syncthreads();  // the last block-wide barrier: roles split below

  const BlockItems mine = block_items(p);

  if (warp_group == 0) {
    // ---------------- producer ----------------
    registers_decrease<Traits::kProducerRegisters>();
    if (threadIdx.x != 0) return;
    tma_prefetch_descriptor(&params.q_map);
    tma_prefetch_descriptor(&params.k_map);
    tma_prefetch_descriptor(&params.v_map);
    int kv_use = 0;
    for (int local_item = 0; local_item < mine.count(); ++local_item) {
      const WorkItem w = decode_item(p, mine.at(local_item));
      mbarrier_wait(q_empty, (local_item & 1) ^ 1);
      mbarrier_arrive_expect_bytes(q_full, Traits::kQBytes);
      for (int c = 0; c < Traits::kColumnBlocks; ++c)
        tma_load_4d(q_smem + c * kBlockBytes, &params.q_map, q_full, c * 64, w.q_tile * Traits::kBlockM, w.head,
                    w.batch);
      for (int t = 0; t < w.tiles; ++t, ++kv_use) {
        const int stage = kv_use % kStages;
        const std::uint32_t free_parity = ((kv_use / kStages) & 1) ^ 1;
        const int first_key = p.key_tiles[w.entry_begin + t] * Traits::kBlockN;
        mbarrier_wait(&k_empty[stage], free_parity);
        mbarrier_arrive_expect_bytes(&k_full[stage], Traits::kTileBytes);
        for (int c = 0; c < Traits::kColumnBlocks; ++c)
          tma_load_4d(k_smem + stage * Traits::kTileBytes + c * kBlockBytes, &params.k_map, &k_full[stage], c * 64,
                      first_key, w.head, w.batch);
        mbarrier_wait(&v_empty[stage], free_parity);
        mbarrier_arrive_expect_bytes(&v_full[stage], Traits::kTileBytes);
        for (int c = 0; c < Traits::kColumnBlocks; ++c)
          tma_load_4d(v_smem + stage * Traits::kTileBytes + c * kBlockBytes, &params.v_map, &v_full[stage], c * 64,
                      first_key, w.head, w.batch);
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  registers_increase<Traits::kConsumerRegisters>();
  const int consumer_group = warp_group - 1;              // which 64 query rows of the tile
  const int warp_in_group = (int(threadIdx.x) / 32) % 4;  // which 16 of those
  ConsumerContext c;
  c.lane = lane;
  c.quad_lane = lane % 4;
  c.tile_row[0] = consumer_group * 64 + warp_in_group * 16 + lane / 4;
  c.tile_row[1] = c.tile_row[0] + 8;
  c.q_address = shared_address(q_smem);
  c.q_first_row = consumer_group * Traits::kRowsPerGroup;
  c.k_address = shared_address(k_smem);
  c.v_address = shared_address(v_smem);
  c.q_empty = q_empty;
  c.k_full = k_full;
  c.k_empty = k_empty;
  c.v_full = v_full;
  c.v_empty = v_empty;

  ConsumerTurns<Traits::kPingPong> turns;
  turns.mine = &turn[consumer_group];
  turns.theirs = &turn[1 - consumer_group];
  turns.lane = lane;
  turns.grant_first(consumer_group);

  int kv_use = 0;
  // The next item's number is loaded an item ahead: between two items the
  // consumers wait only for decode_item's own loads, as before the lists.
  int item = mine.count() > 0 ? mine.at(0) : 0;
  for (int local_item = 0; local_item < mine.count(); ++local_item) {
    const WorkItem w = decode_item(p, item);
    if (local_item + 1 < mine.count()) item = mine.at(local_item + 1);
    float o_acc[kD / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o_acc[i] = 0.f;
    SoftmaxState state;

    mbarrier_wait(q_full, local_item & 1);
    if constexpr (Traits::kOverlap)
      consume_item_overlapped<Traits>(p, c, w, kv_use, o_acc, state, turns);
    else
      consume_item<Traits>(p, c, w, kv_use, o_acc, state);
    kv_use += w.tiles;
    if (w.tiles == 0) release(c, q_empty);  // nothing to compute: release Q at once
    store_output<Traits>(p, c, w, o_acc, state);
  }
#else
  __trap();  // built only for sm_90a; the launcher never selects it elsewhere
#endif
}

}  // namespace stsa::cuda_detail
