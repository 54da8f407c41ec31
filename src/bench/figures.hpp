// Figures derived from timings, the same for every benchmark: FLOP rates (the
// FLOP counts come from stsa/flops.hpp only), bandwidths, speedups and
// fractions of a measured peak. A figure that cannot be formed (a time that
// is not positive, a zero peak) is NaN, which the JSON records show as null.
#pragma once

#include "stsa/layout.hpp"
#include "stsa/plan.hpp"

namespace stsa::bench {

// What one attention call on every (batch, head) computes, from stsa/flops.hpp.
struct AttentionWork {
  double dense_flops = 0;      // every pair: the dense-equivalent work
  double kept_tile_flops = 0;  // the kept tiles' area, what a tiled kernel executes
  double kept_pair_flops = 0;  // the kept pairs only, what the mask asks for
};
AttentionWork attention_work(const VideoLayout& layout, const TilePlan& plan);

// FLOP/s divided by `unit` (1e9: GFLOP/s, 1e12: TFLOP/s) for `flops` done in `ms`.
double flop_rate(double flops, double ms, double unit);
inline double gflops(double flops, double ms) { return flop_rate(flops, ms, 1e9); }
inline double tflops(double flops, double ms) { return flop_rate(flops, ms, 1e12); }
// GB/s for `bytes` moved in `ms`.
double gbps(double bytes, double ms);
// How many times faster `ms` is than `baseline_ms`.
double speedup(double baseline_ms, double ms);
// `rate` as a fraction of `peak` (same units).
double fraction_of_peak(double rate, double peak);

}  // namespace stsa::bench
