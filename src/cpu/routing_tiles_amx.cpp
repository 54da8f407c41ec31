// routing_tiles.hpp's tile products (built with the flags src/cpu/CMakeLists.txt
// gives *_amx.cpp). Blocks of 32 rows x 32 columns in accumulator tiles 0-3,
// left operands in 4-5, right operands in 6-7 (amx_tiles.hpp); a last block of
// 16 rows uses tiles 0-1 only.
#include "cpu/intrinsics.hpp"

#include "cpu/routing_tiles.hpp"

namespace stsa::cpu {
namespace {

#include "cpu/amx_tiles.hpp"
#include "cpu/split_parts_avx512.hpp"

static_assert(kRoutingPanelKeys == 32, "a panel's keys are one step of two 16-column tiles");

// With K's pairs in tiles 6 and 7: one or two row tiles of Q's pairs (rows
// `q` and `q + 16 * row_words`) multiplied with both.
void q_products(const std::uint32_t* q, long row_words, bool two_row_tiles) {
  _tile_loadd(4, q, row_words * 4);
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  if (two_row_tiles) {
    _tile_loadd(5, q + 16 * row_words, row_words * 4);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}

}  // namespace

void routing_scores_amx(const std::uint32_t* q, const std::uint32_t* kt, int rows, int keys, int head_dim, int parts,
                        float* s, int s_stride) {
  const TileConfig config = square_tiles();
  _tile_loadconfig(&config);
  const long q_row_words = long(parts) * head_dim / 2;
  const std::int64_t k_part = std::int64_t(head_dim / 2) * kRoutingPanelKeys, k_tile = parts * k_part;
  for (int r0 = 0; r0 < rows; r0 += 32) {
    const bool two = rows - r0 >= 32;
    const std::uint32_t* q_rows = q + std::int64_t(r0) * q_row_words;
    for (int n0 = 0; n0 < keys; n0 += kRoutingPanelKeys) {
      const std::uint32_t* k_panel = kt + std::int64_t(n0 / kRoutingPanelKeys) * k_tile;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int p0 = 0; p0 < head_dim / 2; p0 += 16)  // 16 pairs: 32 channels per product
        for (int b = parts - 1; b >= 0; --b) {        // smallest parts first
          const std::uint32_t* k_at = k_panel + b * k_part + std::int64_t(p0) * kRoutingPanelKeys;
          _tile_loadd(6, k_at, kRoutingPanelKeys * 4);
          _tile_loadd(7, k_at + 16, kRoutingPanelKeys * 4);
          for (int a = parts - 1; a >= 0; --a) q_products(q_rows + a * (head_dim / 2) + p0, q_row_words, two);
        }
      float* at = s + std::int64_t(r0) * s_stride + n0;
      if (two)
        store_accumulators<2>(at, s_stride);
      else
        store_accumulators<1>(at, s_stride);
    }
  }
  _tile_release();
}

void routing_weighted_sums_amx(const std::uint16_t* w, std::int64_t w_part_stride, int w_parts, int w_stride,
                               const std::uint32_t* v, int v_parts, int rows, int keys, int head_dim,
                               const std::uint8_t* live, int live_stride, float* acc, int acc_stride) {
  const TileConfig config = square_tiles();
  _tile_loadconfig(&config);
  const int terms = w_parts > v_parts ? w_parts : v_parts;
  const std::int64_t v_part = std::int64_t(kRoutingPanelKeys / 2) * head_dim, v_tile = v_parts * v_part;
  for (int r0 = 0; r0 < rows; r0 += 32) {
    const bool two = rows - r0 >= 32;
    const std::uint8_t* live_first = live + std::int64_t(r0 / 16) * live_stride;
    const std::uint8_t* live_second = two ? live_first + live_stride : nullptr;
    for (int d0 = 0; d0 < head_dim; d0 += 32) {
      float* out = acc + std::int64_t(r0) * acc_stride + d0;
      if (two)
        load_accumulators<2>(out, acc_stride);
      else
        load_accumulators<1>(out, acc_stride);
      for (int c = 0; c < keys; c += 32) {
        const bool first_live = live_first[c / 32] != 0, second_live = two && live_second[c / 32] != 0;
        if (!first_live && !second_live) continue;
        for (int b = v_parts - 1; b >= 0; --b) {  // smallest parts first
          const std::uint32_t* v_at = v + std::int64_t(c / kRoutingPanelKeys) * v_tile + b * v_part + d0;
          _tile_loadd(6, v_at, long(head_dim) * 4);
          _tile_loadd(7, v_at + 16, long(head_dim) * 4);
          for (int p = w_parts - 1; p >= 0; --p) {
            if (p + b >= terms) continue;
            const std::uint16_t* left = w + p * w_part_stride + std::int64_t(r0) * w_stride + c;
            if (first_live) {
              _tile_loadd(4, left, long(w_stride) * 2);
              _tile_dpbf16ps(0, 4, 6);
              _tile_dpbf16ps(1, 4, 7);
            }
            if (second_live) {
              _tile_loadd(5, left + 16 * w_stride, long(w_stride) * 2);
              _tile_dpbf16ps(2, 5, 6);
              _tile_dpbf16ps(3, 5, 7);
            }
          }
        }
      }
      if (two)
        store_accumulators<2>(out, acc_stride);
      else
        store_accumulators<1>(out, acc_stride);
    }
  }
  _tile_release();
}

void split_weights_amx(const float* w, int rows, int cols, int stride, std::int64_t part_stride,
                       std::uint16_t* parts) {
  split_into_parts<2>(w, rows, cols, stride, part_stride, parts);
}

}  // namespace stsa::cpu
