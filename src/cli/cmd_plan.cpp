// `stsa plan`: build one head's tile plan and report its statistics.
#include <cstdio>

#include "bench/record.hpp"
#include "cli/commands.hpp"
#include "cli/json_text.hpp"
#include "cli/options.hpp"
#include "cli/tile_map_png.hpp"
#include "stsa/error.hpp"
#include "stsa/flops.hpp"
#include "stsa/plan.hpp"

namespace stsa::cli {
namespace {

nlohmann::json plan_record(const PlanArgs& args) {
  const VideoGrid grid = args.grid.grid();
  VideoLayout layout{grid, 1, args.heads, args.head_dim};
  layout.validate();
  const MaskSpec spec = mask_by_name(grid, args.mask, args.density, !args.no_anchor);
  // Only -1, "not given", means "as --tile"; any other negative given goes to validate() and is refused.
  const TileShape tile{args.tile, args.tile_k == -1 ? args.tile : args.tile_k};
  tile.validate();
  const auto plan = TilePlan::build(grid, spec, tile, parse_alignment(args.align));
  if (!args.png.empty()) write_tile_map_png(*plan, args.png, args.force);
  const PlanStats& s = plan->stats();
  nlohmann::json record = {
      {"grid", grid.describe()},
      {"tokens", grid.tokens()},
      {"heads", args.heads},
      {"head_dim", args.head_dim},
      {"mask", spec.describe()},
      {"requested_density", args.density},
      {"band", spec.band},
      {"frame_radius", spec.frame_radius},
      {"anchor", spec.anchor},
      {"tile_q", tile.q},
      {"tile_k", tile.k},
      {"align", std::string(to_string(plan->alignment()))},
      {"q_tiles", plan->q_tiles()},
      {"k_tiles", plan->k_tiles()},
      {"kept_pairs", s.kept_pairs},
      {"exact_kept_pairs", s.exact_kept_pairs},
      {"total_pairs", s.total_pairs},
      {"changed_pairs", s.changed_pairs},
      {"added_pairs", s.added_pairs},
      {"removed_pairs", s.removed_pairs},
      {"distinct_masks", s.distinct_masks},
      {"plans_for_all_heads", 1},
      {"build_ms", s.build_ms},
      {"plan_bytes", s.plan_bytes},
      {"dense_tflop_per_call", dense_attention_flops(layout) / 1e12},
      {"kept_tile_tflop_per_call", kept_tile_flops(layout, *plan) / 1e12},
      {"png", args.png},
  };
  bench::add_plan_stats(record, s);
  return record;
}

void print_text(const nlohmann::json& r) {
  const auto i64 = [&](const char* key) { return r[key].get<std::int64_t>(); };
  const auto f64 = [&](const char* key) { return r[key].get<double>(); };
  std::printf("grid %s: %lld tokens, %lld heads x %lld dims\n", r["grid"].get<std::string>().c_str(),
              (long long)i64("tokens"), (long long)i64("heads"), (long long)i64("head_dim"));
  std::printf("mask %s (asked density %.4f): keeps %lld of %lld pairs = %.4f\n", r["mask"].get<std::string>().c_str(),
              f64("requested_density"), (long long)i64("kept_pairs"), (long long)i64("total_pairs"),
              f64("kept_fraction"));
  std::printf("tiles %lldx%lld (%s): %lld x %lld = full %lld, partial %lld, empty %lld; tile density %.4f\n",
              (long long)i64("tile_q"), (long long)i64("tile_k"), r["align"].get<std::string>().c_str(),
              (long long)i64("q_tiles"), (long long)i64("k_tiles"), (long long)i64("tiles_full"),
              (long long)i64("tiles_partial"), (long long)i64("tiles_empty"), f64("tile_density"));
  if (r["align"] == "round")
    std::printf("rounding changed %lld pairs (%lld added, %lld removed) = %.5f of the exact mask\n",
                (long long)i64("changed_pairs"), (long long)i64("added_pairs"), (long long)i64("removed_pairs"),
                double(i64("changed_pairs")) / double(std::max<std::int64_t>(1, i64("exact_kept_pairs"))));
  std::printf("%lld distinct partial masks; one plan serves all heads: %.1f KiB, built in %.1f ms\n",
              (long long)i64("distinct_masks"), double(i64("plan_bytes")) / 1024.0, f64("build_ms"));
  // %.3g: a small grid's work is well under 0.01 TFLOP.
  const double dense = f64("dense_tflop_per_call"), kept = f64("kept_tile_tflop_per_call");
  if (kept > 0)
    std::printf("work per call: %.3g TFLOP dense, %.3g TFLOP on kept tiles (%.2fx less)\n", dense, kept, dense / kept);
  else
    std::printf("work per call: %.3g TFLOP dense, none on kept tiles (no kept tiles)\n", dense);
  if (!r["png"].get<std::string>().empty()) std::printf("tile map written to %s\n", r["png"].get<std::string>().c_str());
}

}  // namespace

void run_plan_command(const PlanArgs& args) {
  const nlohmann::json record = plan_record(args);
  if (args.json) std::printf("%s\n", json_text(record).c_str());
  else print_text(record);
}

}  // namespace stsa::cli
