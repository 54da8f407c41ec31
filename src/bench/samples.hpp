// The times of a benchmark's timed runs and their statistics. Every figure a
// benchmark reports is taken from the median; min and max show the spread.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace stsa::bench {

// Median of `values` (the mean of the middle two for an even count); NaN when empty.
double median(std::span<const double> values);

struct Samples {
  std::vector<double> ms;  // one per timed run, in run order

  std::size_t runs() const { return ms.size(); }
  // NaN when there are no runs.
  double median_ms() const;
  double min_ms() const;
  double max_ms() const;
};

}  // namespace stsa::bench
