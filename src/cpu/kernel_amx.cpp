// The attention kernel for bf16 Q, K, V on CPUs with AMX (built with the flags
// src/cpu/CMakeLists.txt gives *_amx.cpp): S = Q K^T and O += P V are tile
// products (TDPBF16PS: bf16 pairs, products exact, sums in fp32); masking and
// the online softmax are kernel_impl.hpp's AVX-512 code. fp16 Q, K, V arrive as
// two bf16 parts each (split_f16_amx.cpp), high + low = the value exactly: S is
// the sum of all four products of the parts, so it is what fp32 FMAs on the
// values give up to the order of the sums.
//
// P is fp32 after the softmax; the tile product takes it as bf16 parts, each
// multiplied with V, as many as the output's precision asks for. fp32 outputs:
// three parts, hi + mid + lo = P exactly (8 + 8 + 8 significand bits): every
// product stays exact and every sum fp32, so this kernel has the fp32-P kernel's
// error bound at three times the P V tile work. bf16 inputs with a bf16 output:
// one part, P rounded to nearest bf16 (up to 2^-9 of each term, unbiased), which
// is what bf16 FlashAttention kernels and PyTorch's CPU attention do, and gives
// their error. Other 16-bit outputs (fp16, which rounds to 2^-11, or fp16 inputs):
// two parts, hi + mid with mid rounded to nearest, each P within 2^-16 of itself.
#include "cpu/intrinsics.hpp"

#include <cstring>

#include "cpu/kernel.hpp"

namespace stsa::cpu {
namespace {

#include "cpu/amx_tiles.hpp"
#include "cpu/split_parts_avx512.hpp"
#include "cpu/vec_avx512.hpp"
// After Vec and the register budget, which it is written against:
#include "cpu/kernel_impl.hpp"

constexpr int kBlockRows = 32;  // query rows per block: two tiles
static_assert(kAmxPartRows == 3 * kBlockRows * kAmxKeyTilesPerStep &&
              kAmxScratchRows == kBlockRows * kAmxKeyTilesPerStep && kAmxKeyTilesPerStep == 2 && kAmxRowPad == 16);

// S[16 * kRowTiles][cols] = Q K^T for one block from kInParts parts of each
// value (1: bf16; 2: fp16 as high + low, all four products, each exact);
// q: bf16 pairs, kInParts * kD / 2 per row (part a at a * kD / 2); kt: the key
// tile's pairs [kInParts][kD / 2][tile_k]; s: row stride s_stride.
template <int kD, int kRowTiles, int kInParts>
void qk_tiles(const std::uint32_t* q, const std::uint32_t* kt, int tile_k, int cols, float* s, int s_stride) {
  constexpr long kQRowWords = kInParts * kD / 2;
  const long kt_bytes = long(tile_k) * 4;
  const std::int64_t k_part = std::int64_t(kD / 2) * tile_k;
  for (int n0 = 0; n0 < cols; n0 += 32) {
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (kRowTiles == 2) {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int p0 = 0; p0 < kD / 2; p0 += 16)    // 16 pairs: 32 channels per product
      for (int b = kInParts - 1; b >= 0; --b) {  // smallest parts first
        const std::uint32_t* k_at = kt + b * k_part + std::int64_t(p0) * tile_k + n0;
        _tile_loadd(6, k_at, kt_bytes);
        _tile_loadd(7, k_at + 16, kt_bytes);
        for (int a = kInParts - 1; a >= 0; --a) {
          const std::uint32_t* q_at = q + a * (kD / 2) + p0;
          _tile_loadd(4, q_at, kQRowWords * 4);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          if constexpr (kRowTiles == 2) {
            _tile_loadd(5, q_at + 16 * kQRowWords, kQRowWords * 4);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          }
        }
      }
    store_accumulators<kRowTiles>(s + n0, s_stride);
  }
}

// The same S from split fp16 values (2 parts) by fp32 FMAs on each value
// (high + low, exact; Inf and NaN have a low part of 0, so they stay themselves):
// for blocks with an Inf or NaN in Q or K, where IEEE's rules must hold
// (QueryTileJob::qk_nonfinite). Rare, so plain rather than fast.
template <int kD, int kRowTiles>
void qk_from_values(const std::uint32_t* q, const std::uint32_t* kt, int tile_k, int cols, float* s, int s_stride) {
  const std::int64_t k_part = std::int64_t(kD / 2) * tile_k;
  const __m512i upper = _mm512_set1_epi32(int(0xffff0000u));
  const auto even = [](__m512i pairs) { return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)); };
  const auto odd = [&](__m512i pairs) { return _mm512_castsi512_ps(_mm512_and_si512(pairs, upper)); };
  const auto value = [](std::uint32_t bits) {
    float x;
    std::memcpy(&x, &bits, 4);
    return x;
  };
  for (int r = 0; r < 16 * kRowTiles; ++r) {
    const std::uint32_t* q_row = q + std::int64_t(r) * kD;
    for (int c = 0; c < cols; c += 16) {
      __m512 acc = _mm512_setzero_ps();
      for (int i = 0; i < kD / 2; ++i) {
        const std::uint32_t qh = q_row[i], ql = q_row[kD / 2 + i];
        const float q_even = value(qh << 16) + value(ql << 16);
        const float q_odd = value(qh & 0xffff0000u) + value(ql & 0xffff0000u);
        const __m512i kh = _mm512_loadu_si512(kt + std::int64_t(i) * tile_k + c);
        const __m512i kl = _mm512_loadu_si512(kt + k_part + std::int64_t(i) * tile_k + c);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(q_even), _mm512_add_ps(even(kh), even(kl)), acc);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(q_odd), _mm512_add_ps(odd(kh), odd(kl)), acc);
      }
      _mm512_storeu_ps(s + std::int64_t(r) * s_stride + c, acc);
    }
  }
}

