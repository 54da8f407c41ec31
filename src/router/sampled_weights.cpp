#include "router/sampled_weights.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "router/vector_clones.hpp"

namespace stsa::router_detail {
namespace {

// exp(x) for x <= 0 (arguments below -87 give 0): range reduction to 2^n *
// exp(r), |r| <= ln2/2, and a degree-6 polynomial (relative error ~2e-7).
// Inline, so each vector clone that calls it vectorises it for its own target.
inline float exp_nonpositive(float x) {
  const float v = std::max(x, -87.0f);
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
  return x < -87.0f ? 0.0f : p * scale;
}

// x[i] *= scale for x[0..count), returning the largest (-inf when count is 0),
// or NaN when any is not finite: a score of -inf, +inf or NaN comes only from
// non-finite or overflowing input, and the row is then reported as NaN
// whatever the other scores (the GPU router's rule too). x - x is 0 for a
// finite x and NaN otherwise. (A scale of 1 leaves x as it is.) Written with a
// vector type: as a loop over an array of 16 lanes GCC left it scalar.
typedef float Lane __attribute__((vector_size(kLane * sizeof(float))));
STSA_VECTOR_CLONES float scale_and_max(float* __restrict x, std::int64_t count, float scale) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  Lane lanes = {kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf,
                kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf};
  Lane poison = {};
  std::int64_t j = 0;
  for (; j + kLane <= count; j += kLane) {
    Lane y;
    std::memcpy(&y, x + j, sizeof(y));
    y *= scale;
    std::memcpy(x + j, &y, sizeof(y));
    lanes = y > lanes ? y : lanes;
    poison += y - y;
  }
  float m = kNegInf, tail_poison = 0.f;
  for (; j < count; ++j) {
    const float y = x[j] * scale;
    x[j] = y;
    m = y > m ? y : m;
    tail_poison += y - y;
  }
  for (std::int64_t i = 0; i < kLane; ++i) {
    m = lanes[i] > m ? lanes[i] : m;
    tail_poison += poison[i];
  }
  return std::isnan(tail_poison) ? std::numeric_limits<float>::quiet_NaN() : m;
}

// x[i] = exp(x[i] - m) for i < len and 0 for len <= i < width.
STSA_VECTOR_CLONES void exp_shifted(float* __restrict x, std::int64_t len, std::int64_t width, float m) {
  for (std::int64_t j = 0; j < len; ++j) x[j] = exp_nonpositive(x[j] - m);
  for (std::int64_t j = len; j < width; ++j) x[j] = 0.f;
}

}  // namespace

STSA_VECTOR_CLONES double block_sum(const float* __restrict x) {
  float lanes[kLane] = {};
  for (std::int64_t j = 0; j < kKeyBlock; j += kLane)
    for (std::int64_t i = 0; i < kLane; ++i) lanes[i] += x[j + i];
  double z = 0;
  for (std::int64_t i = 0; i < kLane; ++i) z += lanes[i];
  return z;
}

STSA_VECTOR_CLONES std::int64_t masked_weights(const float* __restrict e, const std::int32_t* __restrict code,
                                               const std::uint8_t* __restrict forced, std::int64_t q_code,
                                               bool q_forced, std::int64_t width, std::int64_t len,
                                               float* __restrict w) {
  std::int64_t kept = 0;
  for (std::int64_t j = 0; j < len; ++j) {
    const std::int64_t diff = std::int64_t(code[j]) - q_code;
    const bool ok = q_forced || forced[j] || (diff <= width && -diff <= width);
    w[j] = ok ? e[j] : 0.f;
    kept += ok;
  }
  for (std::int64_t j = len; j < kKeyBlock; ++j) w[j] = 0.f;
  return kept;
}

void softmax_sub_chunk(float* scores, std::int64_t stride, std::int64_t count, std::int64_t len, std::int64_t width,
                       float scale, float* max, float* factor, double* sums) {
  const std::int64_t blocks = width / kKeyBlock;
  for (std::int64_t r = 0; r < count; ++r) {
    float* row = scores + r * stride;
    double* row_sums = sums + r * blocks;
    const float local = scale_and_max(row, len, scale);
    float& m = max[r];
    factor[r] = 1.f;
    if (std::isnan(m) || !std::isfinite(local)) {  // a non-finite score: the row is reported as NaN
      m = std::numeric_limits<float>::quiet_NaN();
      std::fill_n(row, width, 0.f);
      std::fill_n(row_sums, blocks, 0.0);
      continue;
    }
    if (local > m) {
      if (std::isfinite(m)) factor[r] = std::exp(m - local);
      m = local;
    }
    exp_shifted(row, len, width, m);
    for (std::int64_t blk = 0; blk < blocks; ++blk) row_sums[blk] = block_sum(row + blk * kKeyBlock);
  }
}

void rescale_partial(ChunkPartial& o, std::size_t outputs, std::size_t acc_row, const float* factor) {
  for (std::size_t r = 0; r < o.max.size(); ++r) {
    if (factor[r] == 1.f) continue;
    for (std::size_t i = 0; i < outputs; ++i) o.z[r * outputs + i] *= double(factor[r]);
    float* acc = o.acc.data() + r * acc_row;
    for (std::size_t i = 0; i < acc_row; ++i) acc[i] *= factor[r];
  }
}

}  // namespace stsa::router_detail
