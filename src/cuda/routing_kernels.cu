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
constexpr int kScorePad = 4;        // floats after each score row
constexpr int kRowThreads = 8;      // softmax step: threads per sampled row, 8 keys each
constexpr int kCombineThreads = 128;
constexpr unsigned kFullMask = 0xffffffffu;
// Whether a warp skips the softmax of a candidate that allows its rows no key
// of the tile. Not on sm_80, where the branch makes ptxas spill at head dim 128
// (the Hopper build keeps every value in registers).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
constexpr bool kSkipIdleCandidates = true;
#else
constexpr bool kSkipIdleCandidates = false;
#endif
static_assert(kRoutingRows * kRowThreads == kRoutingThreads, "one softmax thread group per row");
static_assert(kRowThreads * 8 == kRoutingKeys, "8 keys per softmax thread");
static_assert(kRoutingOutputs * 2 == kRoutingThreads / 32, "one warp per (output, 16-row group) in P.V");

// Byte offsets of the partials kernel's dynamic shared memory (all multiples of 16).
template <int kHeadDim>
struct SharedLayout {
  static constexpr int kRow = kHeadDim + kPad;        // elements per Q / K / V row
  static constexpr int kPRow = kRoutingKeys + kPad;   // elements per P row
  static constexpr int kSRow = kRoutingKeys + kScorePad;
  static constexpr int q = 0;                                              // (kRoutingRows, kRow)
  static constexpr int k = q + kRoutingRows * kRow * 2;                    // 2 x (kRoutingKeys, kRow)
  static constexpr int v = k + 2 * kRoutingKeys * kRow * 2;                // 2 x (kRoutingKeys, kRow)
  static constexpr int p = v + 2 * kRoutingKeys * kRow * 2;                // (kRoutingOutputs, kRoutingRows, kPRow)
  static constexpr int s = p + kRoutingOutputs * kRoutingRows * kPRow * 2; // (kRoutingRows, kSRow) fp32
  static constexpr int alpha = s + kRoutingRows * kSRow * 4;               // (kRoutingOutputs, kRoutingRows)
  static constexpr int codes = alpha + kRoutingOutputs * kRoutingRows * 4; // (kMaxRoutingCandidates, kRoutingKeys)
  static constexpr int any = codes + kMaxRoutingCandidates * kRoutingKeys * 4;  // (kRoutingOutputs, 2)
  // Softmax state per (output, row): running maximum, sum, kept pairs; the rows' own codes per candidate.
  static constexpr int max = any + kRoutingOutputs * 2 * 4;
  static constexpr int sum = max + kRoutingOutputs * kRoutingRows * 4;
  static constexpr int kept = sum + kRoutingOutputs * kRoutingRows * 4;
  static constexpr int row_codes = kept + kRoutingOutputs * kRoutingRows * 4;
  static constexpr int bad = row_codes + kMaxRoutingCandidates * kRoutingRows * 4;  // (kRoutingRows): a non-finite score
  static constexpr int bytes = bad + kRoutingRows * 4;
  static_assert(k % 16 == 0 && v % 16 == 0 && p % 16 == 0 && s % 16 == 0 && alpha % 16 == 0, "16-byte rows");
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

// Sum, maximum and OR over the kRowThreads consecutive lanes that share a row.
__device__ __forceinline__ float row_max(float x) {
  for (int step = 1; step < kRowThreads; step *= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, step));
  return x;
}
template <class T>
__device__ __forceinline__ T row_sum(T x) {
  for (int step = 1; step < kRowThreads; step *= 2) x += __shfl_xor_sync(kFullMask, x, step);
  return x;
}

