// Exact attention of a few sampled query rows of one head against all keys,
// dense and under each candidate mask, reduced to squared output errors.
#pragma once

#include <cstdint>
#include <vector>

#include "router/candidate_mask.hpp"
#include "stsa/tensor.hpp"

namespace stsa::router_detail {

struct SampledErrors {
  std::vector<double> squared_error;  // per candidate: sum over rows and channels of (O_mask - O_dense)^2
  double squared_reference = 0;       // sum of O_dense^2
  double flops = 0;                   // scores + weighted sums actually computed
};

// rows/batch: sampled token positions (tensor order) and their batch indices.
SampledErrors sampled_errors(const TensorView& q, const TensorView& k, const TensorView& v, std::int64_t head,
                             float scale, const std::vector<std::int64_t>& rows,
                             const std::vector<std::int64_t>& batch, const std::vector<CandidateMask>& masks);

}  // namespace stsa::router_detail
