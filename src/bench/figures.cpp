#include "bench/figures.hpp"

#include <cmath>
#include <limits>

#include "stsa/flops.hpp"

namespace stsa::bench {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool positive(double x) { return std::isfinite(x) && x > 0; }

}  // namespace

AttentionWork attention_work(const VideoLayout& layout, const TilePlan& plan) {
  // PlanStats counts pairs of one (batch, head); the plan is the same for all of them.
  const double calls = double(layout.batch) * double(layout.heads);
  return {dense_attention_flops(layout), kept_tile_flops(layout, plan),
          attention_flops(plan.stats().kept_pairs, layout.head_dim) * calls};
}

double flop_rate(double flops, double ms, double unit) { return positive(ms) ? flops / (ms * 1e-3) / unit : kNaN; }

double gbps(double bytes, double ms) { return positive(ms) ? bytes / (ms * 1e-3) / 1e9 : kNaN; }

double speedup(double baseline_ms, double ms) {
  return positive(ms) && std::isfinite(baseline_ms) ? baseline_ms / ms : kNaN;
}

double fraction_of_peak(double rate, double peak) { return positive(peak) ? rate / peak : kNaN; }

}  // namespace stsa::bench
