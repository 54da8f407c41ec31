// The routing kernels (routing_launch.hpp): sampled rows against all keys,
// dense and under each candidate mask, merged over key splits into squared
// output errors per head.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/ptx.cuh"
#include "cuda/routing_launch.hpp"
#include "stsa/error.hpp"

namespace stsa::cuda_detail {
namespace {

constexpr int kPad = 8;             // elements after each shared b16 row: rows shift by 16 bytes, so the
                                    // eight row addresses of an ldmatrix land in distinct bank groups
constexpr int kStages = 3;          // K/V tiles in shared memory: two in flight while one is consumed
constexpr int kCombineThreads = 128;
constexpr unsigned kFullMask = 0xffffffffu;
static_assert(kRoutingKeys == 64, "a thread's keys of a tile are bits of one 32-bit word per row");
constexpr int kThreadKeys = kRoutingKeys / 4;  // a quad's lane holds keys 8n + 2t + {0, 1}
constexpr std::uint32_t kThreadKeyBits = (1u << kThreadKeys) - 1;

// Byte offsets of the partials kernel's dynamic shared memory (all multiples of 16).
template <int kHeadDim, int kBlockRows>
struct SharedLayout {
  static constexpr int kPitch = kHeadDim + kPad;                        // elements per Q / K / V row
  static constexpr int q = 0;                                           // (kBlockRows, kPitch)
  static constexpr int k = q + kBlockRows * kPitch * 2;                 // kStages x (kRoutingKeys, kPitch)
  static constexpr int v = k + kStages * kRoutingKeys * kPitch * 2;     // kStages x (kRoutingKeys, kPitch)
  static constexpr int codes = v + kStages * kRoutingKeys * kPitch * 2; // 2 x (kMaxRoutingCandidates, kRoutingKeys)
  static constexpr int bytes = codes + 2 * kMaxRoutingCandidates * kRoutingKeys * 4;
  static_assert(k % 16 == 0 && v % 16 == 0 && codes % 16 == 0, "16-byte rows");
};

__device__ __forceinline__ PredicateMask candidate_mask(const RoutingParams& p, int c) {
  // A select, not p.masks[c]: a dynamic index into the parameter struct would copy it to local memory.
  return c == 0 ? p.masks[0] : (c == 1 ? p.masks[1] : p.masks[2]);
}

template <class Element>
__device__ __forceinline__ float pair_sum(std::uint32_t bits);

template <>
__device__ __forceinline__ float pair_sum<__nv_bfloat16>(std::uint32_t bits) {
  const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&bits);
  return __low2float(v) + __high2float(v);
}

template <>
__device__ __forceinline__ float pair_sum<__half>(std::uint32_t bits) {
  const __half2 v = *reinterpret_cast<const __half2*>(&bits);
  return __low2float(v) + __high2float(v);
}

// Maximum, sum and OR over the four lanes of a quad (the lanes that share a fragment row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFullMask, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFullMask, x, 2));
}
template <class T>
__device__ __forceinline__ T quad_sum(T x) {
  x += __shfl_xor_sync(kFullMask, x, 1);
  return x + __shfl_xor_sync(kFullMask, x, 2);
}

// The shape of a partials block for `kOutputs` outputs: one warp per (output,
// 16-row group). Two candidates: all four row groups of a row block (K/V read
// once per row block), 12 warps with up to 168 registers each. Three: two row
// groups per block and two blocks per row block (gridDim.z), 8 warps, so a
// thread keeps 255 registers instead of the 128 that 16 warps would leave it.
template <int kOutputs>
struct RoutingBlock {
  static_assert(kOutputs == 3 || kOutputs == 4, "two or three candidates");
  static constexpr int kRowGroups = kOutputs == 3 ? kRoutingRowGroups : kRoutingRowGroups / 2;
  static constexpr int kRows = kRowGroups * 16;
  static constexpr int kParts = kRoutingRows / kRows;  // blocks per row block
  static constexpr int kThreads = kOutputs * kRowGroups * 32;
};