// O[16 * kRowTiles][kD] += (sum of the kParts parts of P) (sum of the kVParts
// parts of V) over `keys` keys: up to tile_k from v[0], the rest from v[1]; v[t]:
// a key tile's pairs [kVParts][tile_k / 2][kD]; P's parts row stride p_stride;
// o: row stride kD. Part j of P is below 2^-7j of P and part b
// of V below 2^-9b of V, so products with j + b >= kParts are left out, as the
// split of P leaves out as much: with two parts of P, the one below 2^-16 of
// the term; with three, the one below 2^-24.
template <int kD, int kRowTiles, int kParts, int kVParts>
void pv_tiles(const std::uint16_t* parts, int p_stride, const std::uint32_t* const* v, int tile_k, int keys,
              float* o) {
  constexpr long kVBytes = kD * 4;
  const long p_bytes = long(p_stride) * 2;
  const std::int64_t part = std::int64_t(kBlockRows) * p_stride;
  const std::int64_t v_part = std::int64_t(tile_k / 2) * kD;
  for (int d0 = 0; d0 < kD; d0 += 32) {
    load_accumulators<kRowTiles>(o + d0, kD);
    for (int c = 0; c < keys; c += 32)
      for (int b = kVParts - 1; b >= 0; --b) {  // smallest parts first
        const int t = c >= tile_k;           // the key's tile: v[0] or v[1]
        const int c_in_tile = c - t * tile_k;
        const std::uint32_t* v_at = v[t] + b * v_part + std::int64_t(c_in_tile / 2) * kD + d0;
        _tile_loadd(6, v_at, kVBytes);
        _tile_loadd(7, v_at + 16, kVBytes);
        for (int j = kParts - 1; j >= 0; --j) {
          if (j + b >= kParts) continue;
          const std::uint16_t* a = parts + j * part + c;
          _tile_loadd(4, a, p_bytes);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          if constexpr (kRowTiles == 2) {
            _tile_loadd(5, a + 16 * p_stride, p_bytes);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          }
        }
      }
    store_accumulators<kRowTiles>(o + d0, kD);
  }
}

