// sampled_chunk's work on AMX tiles, one head at a time. Per sub-chunk of keys:
//   1. K and V packed as bf16 pairs (pack_kv_tile, the attention kernel's
//      packer); S = Q K^T for all sampled rows as tile products, then scaled;
//   2. the online softmax (sampled_weights.hpp) as in sampled_chunk;
//   3. a weight matrix with one row per (sampled row, output): the dense
//      weights, and per candidate mask the same with the keys it forbids set to
//      0 (blocks it does not touch all 0, blocks it takes whole copied), each
//      weight as two bf16 parts; then one tile product per 32 rows x 32
//      channels adds W V to every output's accumulator at once.
// Every output row multiplies every key here, where sampled_chunk skips the
// blocks a mask does not touch: the tile unit does the extra products faster
// than the vector unit would decide which to skip. The normalisers and the
// kept-pair counts are those of sampled_chunk, block by block.
#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "cpu/pack.hpp"
#include "cpu/routing_tiles.hpp"
#include "router/sampled_attention.hpp"
#include "router/sampled_weights.hpp"

namespace stsa::router_detail {
namespace {

constexpr std::int64_t kRowTile = 16;  // rows of a tile product
constexpr std::int64_t kWidth = kKeysPerSubChunk;
constexpr std::int64_t kBlocksPerSubChunk = kWidth / kKeyBlock;
constexpr std::int64_t kKeySteps = kWidth / 32;  // key steps of a tile product per sub-chunk

std::int64_t round_up(std::int64_t x, std::int64_t to) { return (x + to - 1) / to * to; }

}  // namespace

bool tiles_apply(Isa isa, const TensorView& q, const TensorView& k, const TensorView& v) {
  const DType dtype = q.dtype;
  const std::int64_t dim = q.head_dim();
  return isa == Isa::Amx && (dtype == DType::BF16 || dtype == DType::F16) && k.dtype == dtype &&
         v.dtype == dtype && dim % 32 == 0 && dim <= 512;
}

bool sampled_chunk_tiles(const TensorView& q, const TensorView& k, const TensorView& v,
                         std::span<const std::int64_t> heads, float scale, const RowSet& rows,
                         const std::vector<CandidateMask>& masks, std::int64_t chunk, ChunkScratch& sc,
                         std::span<ChunkPartial> out) {
  const std::int64_t n = k.tokens(), dim = k.head_dim(), b = rows.batch;
  const std::int64_t begin = chunk * kKeysPerChunk, end = std::min(n, begin + kKeysPerChunk);
  const std::size_t candidates = masks.size(), outputs = candidates + 1;
  const auto count = std::int64_t(rows.positions.size());
  const int parts = q.dtype == DType::F16 ? 2 : 1;  // split fp16 values: a high and a low bf16 part
  // The weight matrix and the accumulators: one section of row_pad rows per output.
  const std::int64_t row_pad = round_up(std::max<std::int64_t>(count, 1), kRowTile);
  const std::int64_t out_rows = std::int64_t(outputs) * row_pad, row_tiles = out_rows / kRowTile;
  const std::size_t acc_row = outputs * std::size_t(dim);
  const std::int64_t q_row_words = parts * dim / 2, w_part = out_rows * kWidth;
  const std::int64_t kt_words = parts * dim / 2 * kWidth, v_part = kWidth / 2 * dim;

  for (ChunkPartial& o : out) {
    o.max.assign(std::size_t(count), -std::numeric_limits<float>::infinity());
    o.z.assign(std::size_t(count) * outputs, 0.0);
    o.acc.assign(std::size_t(count) * acc_row, 0.f);
    o.kept.assign(candidates, 0);
    o.flops = 0;
  }
  if (count == 0 || begin >= end) return true;

  sc.q_pairs.resize(std::size_t(row_pad * q_row_words));
  sc.kt_pairs.resize(std::size_t(kt_words));
  sc.v_pairs.resize(std::size_t(parts * v_part));
  sc.e.resize(std::size_t(row_pad * kWidth));
  sc.block_sum.resize(std::size_t(count * kBlocksPerSubChunk));
  sc.factor.resize(std::size_t(count));
  sc.masked.resize(std::size_t(kKeyBlock));
  sc.w_parts.resize(std::size_t(2 * w_part));
  sc.acc_tiles.resize(std::size_t(out_rows * dim));
  sc.live.resize(std::size_t(row_tiles * kKeySteps));
  std::uint16_t* const high = sc.w_parts.data();
  std::uint16_t* const low = high + w_part;
  for (std::size_t s = 0; s < outputs; ++s)  // padding rows: weights 0 (their outputs are never read)
    for (std::uint16_t* part : {high, low})
      std::fill(part + (std::int64_t(s) * row_pad + count) * kWidth, part + (std::int64_t(s) + 1) * row_pad * kWidth,
                std::uint16_t{0});
  // Each candidate's section holds the rows in the order of the mask's codes, so
  // that rows of a tile allow nearby keys and more of a tile's key steps allow
  // none (those products are skipped). sample(s, i): the row at place i of section s.
  sc.order.resize(candidates * std::size_t(count));
  for (std::size_t c = 0; c < candidates; ++c) {
    const auto first = sc.order.begin() + std::ptrdiff_t(c * std::size_t(count));
    std::iota(first, first + count, std::int64_t{0});
    const std::vector<std::int32_t>& code = masks[c].code;
    std::stable_sort(first, first + count, [&](std::int64_t x, std::int64_t y) {
      return code[std::size_t(rows.positions[std::size_t(x)])] < code[std::size_t(rows.positions[std::size_t(y)])];
    });
  }
  const auto sample = [&](std::size_t s, std::int64_t i) {
    return s == 0 ? i : sc.order[(s - 1) * std::size_t(count) + std::size_t(i)];
  };
  const cpu::RowSource source{q, k, v};

  for (std::size_t g = 0; g < heads.size(); ++g) {
    const std::int64_t h = heads[g];
    ChunkPartial& o = out[g];
    std::fill(sc.q_pairs.begin(), sc.q_pairs.end(), 0u);
    for (std::int64_t r = 0; r < count; ++r) {
      std::uint32_t* row = sc.q_pairs.data() + r * q_row_words;
      if (parts == 1)
        cpu::load_row_pairs(q, b, rows.positions[std::size_t(r)], h, false, row);
      else  // (an Inf or NaN gives a non-finite score, which is all the router asks of it)
        cpu::load_row_split_pairs(q, b, rows.positions[std::size_t(r)], h, false, row);
    }
    std::fill(sc.acc_tiles.begin(), sc.acc_tiles.end(), 0.f);

    for (std::int64_t s0 = begin; s0 < end; s0 += kWidth) {
      const std::int64_t len = std::min(kWidth, end - s0), blocks = (len + kKeyBlock - 1) / kKeyBlock;
      const int keys = int(round_up(len, 32));
      // Sub-chunks start at multiples of kWidth, so this is key tile s0 / kWidth of width kWidth (zero past the end).
      const cpu::KvFlags flags = cpu::pack_kv_tile(source, b, h, s0 / kWidth, int(kWidth), nullptr, nullptr,
                                                   sc.kt_pairs.data(), sc.v_pairs.data());
      if (flags.tiny) return false;

      float* const scores = sc.e.data();
      cpu::routing_scores_amx(sc.q_pairs.data(), sc.kt_pairs.data(), int(kWidth), int(row_pad), keys, int(dim), parts,
                              scores, int(kWidth));
      softmax_sub_chunk(scores, kWidth, count, len, kWidth, scale, o.max.data(), sc.factor.data(),
                        sc.block_sum.data());
      for (std::size_t s = 0; s < outputs; ++s)
        for (std::int64_t i = 0; i < count; ++i) {
          const float factor = sc.factor[std::size_t(sample(s, i))];
          if (factor == 1.f) continue;
          if (s == 0)
            for (std::size_t x = 0; x < outputs; ++x) o.z[std::size_t(i) * outputs + x] *= double(factor);
          float* acc = sc.acc_tiles.data() + (std::int64_t(s) * row_pad + i) * dim;
          for (std::int64_t d = 0; d < dim; ++d) acc[d] *= factor;
        }
      o.flops += 2.0 * double(count) * double(len) * double(dim);

      std::fill(sc.live.begin(), sc.live.end(), std::uint8_t{0});
      for (std::int64_t t = 0; t < row_pad / kRowTile; ++t)  // the dense section: every key step
        std::fill_n(sc.live.begin() + t * kKeySteps, keys / 32, std::uint8_t{1});
      for (std::int64_t r = 0; r < count; ++r) {
        cpu::split_weights_amx(scores + r * kWidth, int(blocks * kKeyBlock), high + r * kWidth, low + r * kWidth);
        double* z = o.z.data() + std::size_t(r) * outputs;
        for (std::int64_t blk = 0; blk < blocks; ++blk) z[0] += sc.block_sum[std::size_t(r * kBlocksPerSubChunk + blk)];
      }
      for (std::size_t c = 0; c < candidates; ++c) {
        const CandidateMask& mask = masks[c];
        for (std::int64_t i = 0; i < count; ++i) {
          const std::int64_t r = sample(c + 1, i), qpos = rows.positions[std::size_t(r)];
          const float* weights = scores + r * kWidth;
          const double* sums = sc.block_sum.data() + r * kBlocksPerSubChunk;
          double& z = o.z[std::size_t(r) * outputs + c + 1];
          const std::int64_t place = (std::int64_t(c) + 1) * row_pad + i, row_at = place * kWidth;
          std::uint8_t* live = sc.live.data() + place / kRowTile * kKeySteps;
          for (std::int64_t blk = 0; blk < blocks; ++blk) {
            const std::int64_t k0 = s0 + blk * kKeyBlock, block_len = std::min(kKeyBlock, s0 + len - k0);
            const std::int64_t col = blk * kKeyBlock, at = row_at + col;
            switch (mask.cover(qpos, k0 / kKeyBlock)) {
              case CandidateMask::Cover::None:
                std::fill_n(high + at, kKeyBlock, std::uint16_t{0});
                std::fill_n(low + at, kKeyBlock, std::uint16_t{0});
                break;
              case CandidateMask::Cover::All:
                std::copy_n(high + r * kWidth + col, kKeyBlock, high + at);
                std::copy_n(low + r * kWidth + col, kKeyBlock, low + at);
                o.kept[c] += block_len;
                z += sums[blk];
                live[2 * blk] = live[2 * blk + 1] = 1;
                break;
              case CandidateMask::Cover::Some: {
                const std::int64_t allowed = masked_weights(
                    weights + col, mask.code.data() + k0, mask.forced.data() + k0, mask.code[std::size_t(qpos)],
                    mask.forced[std::size_t(qpos)] != 0, mask.width, block_len, sc.masked.data());
                o.kept[c] += allowed;
                if (allowed > 0) {
                  z += block_sum(sc.masked.data());
                  live[2 * blk] = live[2 * blk + 1] = 1;
                }
                cpu::split_weights_amx(sc.masked.data(), int(kKeyBlock), high + at, low + at);
                break;
              }
            }
          }
        }
      }
      cpu::routing_weighted_sums_amx(high, w_part, 2, int(kWidth), sc.v_pairs.data(), v_part, parts, int(out_rows),
                                     keys, int(dim), sc.live.data(), int(kKeySteps), sc.acc_tiles.data(), int(dim));
    }
    for (std::size_t s = 0; s < outputs; ++s)
      for (std::int64_t i = 0; i < count; ++i)
        std::copy_n(sc.acc_tiles.data() + (std::int64_t(s) * row_pad + i) * dim, dim,
                    o.acc.data() + (std::size_t(sample(s, i)) * outputs + s) * std::size_t(dim));
    for (std::size_t c = 0; c < candidates; ++c) o.flops += 2.0 * double(o.kept[c]) * double(dim);
    o.flops += 2.0 * double(count) * double(end - begin) * double(dim);
  }
  return true;
}

}  // namespace stsa::router_detail