// One block: rows blockIdx.z * kRows.. of row block blockIdx.x % row_blocks,
// key split blockIdx.x / row_blocks, routed head blockIdx.y. Warp w owns one
// output (w / kRowGroups: 0 dense, 1 + c candidate c) for 16 rows (row group
// w % kRowGroups) and works like a flash-attention warp: scores, the
// online softmax and P.V in registers, P passed from the score accumulators
// straight into the P.V fragments. The warps share only the K/V tiles and the
// tiles' mask codes, so a key tile costs one __syncthreads. A candidate warp
// whose mask allows its 16 rows no key of the tile skips it (a sparse
// candidate allows a row ~10% of the keys); the dense warps walk every tile,
// are the only ones that flag a row's non-finite scores, and do nothing else:
// the candidate warps load the K/V tiles and write the mask codes. The scores are
// computed once per output (4x the Q.K^T of a shared score tile), which costs
// tensor-core time the kernel has to spare instead of two shared-memory round
// trips and three barriers per tile.
template <class Element, int kHeadDim, int kOutputs>
__global__ void __launch_bounds__(RoutingBlock<kOutputs>::kThreads, 1) routing_partials(const RoutingParams p) {
  using Block = RoutingBlock<kOutputs>;
  using L = SharedLayout<kHeadDim, Block::kRows>;
  constexpr int kThreads = Block::kThreads;
  constexpr int kPitch = L::kPitch;
  constexpr int kVectors = kHeadDim / 8;  // 16-byte pieces of a row
  extern __shared__ __align__(16) unsigned char shared[];
  Element* const q_s = reinterpret_cast<Element*>(shared + L::q);
  Element* const k_s = reinterpret_cast<Element*>(shared + L::k);
  Element* const v_s = reinterpret_cast<Element*>(shared + L::v);
  int* const code_s = reinterpret_cast<int*>(shared + L::codes);  // -1: forced (every pair allowed)

  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int group = lane >> 2, quad_lane = lane & 3;  // fragment row g and column pair t
  const int output = warp / Block::kRowGroups, row_group = warp % Block::kRowGroups;
  const int row_block = int(blockIdx.x % unsigned(p.row_blocks));
  const int split = int(blockIdx.x / unsigned(p.row_blocks));
  const int head_index = int(blockIdx.y);
  const std::int64_t head = p.heads[head_index];
  const std::int64_t batch = p.row_batch[row_block];
  // Key positions fit 32 bits up to a tile past the last key (the host checked tokens <= INT_MAX - kRoutingKeys).
  const std::int64_t split_begin = std::int64_t(split) * p.tiles_per_split * kRoutingKeys;
  const int key_begin = int(split_begin);
  const int key_end = int(min(std::int64_t(p.tokens), split_begin + std::int64_t(p.tiles_per_split) * kRoutingKeys));
  const int tiles = (key_end - key_begin + kRoutingKeys - 1) / kRoutingKeys;
  const Element* q = static_cast<const Element*>(p.q) + batch * p.q_stride[0] + head * p.q_stride[2];
  const Element* k = static_cast<const Element*>(p.k) + batch * p.k_stride[0] + head * p.k_stride[2];
  const Element* v = static_cast<const Element*>(p.v) + batch * p.v_stride[0] + head * p.v_stride[2];
  const int first_row = int(blockIdx.z) * Block::kRows;  // of the row block
  const std::int32_t* positions = p.row_positions + row_block * kRoutingRows + first_row;
  // Padding rows (position -1) fill a batch entry's last row block; the combine
  // never reads their slots. A block of padding rows only (the second half of a
  // row block with 32 or fewer rows, e.g. 64 samples over two batch entries)
  // leaves at once; a warp of padding rows only stops after each tile's barrier.
  if (!__syncthreads_or(tid < Block::kRows && positions[tid] >= 0)) return;
  const bool warp_has_rows = __any_sync(kFullMask, positions[row_group * 16 + (lane & 15)] >= 0);

  for (int i = tid; i < Block::kRows * kVectors; i += kThreads) {
    const int r = i / kVectors, c = i % kVectors;
    const std::int32_t pos = positions[r];
    cp_async_16(q_s + r * kPitch + c * 8, pos >= 0 ? q + pos * p.q_stride[1] + c * 8 : q, pos >= 0);  // padding: 0
  }
  // K/V tiles are loaded by the candidate warps only: a candidate allows a row
  // ~10% of the keys and skips most tiles, while the dense warps, which walk
  // every tile, are the critical path. A tile is kPieces 16-byte pieces; piece
  // i = loader + m * kLoaders is key i / kVectors, columns (i % kVectors) * 8.
  constexpr int kLoaders = kThreads - Block::kRowGroups * 32;
  constexpr int kPieces = kRoutingKeys * kVectors;
  constexpr int kPiecesPerLoader = (kPieces + kLoaders - 1) / kLoaders;
  const int loader = tid - Block::kRowGroups * 32;  // < 0: a dense warp
  auto load_tile = [&](int tile, int stage) {
    if (loader < 0) return;
    const int first = key_begin + tile * kRoutingKeys;  // < key_end: the tile holds a key
    const Element* const k_tile = k + first * p.k_stride[1];
    const Element* const v_tile = v + first * p.v_stride[1];
#pragma unroll
    for (int m = 0; m < kPiecesPerLoader; ++m) {
      const int i = loader + m * kLoaders;
      if (kPieces % kLoaders != 0 && i >= kPieces) break;
      const int j = i / kVectors, c = i % kVectors;
      const bool valid = first + j < key_end;  // keys past the split are zero-filled and never allowed
      const int key = valid ? j : 0;
      Element* const to = k_s + (stage * kRoutingKeys + j) * kPitch + c * 8;
      cp_async_16(to, k_tile + key * p.k_stride[1] + c * 8, valid);
      cp_async_16(to + (v_s - k_s), v_tile + key * p.v_stride[1] + c * 8, valid);
    }
  };
  // Prologue: Q with the first tile, then the second; one commit group per tile
  // (empty groups past the end keep the count uniform).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) load_tile(s, s);
    cp_async_commit();
  }

  // The mask codes of a tile's keys are written by the last warps (a candidate
  // warp waits less at the barrier than a dense one), before the barrier that
  // publishes the tile.
  const int code_thread = kThreads - 1 - tid;
  const bool writes_codes = code_thread < (kOutputs - 1) * kRoutingKeys;
  const int code_candidate = code_thread / kRoutingKeys, code_key = code_thread % kRoutingKeys;

  // This warp's rows (g and g + 8 of its group): the window of key codes each
  // allows under the warp's candidate (the dense output: every key).
  const PredicateMask mask = candidate_mask(p, output > 0 ? output - 1 : 0);
  RowWindow row_keys[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int32_t pos = positions[row_group * 16 + group + 8 * r];
    if (output > 0) row_keys[r] = row_window(mask, mask_token(p.grid, mask, pos >= 0 ? pos : 0));
  }

  // This lane's ldmatrix row addresses (shared window) in Q and in stage 0 of K
  // and V; fragments add constant offsets. Q: (rows +0..7, d lo), (rows +8..15,
  // d lo), (rows +0..7, d hi), (rows +8..15, d hi). K: (keys +0..7, d lo),
  // (keys +0..7, d hi), (keys +8..15, d lo), (keys +8..15, d hi). V, transposed:
  // (keys +0..7, d lo), (keys +8..15, d lo), (keys +0..7, d hi), (keys +8..15, d hi).
  constexpr int kStageBytes = kRoutingKeys * kPitch * 2;
  const std::uint32_t q_fragment =
      shared_address(q_s + (row_group * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kPitch + (lane >> 4) * 8);
  const std::uint32_t k_fragment = shared_address(k_s + ((lane >> 4) * 8 + (lane & 7)) * kPitch + ((lane >> 3) & 1) * 8);
  const std::uint32_t v_fragment = shared_address(v_s + (((lane >> 3) & 1) * 8 + (lane & 7)) * kPitch + (lane >> 4) * 8);

  float acc[kHeadDim / 8][4];  // (16 rows, kHeadDim): mma accumulator tiles
#pragma unroll
  for (int n = 0; n < kHeadDim / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  // Per thread, rows g and g + 8: running maximum (log2 domain), this thread's
  // share of the sum and of the allowed pairs, and the probe that turns NaN
  // after a non-finite score (read for the dense output only).
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f}, row_probe[2] = {0.f, 0.f};
  int row_kept[2] = {0, 0};

  for (int tile = 0; tile < tiles; ++tile) {
    const int stage = tile % kStages;
    const int first = key_begin + tile * kRoutingKeys;
    // Codes in buffer tile % 2: its readers of tile - 2 all passed the previous barrier.
    int* const codes = code_s + (tile & 1) * kMaxRoutingCandidates * kRoutingKeys;
    if (writes_codes) {
      const int key = first + code_key;
      const MaskToken t = key < key_end ? mask_token(p.grid, candidate_mask(p, code_candidate), key) : MaskToken{true, 0};
      codes[code_candidate * kRoutingKeys + code_key] = t.forced ? -1 : t.code;
    }
    cp_async_wait<kStages - 2>();  // this thread's copies of the tile (and of Q) have landed ...
    __syncthreads();               // ... and everyone's; everyone is also done with tile - 1's stage
    if (tile + kStages - 1 < tiles) load_tile(tile + kStages - 1, (tile + kStages - 1) % kStages);
    cp_async_commit();

    if (!warp_has_rows) continue;

    // Allowed keys: bit 2n + e of allowed[r] is key 8n + 2t + e for row g + 8r.
    // The dense output allows every key of the tile; a candidate reads the
    // tile's codes (mask_predicate.hpp). Keys past the split end are never allowed.
    const int tile_keys = min(kRoutingKeys, key_end - first);
    std::uint32_t valid = kThreadKeyBits;
    if (tile_keys < kRoutingKeys) {
      valid = 0u;
#pragma unroll
      for (int i = 0; i < kThreadKeys; ++i)
        if ((i / 2) * 8 + 2 * quad_lane + i % 2 < tile_keys) valid |= 1u << i;
    }
    std::uint32_t allowed[2] = {valid, valid};
    if (output > 0) {
      allowed[0] = allowed[1] = 0u;
#pragma unroll
      for (int n = 0; n < kRoutingKeys / 8; ++n) {
        const int2 code = *reinterpret_cast<const int2*>(codes + (output - 1) * kRoutingKeys + n * 8 + 2 * quad_lane);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          allowed[r] |= window_bit(row_keys[r], code.x, 1u << (2 * n));
          allowed[r] |= window_bit(row_keys[r], code.y, 1u << (2 * n + 1));
        }
      }
      allowed[0] &= valid;
      allowed[1] &= valid;
    }
    // Warp-uniform: a candidate that allows these 16 rows nothing here leaves their state as it is.
    if (output > 0 && !__any_sync(kFullMask, (allowed[0] | allowed[1]) != 0u)) continue;

    // S = Q K^T (16 rows x 64 keys, 8 accumulator tiles), then to the log2 domain.
    const std::uint32_t k_tile = k_fragment + stage * kStageBytes, v_tile = v_fragment + stage * kStageBytes;
    float s[kRoutingKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kRoutingKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      std::uint32_t a[4];
      ldmatrix_x4(a, q_fragment + kk * 32);
#pragma unroll
      for (int np = 0; np < kRoutingKeys / 16; ++np) {
        std::uint32_t b[4];
        ldmatrix_x4(b, k_tile + (np * 16 * kPitch + kk * 16) * 2);
        mma_16x8x16<Element>(s[2 * np], a, b[0], b[1]);
        mma_16x8x16<Element>(s[2 * np + 1], a, b[2], b[3]);
      }
    }

    // Online softmax: per row the maximum of the allowed scores and the
    // rescale of the running state, then P = exp2(S - max) 16 keys at a time,
    // rounded to the input type and passed straight into P.V (the accumulator
    // layout of S tiles 2j and 2j + 1 is the A fragment of keys 16j..16j + 15).
    // P's sum is taken from the rounded values, so O is exactly a weighted mean of V.
    // A key the row may not see scores -inf, so it drops out of the maximum and
    // P = exp2(-inf - m) = 0 needs no second test. Every raw score goes into a
    // probe as x * 0 (NaN after an infinite or NaN score; the dense output
    // reports it): keys past the split end are zero-filled, so their scores
    // are finite whenever Q is.
    float m_new[2], m_shift[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kRoutingKeys / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = s[n][2 * r + e] * p.scale_log2;
          row_probe[r] = fmaf(x, 0.f, row_probe[r]);
          s[n][2 * r + e] = (allowed[r] >> (2 * n + e) & 1u) != 0u ? x : -INFINITY;
          tile_max = fmaxf(tile_max, s[n][2 * r + e]);
        }
      m_new[r] = fmaxf(row_max[r], quad_max(tile_max));
      // No key of the row allowed yet: every score is -inf, and -inf - 0 keeps P =
      // 0; alpha stays 1 then (its state is still zero), so the rescale below can be skipped.
      m_shift[r] = m_new[r] == -INFINITY ? 0.f : m_new[r];
      alpha[r] = m_new[r] == -INFINITY ? 1.f : fast_exp2(row_max[r] - m_new[r]);
      row_max[r] = m_new[r];
      row_sum[r] *= alpha[r];
      row_kept[r] += __popc(allowed[r]);
    }
    // After the first tiles a row's maximum rarely moves (alpha = 1): skip the rescale then.
    if (__any_sync(kFullMask, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int n = 0; n < kHeadDim / 8; ++n) {
        acc[n][0] *= alpha[0];
        acc[n][1] *= alpha[0];
        acc[n][2] *= alpha[1];
        acc[n][3] *= alpha[1];
      }
    }
