// Per key chunk, two passes shared by all sampled rows of a batch entry, so that
// each block of K and V is converted once and stays in cache while every row uses it:
//   1. scores s = scale q.k for every sampled row and key of a sub-chunk (an
//      S x 512 buffer per head that stays in L2), then e = exp(s - running max);
//   2. per key block: O_dense += sum_j e_j v_j for every row and, per candidate
//      mask, the same over the block's allowed keys. Blocks a mask does not touch
//      are skipped and blocks it takes whole reuse the dense weights and sums, so
//      the per-key mask test runs only on boundary blocks. The factor exp(-max)
//      cancels in every ratio, so one exp per pair serves all masks.
// combine_chunks() rescales the chunks to the row's overall maximum (in fp64);
// when a mask's allowed keys sit so far below it that their sum underflows, that
// row is recomputed in fp64 with the mask's own maximum.
#include "router/sampled_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "router/sampled_weights.hpp"
#include "router/vector_clones.hpp"

namespace stsa::router_detail {
namespace {

constexpr std::int64_t kRowBlock = 4;   // sampled rows scored together (reuses each loaded key vector)
constexpr double kUnderflowFloor = 1e-25;

// out[r][j] = sum_d q[r][d] * kt[d][j] for kRowBlock rows and kKeyBlock keys (kt: transposed key block).
STSA_VECTOR_CLONES void score_rows(const float* __restrict q, std::int64_t dim, const float* __restrict kt,
                                   float* __restrict out) {
  float acc[kRowBlock][kKeyBlock] = {};
  for (std::int64_t d = 0; d < dim; ++d) {
    const float* key = kt + d * kKeyBlock;
    for (std::int64_t r = 0; r < kRowBlock; ++r) {
      const float qd = q[r * dim + d];
      for (std::int64_t j = 0; j < kKeyBlock; ++j) acc[r][j] += qd * key[j];
    }
  }
  std::memcpy(out, acc, sizeof(acc));
}

// kt[d][j] = rows[j][d] for a block of kKeyBlock key rows of `dim` channels.
STSA_VECTOR_CLONES void transpose_block(const float* __restrict rows, std::int64_t dim, float* __restrict kt) {
  for (std::int64_t d = 0; d < dim; ++d)
    for (std::int64_t j = 0; j < kKeyBlock; ++j) kt[d * kKeyBlock + j] = rows[j * dim + d];
}

// out[r][d] += sum_j w[r][j] * v[j][d] for kRowBlock weight rows over a block of kKeyBlock keys;
// v rows hold `padded` channels (a multiple of kLane). Each loaded lane of v serves all rows
// (a small GEMM micro-kernel), and the rows are independent accumulation chains: two lanes
// at a time where the row has them, so that 8 chains cover the FMA latency (with one lane, 4
// chains ran at half the FMA rate). Each lane's sums are the same either way.
// A GCC/Clang vector type keeps one lane in a register (plain arrays get split into scalars).
typedef float Lane __attribute__((vector_size(kLane * sizeof(float))));
STSA_VECTOR_CLONES void accumulate_rows(const float* const* __restrict w, const float* __restrict v,
                                        std::int64_t padded, float* const* __restrict out) {
  // (Written out twice rather than through a helper: a helper would not carry the
  // clones' target and would run the vector type in scalar code.)
  std::int64_t d0 = 0;
  for (; d0 + 2 * kLane <= padded; d0 += 2 * kLane) {
    Lane acc[kRowBlock][2] = {};
    for (std::int64_t j = 0; j < kKeyBlock; ++j) {
      Lane first, second;
      std::memcpy(&first, v + j * padded + d0, sizeof(first));
      std::memcpy(&second, v + j * padded + d0 + kLane, sizeof(second));
      for (std::int64_t r = 0; r < kRowBlock; ++r) {
        acc[r][0] += w[r][j] * first;
        acc[r][1] += w[r][j] * second;
      }
    }
    for (std::int64_t r = 0; r < kRowBlock; ++r)
      for (int l = 0; l < 2; ++l) {
        Lane sum;
        std::memcpy(&sum, out[r] + d0 + l * kLane, sizeof(sum));
        sum += acc[r][l];
        std::memcpy(out[r] + d0 + l * kLane, &sum, sizeof(sum));
      }
  }
  for (; d0 < padded; d0 += kLane) {
    Lane acc[kRowBlock] = {};
    for (std::int64_t j = 0; j < kKeyBlock; ++j) {
      Lane row;
      std::memcpy(&row, v + j * padded + d0, sizeof(row));
      for (std::int64_t r = 0; r < kRowBlock; ++r) acc[r] += w[r][j] * row;
    }
    for (std::int64_t r = 0; r < kRowBlock; ++r) {
      Lane sum;
      std::memcpy(&sum, out[r] + d0, sizeof(sum));
      sum += acc[r];
      std::memcpy(out[r] + d0, &sum, sizeof(sum));
    }
  }
}

// out[d] = t[b, n, h, d] as float, with the dtype switch hoisted out of the
// channel loop, and a unit-stride loop of its own for each (they vectorise).
// cpu::load_row does the same with a scale; this one is built as vector
// clones (fp16 rows: 36 ms of routing against 45 with the plain build).
template <typename T, typename Convert>
inline void convert_row(const T* __restrict p, std::int64_t step, std::int64_t dim, float* __restrict out,
                        Convert convert) {
  if (step == 1)
    for (std::int64_t d = 0; d < dim; ++d) out[d] = convert(p[d]);
  else
    for (std::int64_t d = 0; d < dim; ++d) out[d] = convert(p[d * step]);
}

STSA_VECTOR_CLONES void load_row(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h,
                                 float* __restrict out) {
  const std::int64_t dim = t.head_dim(), step = t.stride[3], base = t.offset(b, n, h, 0);
  switch (t.dtype) {
    case DType::F32:
      convert_row(static_cast<const float*>(t.data) + base, step, dim, out, [](float x) { return x; });
      return;
    case DType::BF16:
      convert_row(static_cast<const std::uint16_t*>(t.data) + base, step, dim, out,
                  [](std::uint16_t x) { return bf16_to_float(x); });
      return;
    case DType::F16:
      convert_row(static_cast<const std::uint16_t*>(t.data) + base, step, dim, out,
                  [](std::uint16_t x) { return f16_to_float(x); });
      return;
    case DType::F8E4M3:
      convert_row(static_cast<const std::uint8_t*>(t.data) + base, step, dim, out,
                  [](std::uint8_t x) { return f8e4m3_to_float(x); });
      return;
  }
}

// fp64 output of one row under one mask, with the mask's own maximum (O = 0 when nothing is allowed).
std::vector<double> exact_row(const TensorView& q, const TensorView& k, const TensorView& v, std::int64_t b,
                              std::int64_t h, std::int64_t row, double scale, const CandidateMask& mask) {
  const std::int64_t n = k.tokens(), dim = k.head_dim();
  std::vector<double> s(static_cast<std::size_t>(n), -std::numeric_limits<double>::infinity());
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < n; ++j) {
    if (!mask.allows(row, j)) continue;
    double dot = 0;
    for (std::int64_t d = 0; d < dim; ++d) dot += double(q.load(b, row, h, d)) * double(k.load(b, j, h, d));
    s[std::size_t(j)] = dot * scale;
    m = std::max(m, s[std::size_t(j)]);
  }
  std::vector<double> o(static_cast<std::size_t>(dim), 0.0);
  double z = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    if (!mask.allows(row, j)) continue;
    const double e = std::exp(s[std::size_t(j)] - m);
    z += e;
    for (std::int64_t d = 0; d < dim; ++d) o[std::size_t(d)] += e * double(v.load(b, j, h, d));
  }
  if (z == 0.0) return o;
  for (double& x : o) x /= z;
  return o;
}

}  // namespace

