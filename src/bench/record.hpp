// JSON records of benchmark results: how timings and figures are written, so
// every benchmark's fields read alike. Works with nlohmann::json and
// nlohmann::ordered_json.
#pragma once

#include <cmath>
#include <limits>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "bench/samples.hpp"
#include "stsa/plan.hpp"

namespace stsa::bench {

// Any non-finite figure as NaN: nlohmann writes it as null, and printing code
// that reads the record back still gets a double.
inline double json_number(double x) { return std::isfinite(x) ? x : std::numeric_limits<double>::quiet_NaN(); }

// Adds <prefix>ms (median), <prefix>ms_min, <prefix>ms_max and <prefix>ms_runs
// (every timed run, in run order) to `record`.
template <class Json>
void add_timing(Json& record, std::string_view prefix, const Samples& samples) {
  const std::string p(prefix);
  record[p + "ms"] = json_number(samples.median_ms());
  record[p + "ms_min"] = json_number(samples.min_ms());
  record[p + "ms_max"] = json_number(samples.max_ms());
  record[p + "ms_runs"] = samples.ms;
}

// Adds what every record says of a tile plan: kept_fraction, tile_density and
// tiles_full / tiles_partial / tiles_empty.
template <class Json>
void add_plan_stats(Json& record, const PlanStats& stats) {
  record["kept_fraction"] = stats.kept_fraction();
  record["tile_density"] = stats.tile_density();
  record["tiles_full"] = stats.tiles_full;
  record["tiles_partial"] = stats.tiles_partial;
  record["tiles_empty"] = stats.tiles_empty;
}

}  // namespace stsa::bench
