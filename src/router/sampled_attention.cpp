// Two passes over the keys of one (batch, head), shared by all sampled rows so
// that each block of K and V is converted once and stays in cache while every
// row uses it:
//   1. scores s = scale q.k for every sampled row and key (an S x N buffer),
//      then e = exp(s - max_dense) in place;
//   2. per key block: O_dense += sum_j e_j v_j for every row and, per candidate
//      mask, the same over the block's allowed keys (blocks a mask does not touch
//      are skipped). The factor exp(-max_dense) cancels in every ratio, so one
//      exp per pair serves all masks; when a mask's allowed keys sit so far below
//      the dense maximum that their sum underflows, that row is recomputed in
//      fp64 with the mask's own maximum.
#include "router/sampled_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__clang__)
#pragma clang fp contract(fast)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast")  // let the multiply-adds below become FMAs
#endif

namespace stsa::router_detail {
namespace {

constexpr std::int64_t kKeyBlock = 64;  // keys per block
constexpr std::int64_t kRowBlock = 4;   // sampled rows scored together (reuses each loaded key vector)
constexpr std::int64_t kLane = 16;      // channels per accumulator (one AVX-512 register)
constexpr double kUnderflowFloor = 1e-25;

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define STSA_VECTOR_CLONES __attribute__((target_clones("avx512f", "fma", "default")))
#else
#define STSA_VECTOR_CLONES
#endif

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

// x[i] = exp(x[i]) for x <= 0 (arguments below -87 give 0): range reduction to
// 2^n * exp(r), |r| <= ln2/2, and a degree-6 polynomial (relative error ~2e-7).
STSA_VECTOR_CLONES void exp_nonpositive(float* __restrict x, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    const float v = std::max(x[i], -87.0f);
    const float n = std::nearbyint(v * 1.44269504088896341f);
    const float r = v - n * 0.693145751953125f - n * 1.42860682030941723212e-6f;
    float p = 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    std::int32_t bits = (std::int32_t(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, 4);
    x[i] = x[i] < -87.0f ? 0.0f : p * scale;
  }
}

// out[r][d] += sum_j w[r][j] * v[j][d] for kRowBlock weight rows over a block of kKeyBlock keys;
// v rows hold `padded` channels (a multiple of kLane). Each loaded lane of v serves all rows
// (a small GEMM micro-kernel), and the rows are independent accumulation chains.
// A GCC/Clang vector type keeps one lane in a register (plain arrays get split into scalars).
typedef float Lane __attribute__((vector_size(kLane * sizeof(float))));
STSA_VECTOR_CLONES void accumulate_rows(const float* const* __restrict w, const float* __restrict v,
                                        std::int64_t padded, float* const* __restrict out) {
  for (std::int64_t d0 = 0; d0 < padded; d0 += kLane) {
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

// w[j] = e[j] where the mask allows (q, k0 + j), else 0; returns how many are allowed.
STSA_VECTOR_CLONES std::int64_t masked_weights(const float* __restrict e, const std::int32_t* __restrict code,
                                               const std::uint8_t* __restrict forced, std::int64_t q_code,
                                               bool q_forced, std::int64_t width, float* __restrict w) {
  std::int64_t kept = 0;
  for (std::int64_t j = 0; j < kKeyBlock; ++j) {
    const std::int64_t diff = std::int64_t(code[j]) - q_code;
    const bool ok = q_forced || forced[j] || (diff <= width && -diff <= width);
    w[j] = ok ? e[j] : 0.f;
    kept += ok;
  }
  return kept;
}

// out[d] = t[b, n, h, d] as float, with the dtype switch hoisted out of the channel loop.
void load_row(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, float* __restrict out) {
  const std::int64_t dim = t.head_dim(), step = t.stride[3], base = t.offset(b, n, h, 0);
  switch (t.dtype) {
    case DType::F32: {
      const float* p = static_cast<const float*>(t.data) + base;
      for (std::int64_t d = 0; d < dim; ++d) out[d] = p[d * step];
      return;
    }
    case DType::BF16: {
      const std::uint16_t* p = static_cast<const std::uint16_t*>(t.data) + base;
      for (std::int64_t d = 0; d < dim; ++d) out[d] = bf16_to_float(p[d * step]);
      return;
    }
    case DType::F16: {
      const std::uint16_t* p = static_cast<const std::uint16_t*>(t.data) + base;
      for (std::int64_t d = 0; d < dim; ++d) out[d] = f16_to_float(p[d * step]);
      return;
    }
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

SampledErrors sampled_errors(const TensorView& q, const TensorView& k, const TensorView& v, std::int64_t head,
                             float scale, const std::vector<std::int64_t>& rows,
                             const std::vector<std::int64_t>& batch, const std::vector<CandidateMask>& masks) {
  const std::int64_t n = k.tokens(), dim = k.head_dim();
  const std::int64_t padded = (dim + kLane - 1) / kLane * kLane;
  const std::int64_t blocks = (n + kKeyBlock - 1) / kKeyBlock, n_padded = blocks * kKeyBlock;
  const std::size_t candidates = masks.size();
  SampledErrors result;
  result.squared_error.assign(candidates, 0.0);

  // Mask codes padded to whole blocks; padding keys are never allowed.
  std::vector<std::vector<std::int32_t>> codes(candidates);
  std::vector<std::vector<std::uint8_t>> forced(candidates);
  for (std::size_t c = 0; c < candidates; ++c) {
    codes[c] = masks[c].code;
    codes[c].resize(std::size_t(n_padded), std::numeric_limits<std::int32_t>::max());
    forced[c] = masks[c].forced;
    forced[c].resize(std::size_t(n_padded), 0);
  }

  std::vector<float> kt(static_cast<std::size_t>(dim * kKeyBlock)), vb(static_cast<std::size_t>(padded * kKeyBlock));
  std::vector<float> key_row(static_cast<std::size_t>(dim));
  std::vector<float> tile(static_cast<std::size_t>(kRowBlock * kKeyBlock));
  for (std::int64_t b = 0; b < k.batch(); ++b) {
    std::vector<std::int64_t> mine;  // sampled rows of this batch entry
    for (std::size_t i = 0; i < rows.size(); ++i)
      if (batch[i] == b) mine.push_back(rows[i]);
    if (mine.empty()) continue;
    const auto count = std::int64_t(mine.size());
    const std::int64_t row_blocks = (count + kRowBlock - 1) / kRowBlock;

    std::vector<float> qs(static_cast<std::size_t>(row_blocks * kRowBlock * dim), 0.f);
    for (std::int64_t r = 0; r < count; ++r)
      for (std::int64_t d = 0; d < dim; ++d)
        qs[std::size_t(r * dim + d)] = q.load(b, mine[std::size_t(r)], head, d) * scale;

    // Pass 1: scores, rows padded to whole blocks of keys (padding scores are -inf).
    std::vector<float> e(static_cast<std::size_t>(count * n_padded), -std::numeric_limits<float>::infinity());
    for (std::int64_t blk = 0; blk < blocks; ++blk) {
      const std::int64_t k0 = blk * kKeyBlock, len = std::min(kKeyBlock, n - k0);
      std::fill(kt.begin(), kt.end(), 0.f);
      for (std::int64_t j = 0; j < len; ++j) {
        load_row(k, b, k0 + j, head, key_row.data());
        for (std::int64_t d = 0; d < dim; ++d) kt[std::size_t(d * kKeyBlock + j)] = key_row[std::size_t(d)];
      }
      for (std::int64_t rb = 0; rb < row_blocks; ++rb) {
        score_rows(qs.data() + rb * kRowBlock * dim, dim, kt.data(), tile.data());
        for (std::int64_t r = rb * kRowBlock; r < std::min(count, (rb + 1) * kRowBlock); ++r)
          std::copy_n(tile.begin() + (r - rb * kRowBlock) * kKeyBlock, len, e.begin() + r * n_padded + k0);
      }
    }
    result.flops += 2.0 * double(count) * double(n) * double(dim);

    std::vector<double> z_dense(static_cast<std::size_t>(count));
    for (std::int64_t r = 0; r < count; ++r) {
      float* row = e.data() + r * n_padded;
      float m = -std::numeric_limits<float>::infinity();
      for (std::int64_t j = 0; j < n; ++j) m = std::max(m, row[j]);
      if (std::isfinite(m)) {
        for (std::int64_t j = 0; j < n_padded; ++j) row[j] -= m;
        exp_nonpositive(row, n_padded);
      } else {
        for (std::int64_t j = 0; j < n_padded; ++j) row[j] = std::numeric_limits<float>::quiet_NaN();
      }
      double z = 0;
      for (std::int64_t j = 0; j < n; ++j) z += row[j];
      z_dense[std::size_t(r)] = z;
    }

    // Pass 2: weighted sums of V, dense (slot 0) and per mask, plus the masks' normalisers.
    const std::size_t outputs = candidates + 1;
    std::vector<float> acc(static_cast<std::size_t>(count) * outputs * std::size_t(padded), 0.f);
    std::vector<double> z_mask(static_cast<std::size_t>(count) * candidates, 0.0);
    std::vector<std::int64_t> kept(candidates, 0);
    // Weight rows of one block: the dense row of every sampled row, then each mask's row where it
    // allows any key of the block; accumulated kRowBlock at a time (padding rows have zero weights).
    std::vector<float> masked(static_cast<std::size_t>(count) * candidates * kKeyBlock);
    const std::vector<float> zeros(static_cast<std::size_t>(kKeyBlock), 0.f);
    std::vector<float> sink(static_cast<std::size_t>(padded));
    std::vector<const float*> w_rows;
    std::vector<float*> o_rows;
    for (std::int64_t blk = 0; blk < blocks; ++blk) {
      const std::int64_t k0 = blk * kKeyBlock, len = std::min(kKeyBlock, n - k0);
      std::fill(vb.begin(), vb.end(), 0.f);
      for (std::int64_t j = 0; j < len; ++j) load_row(v, b, k0 + j, head, vb.data() + j * padded);
      w_rows.clear();
      o_rows.clear();
      for (std::int64_t r = 0; r < count; ++r) {
        const float* row = e.data() + r * n_padded + k0;
        float* out = acc.data() + std::size_t(r) * outputs * std::size_t(padded);
        w_rows.push_back(row);
        o_rows.push_back(out);
        const std::int64_t qpos = mine[std::size_t(r)];
        for (std::size_t c = 0; c < candidates; ++c) {
          float* w = masked.data() + (std::size_t(r) * candidates + c) * kKeyBlock;
          const std::int64_t allowed =
              masked_weights(row, codes[c].data() + k0, forced[c].data() + k0, masks[c].code[std::size_t(qpos)],
                             masks[c].forced[std::size_t(qpos)] != 0, masks[c].width, w);
          if (allowed == 0) continue;
          kept[c] += allowed;
          double z = 0;
          for (std::int64_t j = 0; j < kKeyBlock; ++j) z += w[j];
          z_mask[std::size_t(r) * candidates + c] += z;
          w_rows.push_back(w);
          o_rows.push_back(out + (c + 1) * std::size_t(padded));
        }
      }
      while (w_rows.size() % kRowBlock != 0) {
        w_rows.push_back(zeros.data());
        o_rows.push_back(sink.data());
      }
      for (std::size_t i = 0; i < w_rows.size(); i += kRowBlock)
        accumulate_rows(w_rows.data() + i, vb.data(), padded, o_rows.data() + i);
    }
    for (std::size_t c = 0; c < candidates; ++c) result.flops += 2.0 * double(kept[c]) * double(dim);
    result.flops += 2.0 * double(count) * double(n) * double(dim);

    // Reduce to squared errors.
    for (std::int64_t r = 0; r < count; ++r) {
      const float* out = acc.data() + std::size_t(r) * outputs * std::size_t(padded);
      const double zd = z_dense[std::size_t(r)];
      for (std::int64_t d = 0; d < dim; ++d) result.squared_reference += std::pow(double(out[d]) / zd, 2);
      for (std::size_t c = 0; c < candidates; ++c) {
        const double zc = z_mask[std::size_t(r) * candidates + c];
        const float* oc = out + (c + 1) * std::size_t(padded);
        if (zc > kUnderflowFloor || !std::isfinite(zc)) {
          for (std::int64_t d = 0; d < dim; ++d)
            result.squared_error[c] += std::pow(double(oc[d]) / zc - double(out[d]) / zd, 2);
          continue;
        }
        const std::vector<double> exact = exact_row(q, k, v, b, head, mine[std::size_t(r)], scale, masks[c]);
        for (std::int64_t d = 0; d < dim; ++d)
          result.squared_error[c] += std::pow(exact[std::size_t(d)] - double(out[d]) / zd, 2);
      }
    }
  }
  return result;
}

}  // namespace stsa::router_detail
