// A candidate mask's relative L2 error from the sums the router forms (CPU
// router.cpp and GPU cuda_routing.cpp alike).
#pragma once

#include <cmath>
#include <limits>

namespace stsa::router_detail {

// sqrt(error / reference); NaN when either sum is NaN (a head with non-finite
// inputs reports so, not 0), +inf for a nonzero error on a zero reference.
inline double relative_l2(double squared_error, double squared_reference) {
  if (std::isnan(squared_error) || std::isnan(squared_reference)) return std::numeric_limits<double>::quiet_NaN();
  if (squared_reference > 0) return std::sqrt(squared_error / squared_reference);
  return squared_error > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

}  // namespace stsa::router_detail