#pragma unroll
    for (int j = 0; j < kRoutingKeys / 16; ++j) {
      std::uint32_t p_frag[4];  // (row g, keys 16j + 2t..), (row g + 8, ..), (row g, keys 16j + 8 + 2t..), (row g + 8, ..)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int n = 2 * j + h;
          p_frag[2 * h + r] =
              pack_pair<Element>(fast_exp2(s[n][2 * r] - m_shift[r]), fast_exp2(s[n][2 * r + 1] - m_shift[r]));
          row_sum[r] += pair_sum<Element>(p_frag[2 * h + r]);
        }
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        std::uint32_t b[4];
        ldmatrix_x4_trans(b, v_tile + (j * 16 * kPitch + dp * 16) * 2);
        mma_16x8x16<Element>(acc[2 * dp], p_frag, b[0], b[1]);
        mma_16x8x16<Element>(acc[2 * dp + 1], p_frag, b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();  // only empty groups can remain; leave nothing in flight

  // The quad's shares, then one lane per row writes the state; every lane its accumulator columns.
  const std::int64_t slot = ((std::int64_t(head_index) * p.row_blocks + row_block) * p.splits + split) *
                                kRoutingOutputs + output;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(row_sum[r]);
    const int kept = quad_sum(row_kept[r]);
    const bool bad = quad_sum(int(isnan(row_probe[r]))) != 0 && output == 0;
    const int row = first_row + row_group * 16 + group + 8 * r;
    const std::int64_t at = slot * kRoutingRows + row;
    if (quad_lane == 0) {
      p.part_max[at] = bad ? NAN : row_max[r];
      p.part_sum[at] = sum;
      p.part_kept[at] = kept;
    }
    float* out = p.part_acc + at * kHeadDim + 2 * quad_lane;
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n)
      *reinterpret_cast<float2*>(out + n * 8) = make_float2(acc[n][2 * r], acc[n][2 * r + 1]);
  }
}