// One step for one block of rows (kRowTiles * 16 rows from row r0, `rows` of them
// real) against `count` listed key tiles side by side in S: one, or two full ones
// (neither ragged) at once (attend_tiles says why).
template <int kD, int kRowTiles>
void block_tiles(const QueryTileJob& job, int r0, int rows, const std::int32_t* tiles, int count,
                 const std::uint64_t* mask, int valid_cols, bool partial) {
  const int tile_k = job.tile_k;
  const int s_stride = count * tile_k;
  const bool masked = partial || valid_cols < tile_k;
  const std::uint64_t* block_mask = mask ? mask + std::int64_t(r0) * job.mask_words : nullptr;
  // Columns [begin, begin + cols) of a single tile (K and V are zero past the
  // sequence, which ends `valid` columns in).
  int begin = 0, cols = (valid_cols + 31) / 32 * 32;
  if (partial && !narrow_to_allowed(block_mask, job.mask_words, rows, valid_cols, 32, begin, cols)) return;
  const int step_cols = (count - 1) * tile_k + cols;
  const int valid = (count - 1) * tile_k + valid_cols - begin;
  float* o = job.o + std::int64_t(r0) * kD;
  float* s = job.scratch + begin;
  const int in_parts = job.input_parts;
  const std::uint32_t* q = job.q_pairs + std::int64_t(r0) * in_parts * (kD / 2);
  for (int t = 0; t < count; ++t) {
    const std::uint32_t* kt = job.kv.kt_pairs + std::int64_t(tiles[t]) * in_parts * (kD / 2) * tile_k + begin;
    float* at = s + t * tile_k;
    if (in_parts == 1)
      qk_tiles<kD, kRowTiles, 1>(q, kt, tile_k, cols, at, s_stride);
    else if (job.qk_nonfinite)
      qk_from_values<kD, kRowTiles>(q, kt, tile_k, cols, at, s_stride);
    else
      qk_tiles<kD, kRowTiles, 2>(q, kt, tile_k, cols, at, s_stride);
  }
  softmax_block<kD>(masked, s, s_stride, rows, step_cols, valid, block_mask, job.mask_words, job.exp_scale,
                    job.m + r0, job.l + r0, o);
  if (job.kv.v_nonfinite || job.kv.v_tiny) {  // (one tile at a time: attend_tiles)
    // 0 x Inf would be NaN in a tile product (and a zero part of P meets every
    // V), and tiny V would be flushed (KvPanels::v_tiny), so the fp32 P V runs,
    // skipping masked columns in partial tiles.
    const float* v = job.kv.v + (std::int64_t(tiles[0]) * tile_k + begin) * kD;
    const int keys = valid < cols ? valid : cols;
    if (partial)
      pv_rows_skipping_masked<kD>(s, s_stride, rows, v, keys, o, block_mask, job.mask_words);
    else
      pv_rows<kD, PvShape<kD>::kRows>(s, s_stride, rows, v, keys, o);
    return;
  }
  // Padding rows (zero Q) are split and multiplied too: a tile product keeps rows
  // apart, and their O rows are never stored.
  const std::uint32_t* v_pairs[kAmxKeyTilesPerStep];
  for (int t = 0; t < count; ++t)
    v_pairs[t] = job.kv.v_pairs + std::int64_t(tiles[t]) * in_parts * (tile_k / 2) * kD + begin / 2 * kD;
  std::uint16_t* p_parts = job.p_parts + begin;
  const std::int64_t part_stride = std::int64_t(kBlockRows) * s_stride;
  if (job.p_part_count == 1) {  // (bf16 inputs only)
    split_into_parts<1>(s, kRowTiles * 16, step_cols, s_stride, part_stride, p_parts);
    pv_tiles<kD, kRowTiles, 1, 1>(p_parts, s_stride, v_pairs, tile_k, step_cols, o);
  } else if (job.p_part_count == 2) {
    split_into_parts<2>(s, kRowTiles * 16, step_cols, s_stride, part_stride, p_parts);
    if (in_parts == 1)
      pv_tiles<kD, kRowTiles, 2, 1>(p_parts, s_stride, v_pairs, tile_k, step_cols, o);
    else
      pv_tiles<kD, kRowTiles, 2, 2>(p_parts, s_stride, v_pairs, tile_k, step_cols, o);
  } else {
    split_into_parts<3>(s, kRowTiles * 16, step_cols, s_stride, part_stride, p_parts);
    if (in_parts == 1)
      pv_tiles<kD, kRowTiles, 3, 1>(p_parts, s_stride, v_pairs, tile_k, step_cols, o);
    else
      pv_tiles<kD, kRowTiles, 3, 2>(p_parts, s_stride, v_pairs, tile_k, step_cols, o);
  }
}

template <int kD>
void attend_tiles(const QueryTileJob& job) {
  static_assert(kD % 32 == 0, "tile products take 32 channels at a time");
  const TileConfig config = square_tiles();
  _tile_loadconfig(&config);
  const int padded = (job.rows + kAmxRowPad - 1) / kAmxRowPad * kAmxRowPad;
  for (int i = 0; i < job.rows; ++i) {
    job.m[i] = kNegInf;
    job.l[i] = 0.0f;
  }
  for (std::int64_t i = 0; i < std::int64_t(padded) * kD; ++i) job.o[i] = 0.0f;

  // Full tiles go two at a time (S 256 columns wide for tiles of 128): one softmax
  // row pass and one load and store of O's accumulators per two tiles, not per
  // tile; with D = 128 those are a large share of a step (measured: key tiles of
  // 256 ran dense 7% faster than 128). Not for heads whose P V runs in fp32.
  const bool pairs = !(job.kv.v_nonfinite || job.kv.v_tiny);
  const auto whole = [&](std::int32_t tile) { return (std::int64_t(tile) + 1) * job.tile_k <= job.tokens; };
  const int n_tiles = job.n_full + job.n_partial;
  for (int n = 0; n < n_tiles;) {
    const bool partial = n >= job.n_full;
    const std::int32_t* tiles = partial ? job.partial + (n - job.n_full) : job.full + n;
    const int count = pairs && n + 1 < job.n_full && whole(tiles[0]) && whole(tiles[1]) ? 2 : 1;
    const std::uint64_t* mask = partial ? job.partial_masks[n - job.n_full] : nullptr;
    const std::int64_t c0 = std::int64_t(tiles[0]) * job.tile_k;
    const int valid_cols = int(job.tokens - c0 < job.tile_k ? job.tokens - c0 : job.tile_k);
    for (int r0 = 0; r0 < padded; r0 += kBlockRows) {
      const int rows = job.rows - r0 < kBlockRows ? job.rows - r0 : kBlockRows;
      if (padded - r0 >= kBlockRows)
        block_tiles<kD, 2>(job, r0, rows, tiles, count, mask, valid_cols, partial);
      else
        block_tiles<kD, 1>(job, r0, rows, tiles, count, mask, valid_cols, partial);
    }
    n += count;
  }
  _tile_release();
}

}  // namespace

AttendFn attend_amx(int head_dim) {
  switch (head_dim) {
    case 64:
      return &attend_tiles<64>;
    case 96:
      return &attend_tiles<96>;
    case 128:
      return &attend_tiles<128>;
    default:
      return nullptr;
  }
}

}  // namespace stsa::cpu