// One block: sampled rows of row block blockIdx.x % row_blocks, key split
// blockIdx.x / row_blocks, routed head blockIdx.y. Per key tile:
//   load   K, V of the next tile (cp.async, double buffered); mask codes of this tile's keys;
//   scores warp w: rows 16 (w % 2) .. +15 x keys 16 (w / 2) .. +15, scaled to the log2 domain;
//   softmax 8 threads per row, 8 keys each: per output the allowed keys' maximum, the
//          rescale factor of the running state, P rounded to the input type (its sum
//          is taken from the rounded values, so O is exactly a weighted mean of V);
//   P.V    warp w: output w / 2, rows 16 (w % 2) .. +15, all channels (skipped when
//          no row of the group has an allowed key in the tile: its factors are all 1).
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(kRoutingThreads, 2) routing_partials(const RoutingParams p) {
  using L = SharedLayout<kHeadDim>;
  constexpr int kRow = L::kRow, kPRow = L::kPRow, kSRow = L::kSRow;
  constexpr int kChunks = kHeadDim / 8;  // 16-byte pieces of a row
  extern __shared__ __align__(16) unsigned char shared[];
  Element* q_s = reinterpret_cast<Element*>(shared + L::q);
  Element* k_s = reinterpret_cast<Element*>(shared + L::k);
  Element* v_s = reinterpret_cast<Element*>(shared + L::v);
  Element* p_s = reinterpret_cast<Element*>(shared + L::p);
  float* s_s = reinterpret_cast<float*>(shared + L::s);
  float* alpha_s = reinterpret_cast<float*>(shared + L::alpha);
  int* code_s = reinterpret_cast<int*>(shared + L::codes);
  int* any_s = reinterpret_cast<int*>(shared + L::any);
  // The softmax state lives in shared memory, not in the registers of the row's
  // threads: the P.V accumulators need those (no spills at 2 blocks per SM).
  float* max_s = reinterpret_cast<float*>(shared + L::max);
  float* sum_s = reinterpret_cast<float*>(shared + L::sum);
  int* kept_s = reinterpret_cast<int*>(shared + L::kept);
  int* row_code_s = reinterpret_cast<int*>(shared + L::row_codes);
  // Set (by any thread of the row) when the row met a non-finite score: its errors are reported as NaN.
  // In shared memory, not a register: at head dim 128 the kernel has none to spare.
  int* bad_s = reinterpret_cast<int*>(shared + L::bad);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int row_block = int(blockIdx.x % unsigned(p.row_blocks));
  const int split = int(blockIdx.x / unsigned(p.row_blocks));
  const int head_index = int(blockIdx.y);
  const std::int64_t head = p.heads[head_index];
  const std::int64_t batch = p.row_batch[row_block];
  const int outputs = 1 + p.candidates;
  const std::int64_t key_begin = std::int64_t(split) * p.tiles_per_split * kRoutingKeys;
  const std::int64_t key_end = min(std::int64_t(p.tokens), key_begin + std::int64_t(p.tiles_per_split) * kRoutingKeys);
  const int tiles = int((key_end - key_begin + kRoutingKeys - 1) / kRoutingKeys);
  const Element* q = static_cast<const Element*>(p.q) + batch * p.q_stride[0] + head * p.q_stride[2];
  const Element* k = static_cast<const Element*>(p.k) + batch * p.k_stride[0] + head * p.k_stride[2];
  const Element* v = static_cast<const Element*>(p.v) + batch * p.v_stride[0] + head * p.v_stride[2];
  const std::int32_t* positions = p.row_positions + row_block * kRoutingRows;

  for (int i = tid; i < kRoutingRows * kChunks; i += kRoutingThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const std::int32_t pos = positions[r];
    cp_async_16(q_s + r * kRow + c * 8, pos >= 0 ? q + pos * p.q_stride[1] + c * 8 : q, pos >= 0);  // padding rows: 0
  }
  auto load_tile = [&](int tile, int buffer) {
    const std::int64_t k0 = key_begin + std::int64_t(tile) * kRoutingKeys;
    for (int i = tid; i < kRoutingKeys * kChunks; i += kRoutingThreads) {
      const int j = i / kChunks, c = i % kChunks;
      const bool valid = k0 + j < key_end;  // keys past the split are zero-filled and never allowed
      const std::int64_t key = valid ? k0 + j : 0;
      cp_async_16(k_s + (buffer * kRoutingKeys + j) * kRow + c * 8, k + key * p.k_stride[1] + c * 8, valid);
      cp_async_16(v_s + (buffer * kRoutingKeys + j) * kRow + c * 8, v + key * p.v_stride[1] + c * 8, valid);
    }
  };
  load_tile(0, 0);
  cp_async_commit();

  if (tid < kRoutingOutputs * kRoutingRows) {
    max_s[tid] = -INFINITY;
    sum_s[tid] = 0.f;
    kept_s[tid] = 0;
  }
  if (tid < kRoutingRows) bad_s[tid] = 0;
  if (tid < kMaxRoutingCandidates * kRoutingRows) {
    const int c = tid / kRoutingRows;
    const std::int32_t pos = positions[tid % kRoutingRows];
    const MaskToken t = mask_token(p.grid, candidate_mask(p, c), pos >= 0 ? pos : 0);
    row_code_s[tid] = t.forced ? -1 : t.code;
  }
  const int row = tid / kRowThreads, sub = tid % kRowThreads;  // softmax step: this thread's row and keys

  const int pv_output = warp >> 1, pv_group = warp & 1;
  float acc[kHeadDim / 8][4];  // (16 rows, kHeadDim) of output pv_output, mma accumulator layout
#pragma unroll
  for (int n = 0; n < kHeadDim / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;

  for (int tile = 0; tile < tiles; ++tile) {
    const int buffer = tile & 1;
    const std::int64_t k0 = key_begin + std::int64_t(tile) * kRoutingKeys;
    if (tile + 1 < tiles) load_tile(tile + 1, buffer ^ 1);
    cp_async_commit();  // possibly empty, so that the wait below always leaves exactly the prefetch in flight
    if (tid < p.candidates * kRoutingKeys) {
      const int c = tid / kRoutingKeys, j = tid % kRoutingKeys;
      const MaskToken t = k0 + j < key_end ? mask_token(p.grid, candidate_mask(p, c), std::int32_t(k0 + j))
                                           : MaskToken{true, 0};
      code_s[tid] = t.forced ? -1 : t.code;
    }
    if (tid < kRoutingOutputs * 2) any_s[tid] = 0;
    cp_async_wait<1>();
    __syncthreads();

    {  // scores
      const int g = warp & 1, key_group = warp >> 1, i = lane >> 3;
      const Element* kb = k_s + buffer * kRoutingKeys * kRow;
      float d[2][4] = {};
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        std::uint32_t a[4], b[4];
        ldmatrix_x4(a, q_s + (g * 16 + (i & 1) * 8 + (lane & 7)) * kRow + ks * 16 + (i >> 1) * 8);
        ldmatrix_x4(b, kb + (key_group * 16 + (i >> 1) * 8 + (lane & 7)) * kRow + ks * 16 + (i & 1) * 8);
        mma_16x8x16<Element>(d[0], a, b[0], b[1]);
        mma_16x8x16<Element>(d[1], a, b[2], b[3]);
      }
      const int r0 = g * 16 + (lane >> 2), c0 = key_group * 16 + 2 * (lane & 3);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        *reinterpret_cast<float2*>(s_s + r0 * kSRow + c0 + n * 8) =
            make_float2(d[n][0] * p.scale_log2, d[n][1] * p.scale_log2);
        *reinterpret_cast<float2*>(s_s + (r0 + 8) * kSRow + c0 + n * 8) =
            make_float2(d[n][2] * p.scale_log2, d[n][3] * p.scale_log2);
      }
    }
    __syncthreads();

    {  // online softmax, per output
      const float4 lo = *reinterpret_cast<const float4*>(s_s + row * kSRow + sub * 8);
      const float4 hi = *reinterpret_cast<const float4*>(s_s + row * kSRow + sub * 8 + 4);
      const float s[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      const int tile_keys = int(min(std::int64_t(kRoutingKeys), key_end - k0));
      unsigned valid = 0;
      bool bad = false;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (sub * 8 + j < tile_keys) {
          valid |= 1u << j;
          bad = bad || !isfinite(s[j]);
        }
      if (bad) bad_s[row] = 1;  // every writer stores the same value
#pragma unroll
      for (int o = 0; o < kRoutingOutputs; ++o) {
        if (o >= outputs) break;
        const int state = o * kRoutingRows + row;
        unsigned allowed = valid;
        bool skip = false;
        if (o > 0) {
          const PredicateMask mask = candidate_mask(p, o - 1);
          const int row_code = row_code_s[(o - 1) * kRoutingRows + row];
          const MaskToken row_token{row_code < 0, row_code};
          allowed = 0;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const int code = code_s[(o - 1) * kRoutingKeys + sub * 8 + j];
            if (mask_allows(mask, row_token, MaskToken{code < 0, code})) allowed |= 1u << j;
          }
          allowed &= valid;
          // A sparse candidate allows no key of this tile to most rows: then the
          // warp's four rows keep their state (factor 1, P = 0) without the
          // exponentials and the shuffle chains (a warp-uniform branch).
          skip = kSkipIdleCandidates && !__any_sync(kFullMask, allowed != 0);
        }
        if (skip) {
          *reinterpret_cast<uint4*>(p_s + state * kPRow + sub * 8) = make_uint4(0, 0, 0, 0);
          if (sub == 0) alpha_s[state] = 1.f;
        } else {
          const float m_old = max_s[state], z_old = sum_s[state];
          const int kept_old = kept_s[state];
          float tile_max = -INFINITY;
#pragma unroll
          for (int j = 0; j < 8; ++j)
            if (allowed >> j & 1u) tile_max = fmaxf(tile_max, s[j]);
          const float m_new = fmaxf(m_old, row_max(tile_max));
          const float alpha = m_new == -INFINITY ? 1.f : fast_exp2(m_old - m_new);
          std::uint32_t packed[4];
          float sum = 0.f;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float p0 = (allowed >> (2 * j) & 1u) ? fast_exp2(s[2 * j] - m_new) : 0.f;
            const float p1 = (allowed >> (2 * j + 1) & 1u) ? fast_exp2(s[2 * j + 1] - m_new) : 0.f;
            packed[j] = pack_pair<Element>(p0, p1);
            sum += pair_sum<Element>(packed[j]);
          }
          *reinterpret_cast<uint4*>(p_s + state * kPRow + sub * 8) =
              make_uint4(packed[0], packed[1], packed[2], packed[3]);
          const int count = row_sum(__popc(allowed));
          const float z_new = z_old * alpha + row_sum(sum);
          __syncwarp();  // every thread of the row has read the old state
          if (sub == 0) {
            max_s[state] = m_new;
            sum_s[state] = z_new;
            kept_s[state] = kept_old + count;
            alpha_s[state] = alpha;
            if (count > 0) atomicOr(any_s + o * 2 + row / 16, 1);
          }
        }
      }
    }
    __syncthreads();

    if (pv_output < outputs && any_s[pv_output * 2 + pv_group] != 0) {  // P.V
      const float alpha_lo = alpha_s[pv_output * kRoutingRows + pv_group * 16 + (lane >> 2)];
      const float alpha_hi = alpha_s[pv_output * kRoutingRows + pv_group * 16 + (lane >> 2) + 8];
#pragma unroll
      for (int n = 0; n < kHeadDim / 8; ++n) {
        acc[n][0] *= alpha_lo;
        acc[n][1] *= alpha_lo;
        acc[n][2] *= alpha_hi;
        acc[n][3] *= alpha_hi;
      }
      const Element* vb = v_s + buffer * kRoutingKeys * kRow;
      const Element* pb = p_s + (pv_output * kRoutingRows + pv_group * 16) * kPRow;
      const int i = lane >> 3;
      auto key_step = [&](int ks) {
        std::uint32_t a[4];
        ldmatrix_x4(a, pb + ((i & 1) * 8 + (lane & 7)) * kPRow + ks * 16 + (i >> 1) * 8);
#pragma unroll
        for (int np = 0; np < kHeadDim / 16; ++np) {
          std::uint32_t b[4];
          ldmatrix_x4_trans(b, vb + (ks * 16 + (i & 1) * 8 + (lane & 7)) * kRow + np * 16 + (i >> 1) * 8);
          mma_16x8x16<Element>(acc[2 * np], a, b[0], b[1]);
          mma_16x8x16<Element>(acc[2 * np + 1], a, b[2], b[3]);
        }
      };
      if constexpr (kHeadDim == 112) {  // fully unrolled, ptxas spills this one size on sm_90a
#pragma unroll 1
        for (int ks = 0; ks < kRoutingKeys / 16; ++ks) key_step(ks);
      } else {
#pragma unroll
        for (int ks = 0; ks < kRoutingKeys / 16; ++ks) key_step(ks);
      }
    }
    __syncthreads();  // the next tile overwrites codes, flags, P and the other K/V buffer
  }

  const std::int64_t slot0 =
      ((std::int64_t(head_index) * p.row_blocks + row_block) * p.splits + split) * kRoutingOutputs;
  const int poisoned = bad_s[row];  // the loop's last __syncthreads ordered every store
  if (sub == 0) {
#pragma unroll
    for (int o = 0; o < kRoutingOutputs; ++o) {
      if (o >= outputs) break;
      const std::int64_t at = (slot0 + o) * kRoutingRows + row;
      const int state = o * kRoutingRows + row;
      p.part_max[at] = poisoned != 0 ? NAN : max_s[state];
      p.part_sum[at] = sum_s[state];
      p.part_kept[at] = kept_s[state];
    }
  }
  if (pv_output < outputs) {
    const int r0 = pv_group * 16 + (lane >> 2);
    float* out = p.part_acc + ((slot0 + pv_output) * kRoutingRows + r0) * kHeadDim + 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) {
      *reinterpret_cast<float2*>(out + n * 8) = make_float2(acc[n][0], acc[n][1]);
      *reinterpret_cast<float2*>(out + 8 * kHeadDim + n * 8) = make_float2(acc[n][2], acc[n][3]);
    }
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
  if (tid < outputs) {
    float top = -INFINITY;
    bool nan = false;
    for (int s = 0; s < p.splits; ++s) {
      const float x = p.part_max[at(s, tid)];
      nan = nan || isnan(x);
      top = fmaxf(top, x);
    }
    float total = 0.f;
    for (int s = 0; s < p.splits; ++s) {
      const float x = p.part_max[at(s, tid)];
      const float f = x == -INFINITY ? 0.f : exp2f(x - top);
      factor_s[tid * p.splits + s] = f;
      total += f * p.part_sum[at(s, tid)];
    }
    z_s[tid] = total;
    if (nan) atomicOr(&poisoned_s, 1);  // several lanes may find one: no racing plain stores
  }
  __syncthreads();

  double stats[kRoutingStats] = {};
  for (int d = tid; d < p.head_dim; d += kCombineThreads) {
    float o_out[kRoutingOutputs] = {};
#pragma unroll
    for (int o = 0; o < kRoutingOutputs; ++o) {
      if (o >= outputs) break;
      float sum = 0.f;
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
  if (tid == 0)
    for (int c = 0; c < p.candidates; ++c)
      for (int s = 0; s < p.splits; ++s) stats[kRoutingStats - 1] += double(p.part_kept[at(s, c + 1)]);
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
    for (int r = 0; r < rows; ++r) x += p.row_stats[(std::int64_t(head_index) * rows + r) * kRoutingStats + stat];
    p.head_stats[i] = x;
  }
}