// One block per (sampled row slot, routed head): merges the splits of every
// output (each relative to its own maximum) and writes the row's statistics.
// A row without any allowed key has O = 0 (attention.hpp).
__global__ void __launch_bounds__(kCombineThreads) routing_combine(const RoutingParams p) {
  extern __shared__ float factor_s[];  // (kRoutingOutputs, splits): exp2(split max - overall max)
  __shared__ float z_s[kRoutingOutputs];
  __shared__ int poisoned_s;
  __shared__ double partial_s[kCombineThreads / 32][kRoutingStats];
  const int slot_row = int(blockIdx.x), head_index = int(blockIdx.y);
  const int row_block = slot_row / kRoutingRows, row = slot_row % kRoutingRows;
  const int outputs = 1 + p.candidates, tid = int(threadIdx.x);
  double* out = p.row_stats + (std::int64_t(head_index) * p.row_blocks * kRoutingRows + slot_row) * kRoutingStats;
  if (p.row_positions[slot_row] < 0) {  // padding slot
    if (tid < kRoutingStats) out[tid] = 0.0;
    return;
  }
  const std::int64_t base = (std::int64_t(head_index) * p.row_blocks + row_block) * p.splits;
  auto at = [&](int split, int o) { return ((base + split) * kRoutingOutputs + o) * kRoutingRows + row; };
  if (tid == 0) poisoned_s = 0;
  __syncthreads();
  // Warp o merges output o: its lanes stride over the splits (a sequential
  // walk would wait for one load at a time, and there are ~44 splits at 1440p).
  static_assert(kCombineThreads / 32 >= kRoutingOutputs, "a warp per output");
  const int warp = tid >> 5, lane = tid & 31;
  if (warp < outputs) {
    float top = -INFINITY;
    bool nan = false;
    for (int s = lane; s < p.splits; s += 32) {
      const float x = p.part_max[at(s, warp)];
      nan = nan || isnan(x);
      top = fmaxf(top, x);
    }
    for (int step = 16; step > 0; step /= 2) top = fmaxf(top, __shfl_xor_sync(kFullMask, top, step));
    float total = 0.f;
    for (int s = lane; s < p.splits; s += 32) {
      const float x = p.part_max[at(s, warp)];
      const float f = x == -INFINITY ? 0.f : exp2f(x - top);
      factor_s[warp * p.splits + s] = f;
      total += f * p.part_sum[at(s, warp)];
    }
    for (int step = 16; step > 0; step /= 2) total += __shfl_xor_sync(kFullMask, total, step);
    if (lane == 0) z_s[warp] = total;
    if (__any_sync(kFullMask, nan) && lane == 0) atomicOr(&poisoned_s, 1);  // several warps may find one
  }
  __syncthreads();

  double stats[kRoutingStats] = {};
  for (int d = tid; d < p.head_dim; d += kCombineThreads) {
    float o_out[kRoutingOutputs] = {};
#pragma unroll
    for (int o = 0; o < kRoutingOutputs; ++o) {
      if (o >= outputs) break;
      float sum = 0.f;
      // Unrolled so that several splits' loads are in flight at once (a split is ~64 KB apart).
#pragma unroll 8
      for (int s = 0; s < p.splits; ++s) sum += factor_s[o * p.splits + s] * p.part_acc[at(s, o) * p.head_dim + d];
      o_out[o] = z_s[o] > 0.f ? sum / z_s[o] : 0.f;
    }
    stats[0] += double(o_out[0]) * double(o_out[0]);
#pragma unroll
    for (int c = 0; c < kMaxRoutingCandidates; ++c)
      if (c < p.candidates) {
        const double e = double(o_out[c + 1]) - double(o_out[0]);
        stats[1 + c] += e * e;
      }
  }
  // Kept pairs of the candidates, shared by all threads (integers: exact in any order).
  for (int i = tid; i < p.candidates * p.splits; i += kCombineThreads)
    stats[kRoutingStats - 1] += double(p.part_kept[at(i % p.splits, 1 + i / p.splits)]);
#pragma unroll
  for (int i = 0; i < kRoutingStats; ++i) {
    double x = stats[i];
    for (int step = 16; step > 0; step /= 2) x += __shfl_xor_sync(kFullMask, x, step);
    if ((tid & 31) == 0) partial_s[tid >> 5][i] = x;
  }
  __syncthreads();
  if (tid < kRoutingStats) {
    double x = 0;
    for (int w = 0; w < kCombineThreads / 32; ++w) x += partial_s[w][tid];
    if (poisoned_s != 0 && tid < 1 + kMaxRoutingCandidates) x = NAN;
    out[tid] = x;
  }
}

