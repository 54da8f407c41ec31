// Inputs and checks shared by the benchmarks of `stsa bench` (bench_inputs.hpp).
#include "cli/bench_inputs.hpp"

#include <algorithm>
#include <cmath>
#include <random>

namespace stsa::cli {

// splitmix64 + Box-Muller: fast enough for the hundreds of millions of values of the larger runs.
void fill_normal(const TensorView& t, std::uint64_t seed) {
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  auto next = [&state] {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  const std::int64_t count = t.numel();  // contiguous: filled in storage order
  for (std::int64_t i = 0; i < count; i += 2) {
    const double u1 = (double(next() >> 11) + 1.0) * 0x1p-53;  // (0, 1]
    const double u2 = double(next() >> 11) * 0x1p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    store_from_float(t.data, t.dtype, i, float(r * std::cos(2.0 * M_PI * u2)));
    if (i + 1 < count) store_from_float(t.data, t.dtype, i + 1, float(r * std::sin(2.0 * M_PI * u2)));
  }
}

Errors check_rows(const AttentionCall& call, const std::vector<std::int64_t>& rows, const PairPredicate& computes) {
  std::vector<double> ref_o, ref_lse;
  reference_rows(call, rows, ref_o, ref_lse, computes);
  const VideoLayout& layout = call.layout;
  const auto count = std::int64_t(rows.size());
  const std::int64_t dims = layout.head_dim;
  Errors e;
  double err2 = 0, ref2 = 0;
  for (std::int64_t b = 0; b < layout.batch; ++b)
    for (std::int64_t r = 0; r < count; ++r)
      for (std::int64_t h = 0; h < layout.heads; ++h) {
        const std::int64_t i = rows[std::size_t(r)];
        for (std::int64_t d = 0; d < dims; ++d) {
          const double ref = ref_o[std::size_t(((b * count + r) * layout.heads + h) * dims + d)];
          const double diff = std::abs(double(call.o.load(b, i, h, d)) - ref);
          // NaN anywhere makes the error NaN, which the report shows as such.
          e.max_abs = std::isnan(diff) || diff > e.max_abs ? diff : e.max_abs;
          err2 += diff * diff;
          ref2 += ref * ref;
        }
        const double ref_l = ref_lse[std::size_t((b * layout.heads + h) * count + r)];
        const double got_l = call.lse.at(b, h, i);
        const double diff = ref_l == got_l ? 0.0 : std::abs(got_l - ref_l);
        e.lse_max_abs = std::isnan(diff) || diff > e.lse_max_abs ? diff : e.lse_max_abs;
      }
  e.rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  return e;
}

std::vector<std::int64_t> sample_rows(std::int64_t tokens, int count, std::uint64_t seed) {
  std::vector<std::int64_t> rows;
  if (count >= tokens) {
    for (std::int64_t i = 0; i < tokens; ++i) rows.push_back(i);
    return rows;
  }
  std::mt19937_64 rng(seed ^ 0x5DEECE66Dull);
  std::uniform_int_distribution<std::int64_t> pick(0, tokens - 1);
  while (std::int64_t(rows.size()) < count) {
    const std::int64_t i = pick(rng);
    if (std::find(rows.begin(), rows.end(), i) == rows.end()) rows.push_back(i);
  }
  std::sort(rows.begin(), rows.end());
  return rows;
}

}  // namespace stsa::cli
