// How much a routing decision costs in accuracy: the routed output against
// exact dense attention (fp64 reference) on a set of evaluation rows, and the
// same error for the first-block-anchor layout other implementations use
// (first_block_anchor.hpp), computed on the reference path.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "stsa/layout.hpp"
#include "stsa/router.hpp"
#include "stsa/tensor.hpp"

namespace stsa {

// sqrt(squared_error / reference_squared): 0 where both are 0, infinite where only the
// reference is, NaN where either is NaN (a NaN in an output must not read as no error).
// The router's candidate errors (CPU and GPU) and the evaluation of routes alike.
inline double relative_l2(double squared_error, double reference_squared) {
  if (std::isnan(squared_error) || std::isnan(reference_squared)) return std::numeric_limits<double>::quiet_NaN();
  if (reference_squared > 0) return std::sqrt(squared_error / reference_squared);
  return squared_error > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

struct RouteEvaluation {
  std::vector<std::int64_t> rows;  // evaluated token positions (frame-major), every batch entry
  // Per head, summed over rows, batch and channels:
  std::vector<double> routed_squared_error;       // (O_routed - O_dense)^2
  std::vector<double> first_block_squared_error;  // (O_first_block - O_dense)^2
  std::vector<double> reference_squared;          // O_dense^2

  // sqrt(sum error / sum reference) over the heads whose route is in `routes` (all when empty).
  double rel_l2(const std::vector<double>& squared_error, const std::vector<HeadRoute>& heads,
                const std::vector<Route>& routes = {}) const;
};

// eval_rows = 0: every row; otherwise that many rows, stratified over the sequence (seeded).
// `routed_o` is the output the backend produced with `heads` (logical [B, N, H, D], frame-major).
// threads 0: resolve_threads(0) (cpu.hpp).
RouteEvaluation evaluate_routes(const VideoLayout& layout, const TensorView& q, const TensorView& k,
                                const TensorView& v, const TensorView& routed_o, const std::vector<HeadRoute>& heads,
                                std::int64_t eval_rows, std::uint64_t seed, float softmax_scale = 0.f,
                                int threads = 0);

}  // namespace stsa