// Per head, the row statistics summed in row order.
__global__ void routing_reduce(const RoutingParams p) {
  const int rows = p.row_blocks * kRoutingRows;
  for (int i = int(threadIdx.x); i < p.head_count * kRoutingStats; i += int(blockDim.x)) {
    const int head_index = i / kRoutingStats, stat = i % kRoutingStats;
    double x = 0;
#pragma unroll 8
    for (int r = 0; r < rows; ++r) x += p.row_stats[(std::int64_t(head_index) * rows + r) * kRoutingStats + stat];
    p.head_stats[i] = x;
  }
}

template <class Element, int kHeadDim, int kOutputs>
void launch_partials(const RoutingParams& p, cudaStream_t stream) {
  using Block = RoutingBlock<kOutputs>;
  constexpr int bytes = SharedLayout<kHeadDim, Block::kRows>::bytes;
  auto kernel = routing_partials<Element, kHeadDim, kOutputs>;
  STSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  kernel<<<dim3(unsigned(p.splits) * unsigned(p.row_blocks), unsigned(p.head_count), unsigned(Block::kParts)),
           Block::kThreads, bytes, stream>>>(p);
  STSA_CUDA_CHECK(cudaGetLastError());
}

template <class Element, int kHeadDim>
void launch_partials_for_outputs(const RoutingParams& p, cudaStream_t stream) {
  if (p.candidates == 2) return launch_partials<Element, kHeadDim, 3>(p, stream);
  if (p.candidates == 3) return launch_partials<Element, kHeadDim, 4>(p, stream);
  throw Unsupported(detail::concat("routing kernels: ", p.candidates, " candidates (built for 2 and 3)"));
}