std::int64_t key_chunks(std::int64_t tokens) { return (tokens + kKeysPerChunk - 1) / kKeysPerChunk; }

void sampled_chunk(const TensorView& q, const TensorView& k, const TensorView& v, std::span<const std::int64_t> heads,
                   std::span<const float> scales, const RowSet& rows, const std::vector<CandidateMask>& masks,
                   std::int64_t chunk,
                   ChunkScratch& sc, std::span<ChunkPartial> out) {
  const std::int64_t n = k.tokens(), dim = k.head_dim(), b = rows.batch;
  const std::int64_t padded = partial_dim(dim);
  const std::int64_t begin = chunk * kKeysPerChunk, end = std::min(n, begin + kKeysPerChunk);
  const std::size_t candidates = masks.size(), outputs = candidates + 1;
  const auto count = std::int64_t(rows.positions.size()), group = std::int64_t(heads.size());
  const std::int64_t row_blocks = (count + kRowBlock - 1) / kRowBlock;
  const auto rows_u = std::size_t(count);
  const std::size_t acc_row = outputs * std::size_t(padded);
  constexpr std::int64_t sub_width = kKeysPerSubChunk, sub_blocks = kKeysPerSubChunk / kKeyBlock;

  for (ChunkPartial& o : out) {
    o.max.assign(rows_u, -std::numeric_limits<float>::infinity());
    o.z.assign(rows_u * outputs, 0.0);
    o.acc.assign(rows_u * acc_row, 0.f);
    o.kept.assign(candidates, 0);
    o.flops = 0;
  }
  if (count == 0 || group == 0 || begin >= end) return;

  // Per head g: scaled queries, a transposed key block, a value block, the sub-chunk's
  // weights [rows][sub_width] and their per-block sums.
  const std::size_t qs_head = std::size_t(row_blocks * kRowBlock * dim), kt_head = std::size_t(dim * kKeyBlock),
                    vb_head = std::size_t(padded * kKeyBlock), e_head = rows_u * sub_width,
                    sum_head = rows_u * sub_blocks;
  sc.qs.assign(qs_head * std::size_t(group), 0.f);
  for (std::int64_t g = 0; g < group; ++g) {
    const float scale = scales[std::size_t(heads[std::size_t(g)])];
    for (std::int64_t r = 0; r < count; ++r) {
      float* row = sc.qs.data() + std::size_t(g) * qs_head + std::size_t(r * dim);
      load_row(q, b, rows.positions[std::size_t(r)], heads[std::size_t(g)], row);
      for (std::int64_t d = 0; d < dim; ++d) row[d] *= scale;
    }
  }
  sc.kt.resize(kt_head * std::size_t(group));
  sc.vb.resize(vb_head * std::size_t(group));
  sc.key_rows.resize(kt_head * std::size_t(group));
  sc.tile.resize(std::size_t(kRowBlock * kKeyBlock));
  sc.e.resize(e_head * std::size_t(group));
  sc.block_sum.resize(sum_head * std::size_t(group));
  sc.masked.resize(rows_u * candidates * kKeyBlock);
  sc.zeros.assign(std::size_t(kKeyBlock), 0.f);
  sc.sink.resize(std::size_t(padded));
  sc.factor.resize(rows_u);

  for (std::int64_t s0 = begin; s0 < end; s0 += sub_width) {
    const std::int64_t s1 = std::min(end, s0 + sub_width), blocks = (s1 - s0 + kKeyBlock - 1) / kKeyBlock;

    // Pass 1: scores. Each key row is read once for all heads of the group.
    for (std::int64_t blk = 0; blk < blocks; ++blk) {
      const std::int64_t k0 = s0 + blk * kKeyBlock, len = std::min(kKeyBlock, s1 - k0);
      if (len < kKeyBlock) std::fill(sc.key_rows.begin(), sc.key_rows.end(), 0.f);
      for (std::int64_t j = 0; j < len; ++j)
        for (std::int64_t g = 0; g < group; ++g)
          load_row(k, b, k0 + j, heads[std::size_t(g)], sc.key_rows.data() + std::size_t(g) * kt_head + std::size_t(j * dim));
      for (std::int64_t g = 0; g < group; ++g)
        transpose_block(sc.key_rows.data() + std::size_t(g) * kt_head, dim, sc.kt.data() + std::size_t(g) * kt_head);
      for (std::int64_t g = 0; g < group; ++g)
        for (std::int64_t rb = 0; rb < row_blocks; ++rb) {
          score_rows(sc.qs.data() + std::size_t(g) * qs_head + std::size_t(rb * kRowBlock * dim), dim,
                     sc.kt.data() + std::size_t(g) * kt_head, sc.tile.data());
          for (std::int64_t r = rb * kRowBlock; r < std::min(count, (rb + 1) * kRowBlock); ++r)
            std::copy_n(sc.tile.begin() + (r - rb * kRowBlock) * kKeyBlock, len,
                        sc.e.begin() + std::int64_t(std::size_t(g) * e_head) + r * sub_width + blk * kKeyBlock);
        }
    }

    // Online softmax: weights relative to the running maximum (earlier sums are
    // rescaled when it grows), and their per-block sums (what a mask that takes a
    // block whole adds to its normaliser).
    for (std::int64_t g = 0; g < group; ++g) {
      ChunkPartial& o = out[std::size_t(g)];
      softmax_sub_chunk(sc.e.data() + std::size_t(g) * e_head, sub_width, count, s1 - s0, sub_width, 1.f, o.max.data(),
                        sc.factor.data(), sc.block_sum.data() + std::size_t(g) * sum_head);
      rescale_partial(o, outputs, acc_row, sc.factor.data());
      o.flops += 2.0 * double(count) * double(s1 - s0) * double(dim);
    }

    // Pass 2: weighted sums of V, dense (slot 0) and per mask, plus the masks' normalisers.
    for (std::int64_t blk = 0; blk < blocks; ++blk) {
      const std::int64_t k0 = s0 + blk * kKeyBlock, len = std::min(kKeyBlock, s1 - k0);
      const std::int64_t global_block = k0 / kKeyBlock;
      if (len < kKeyBlock) std::fill(sc.vb.begin(), sc.vb.end(), 0.f);
      for (std::int64_t j = 0; j < len; ++j)
        for (std::int64_t g = 0; g < group; ++g)
          load_row(v, b, k0 + j, heads[std::size_t(g)], sc.vb.data() + std::size_t(g) * vb_head + std::size_t(j * padded));
      for (std::int64_t g = 0; g < group; ++g) {
        ChunkPartial& o = out[std::size_t(g)];
        sc.w_rows.clear();
        sc.o_rows.clear();
        for (std::int64_t r = 0; r < count; ++r) {
          const float* row = sc.e.data() + std::size_t(g) * e_head + std::size_t(r * sub_width + blk * kKeyBlock);
          const double row_sum = sc.block_sum[std::size_t(g) * sum_head + std::size_t(r * sub_blocks + blk)];
          float* acc = o.acc.data() + std::size_t(r) * acc_row;
          double* z = o.z.data() + std::size_t(r) * outputs;
          sc.w_rows.push_back(row);
          sc.o_rows.push_back(acc);
          z[0] += row_sum;
          const std::int64_t qpos = rows.positions[std::size_t(r)];
          for (std::size_t c = 0; c < candidates; ++c) {
            const CandidateMask& mask = masks[c];
            const CandidateMask::Cover cover = mask.cover(qpos, global_block);
            if (cover == CandidateMask::Cover::None) continue;
            const float* w = row;
            if (cover == CandidateMask::Cover::All) {
              o.kept[c] += len;
              z[c + 1] += row_sum;
            } else {
              float* masked = sc.masked.data() + (std::size_t(r) * candidates + c) * kKeyBlock;
              const std::int64_t allowed =
                  masked_weights(row, mask.code.data() + k0, mask.forced.data() + k0, mask.code[std::size_t(qpos)],
                                 mask.forced[std::size_t(qpos)] != 0, mask.width, len, masked);
              if (allowed == 0) continue;
              o.kept[c] += allowed;
              z[c + 1] += block_sum(masked);
              w = masked;
            }
            sc.w_rows.push_back(w);
            sc.o_rows.push_back(acc + (c + 1) * std::size_t(padded));
          }
        }
        while (sc.w_rows.size() % kRowBlock != 0) {
          sc.w_rows.push_back(sc.zeros.data());
          sc.o_rows.push_back(sc.sink.data());
        }
        const float* vb = sc.vb.data() + std::size_t(g) * vb_head;
        for (std::size_t i = 0; i < sc.w_rows.size(); i += kRowBlock)
          accumulate_rows(sc.w_rows.data() + i, vb, padded, sc.o_rows.data() + i);
      }
    }
  }
  for (std::int64_t g = 0; g < group; ++g) {
    ChunkPartial& o = out[std::size_t(g)];
    for (std::size_t c = 0; c < candidates; ++c) o.flops += 2.0 * double(o.kept[c]) * double(dim);
    o.flops += 2.0 * double(count) * double(end - begin) * double(dim);
  }
}