template <class Element, int kHeadDim>
void launch_partials(const RoutingParams& p, cudaStream_t stream) {
  constexpr int bytes = SharedLayout<kHeadDim>::bytes;
  auto kernel = routing_partials<Element, kHeadDim>;
  STSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  kernel<<<dim3(unsigned(p.splits) * unsigned(p.row_blocks), unsigned(p.head_count)), kRoutingThreads, bytes,
           stream>>>(p);
  STSA_CUDA_CHECK(cudaGetLastError());
}

template <class Element>
void launch_partials_for(const RoutingParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 16: return launch_partials<Element, 16>(p, stream);
    case 32: return launch_partials<Element, 32>(p, stream);
    case 48: return launch_partials<Element, 48>(p, stream);
    case 64: return launch_partials<Element, 64>(p, stream);
    case 80: return launch_partials<Element, 80>(p, stream);
    case 96: return launch_partials<Element, 96>(p, stream);
    case 112: return launch_partials<Element, 112>(p, stream);
    case 128: return launch_partials<Element, 128>(p, stream);
    default: break;
  }
  throw Unsupported(detail::concat("routing kernels: head dim ", p.head_dim, " is not built"));
}

}  // namespace

bool routing_head_dim_supported(int head_dim) { return head_dim >= 16 && head_dim <= 128 && head_dim % 16 == 0; }

int routing_shared_bytes(int head_dim) {
  switch (head_dim) {
    case 16: return SharedLayout<16>::bytes;
    case 32: return SharedLayout<32>::bytes;
    case 48: return SharedLayout<48>::bytes;
    case 64: return SharedLayout<64>::bytes;
    case 80: return SharedLayout<80>::bytes;
    case 96: return SharedLayout<96>::bytes;
    case 112: return SharedLayout<112>::bytes;
    case 128: return SharedLayout<128>::bytes;
    default: return 0;
  }
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