template <class Element>
void launch_partials_for(const RoutingParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 16: return launch_partials_for_outputs<Element, 16>(p, stream);
    case 32: return launch_partials_for_outputs<Element, 32>(p, stream);
    case 48: return launch_partials_for_outputs<Element, 48>(p, stream);
    case 64: return launch_partials_for_outputs<Element, 64>(p, stream);
    case 80: return launch_partials_for_outputs<Element, 80>(p, stream);
    case 96: return launch_partials_for_outputs<Element, 96>(p, stream);
    case 112: return launch_partials_for_outputs<Element, 112>(p, stream);
    case 128: return launch_partials_for_outputs<Element, 128>(p, stream);
    default: break;
  }
  throw Unsupported(detail::concat("routing kernels: head dim ", p.head_dim, " is not built"));
}

}  // namespace

bool routing_head_dim_supported(int head_dim) { return head_dim >= 16 && head_dim <= 128 && head_dim % 16 == 0; }

namespace {
template <int kOutputs>
int shared_bytes_for(int head_dim) {
  constexpr int rows = RoutingBlock<kOutputs>::kRows;
  switch (head_dim) {
    case 16: return SharedLayout<16, rows>::bytes;
    case 32: return SharedLayout<32, rows>::bytes;
    case 48: return SharedLayout<48, rows>::bytes;
    case 64: return SharedLayout<64, rows>::bytes;
    case 80: return SharedLayout<80, rows>::bytes;
    case 96: return SharedLayout<96, rows>::bytes;
    case 112: return SharedLayout<112, rows>::bytes;
    case 128: return SharedLayout<128, rows>::bytes;
    default: return 0;
  }
}
}  // namespace

int routing_shared_bytes(int head_dim, int candidates) {
  // Each candidate count has its own block shape (RoutingBlock): two
  // candidates take all 64 rows of a row block, three take 32.
  if (candidates == 2) return shared_bytes_for<3>(head_dim);
  if (candidates == 3) return shared_bytes_for<4>(head_dim);
  return 0;
}

void launch_routing(const RoutingParams& p, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.bf16) {
    launch_partials_for<__nv_bfloat16>(p, s);
  } else {
    launch_partials_for<__half>(p, s);
  }
  const std::size_t factor_bytes = std::size_t(kRoutingOutputs) * std::size_t(p.splits) * sizeof(float);
  routing_combine<<<dim3(unsigned(p.row_blocks) * kRoutingRows, unsigned(p.head_count)), kCombineThreads,
                    factor_bytes, s>>>(p);
  STSA_CUDA_CHECK(cudaGetLastError());
  routing_reduce<<<1, 256, 0, s>>>(p);
  STSA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace stsa::cuda_detail
