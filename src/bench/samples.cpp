#include "bench/samples.hpp"

#include <algorithm>
#include <limits>

namespace stsa::bench {

double median(std::span<const double> values) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::vector<double> v(values.begin(), values.end());
  const std::size_t n = v.size(), mid = n / 2;
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(mid), v.end());
  if (n % 2) return v[mid];
  const double upper = v[mid];
  const double lower = *std::max_element(v.begin(), v.begin() + std::ptrdiff_t(mid));
  return 0.5 * (lower + upper);
}

double Samples::median_ms() const { return median(ms); }

double Samples::min_ms() const {
  return ms.empty() ? std::numeric_limits<double>::quiet_NaN() : *std::min_element(ms.begin(), ms.end());
}

double Samples::max_ms() const {
  return ms.empty() ? std::numeric_limits<double>::quiet_NaN() : *std::max_element(ms.begin(), ms.end());
}

}  // namespace stsa::bench
