// What the two no-GPU model tools (stsa_schedule_model, stsa_l2_model) share:
// the video shape and launch they model, its command-line options, and the
// device plan image of a spatial mask at each kept density.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/device_plan_image.hpp"
#include "stsa/error.hpp"
#include "stsa/mask.hpp"
#include "stsa/plan.hpp"

namespace stsa::bench_models {

struct ModelShape {
  std::int64_t frames = 21, height = 90, width = 160;  // Wan2.1 at 1440p
  int heads = 12, blocks = 132;                        // one launch's heads; an H200's SMs
  std::vector<double> densities{0.1, 0.2, 0.3, 0.5, 1.0};
  bool no_anchor = false;

  void add_options(CLI::App& app) {
    app.add_option("--frames", frames)->capture_default_str();
    app.add_option("--height", height)->capture_default_str();
    app.add_option("--width", width)->capture_default_str();
    app.add_option("--heads", heads, "heads sharing one plan (batch x heads of one launch)")->capture_default_str();
    app.add_option("--blocks", blocks, "persistent blocks (one per SM: 132 on an H200)")->capture_default_str();
    app.add_option("--densities", densities, "kept densities; 1 means the dense mask")->delimiter(',');
    app.add_flag("--no-anchor", no_anchor, "spatial masks without the frame-0 anchor (rows may keep no tile)");
  }

  VideoGrid grid() const {
    STSA_CHECK(frames > 0 && height > 0 && width > 0 && heads > 0 && blocks > 0, InvalidArgument,
               "every size must be > 0");
    return {frames, height, width, 0, TextPlacement::After};
  }

  // The device plan image of the spatial mask at `density` (1: dense).
  cuda_detail::DevicePlanImage plan_image(double density) const {
    const VideoGrid g = grid();
    const MaskSpec spec =
        density < 1.0 ? mask_for_density(g, SparseKind::Spatial, density, !no_anchor) : MaskSpec::dense();
    return cuda_detail::make_device_plan_image(*TilePlan::build(g, spec));
  }

  static std::string label(double density) {
    return density < 1.0 ? std::to_string(density).substr(0, 4) : "dense";
  }
};

}  // namespace stsa::bench_models