void combine_chunks(const TensorView& q, const TensorView& k, const TensorView& v, std::int64_t head, float scale,
                    double out_scale, const RowSet& rows, const std::vector<CandidateMask>& masks,
                    std::span<const ChunkPartial> chunks, SampledErrors& into) {
  const std::int64_t dim = k.head_dim(), padded = partial_dim(dim);
  const std::size_t candidates = masks.size(), outputs = candidates + 1;
  into.squared_error.resize(candidates, 0.0);
  for (const ChunkPartial& c : chunks) into.flops += c.flops;
  std::vector<double> factor(chunks.size()), o(outputs * std::size_t(dim)), z(outputs);
  for (std::size_t r = 0; r < rows.positions.size(); ++r) {
    // Rescale every chunk to the row's overall maximum (non-finite scores poison the row).
    double top = -std::numeric_limits<double>::infinity();
    bool finite = true;
    for (const ChunkPartial& c : chunks) {
      finite = finite && std::isfinite(c.max[r]);
      top = std::max(top, double(c.max[r]));
    }
    if (!finite) {
      into.squared_reference = std::numeric_limits<double>::quiet_NaN();
      for (double& e : into.squared_error) e = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    for (std::size_t i = 0; i < chunks.size(); ++i) factor[i] = std::exp(double(chunks[i].max[r]) - top);
    std::fill(o.begin(), o.end(), 0.0);
    std::fill(z.begin(), z.end(), 0.0);
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      const ChunkPartial& c = chunks[i];
      for (std::size_t s = 0; s < outputs; ++s) {
        z[s] += factor[i] * c.z[r * outputs + s];
        const float* acc = c.acc.data() + (r * outputs + s) * std::size_t(padded);
        for (std::int64_t d = 0; d < dim; ++d) o[s * std::size_t(dim) + std::size_t(d)] += factor[i] * double(acc[d]);
      }
    }
    for (std::int64_t d = 0; d < dim; ++d)
      into.squared_reference += std::pow(out_scale * (o[std::size_t(d)] / z[0]), 2);
    for (std::size_t c = 0; c < candidates; ++c) {
      const double* oc = o.data() + (c + 1) * std::size_t(dim);
      if (z[c + 1] > kUnderflowFloor || !std::isfinite(z[c + 1])) {
        for (std::int64_t d = 0; d < dim; ++d)
          into.squared_error[c] += std::pow(out_scale * (oc[d] / z[c + 1] - o[std::size_t(d)] / z[0]), 2);
        continue;
      }
      const std::vector<double> exact = exact_row(q, k, v, rows.batch, head, rows.positions[r], scale, masks[c]);
      for (std::int64_t d = 0; d < dim; ++d)
        into.squared_error[c] += std::pow(out_scale * (exact[std::size_t(d)] - o[std::size_t(d)] / z[0]), 2);
    }
  }
}

}  // namespace stsa::router_detail
