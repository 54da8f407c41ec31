// The 15 Wan2.1 plans the H200 runs timed (bench/gpu/RESULTS.md): 21 frames at
// 480p, 720p and 1440p, spatial band masks at densities 0.1, 0.2, 0.3, 0.5 and
// dense, as the per-rank costs the block schedules and the work-order model
// read. Host only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/device_plan_image.hpp"
#include "stsa/mask.hpp"
#include "stsa/plan.hpp"

namespace stsa::cuda_detail {

struct MeasuredPlan {
  std::string shape;  // "480p", "720p", "1440p"
  double density = 1.0;
  std::vector<std::int32_t> rank_costs;
};

inline std::vector<MeasuredPlan> measured_wan21_plans() {
  struct Shape {
    const char* name;
    std::int64_t height, width;
  };
  std::vector<MeasuredPlan> plans;
  for (const Shape shape : {Shape{"480p", 30, 52}, Shape{"720p", 45, 80}, Shape{"1440p", 90, 160}}) {
    const VideoGrid grid{21, shape.height, shape.width, 0, TextPlacement::After};
    for (const double density : {0.1, 0.2, 0.3, 0.5, 1.0}) {
      const MaskSpec spec = density < 1.0 ? mask_for_density(grid, SparseKind::Spatial, density) : MaskSpec::dense();
      plans.push_back({shape.name, density, make_device_plan_image(*TilePlan::build(grid, spec)).rank_costs});
    }
  }
  return plans;
}

}  // namespace stsa::cuda_detail
