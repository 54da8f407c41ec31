// stsa_schedule_model: the balance the persistent sm90 kernel's block schedules
// give each work order at one video shape, from the host model the kernel's
// launches use (block_schedule.hpp: an item costs its kept key tiles plus a
// fixed overhead, a block the sum of its items). For predictions written down
// before a GPU run (bench/NOTES.md); no GPU needed. What it leaves out, L2
// sharing above all, is what the GPU run measures.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/block_schedule.hpp"
#include "cuda/device_plan_image.hpp"
#include "cuda/work_order_model.hpp"
#include "stsa/error.hpp"
#include "stsa/mask.hpp"
#include "stsa/plan.hpp"

namespace {

struct Options {
  std::int64_t frames = 21, height = 90, width = 160, heads = 12, blocks = 132;
  std::vector<double> densities{0.1, 0.2, 0.3, 0.5, 1.0};
};

const char* order_name(stsa::cuda_detail::WorkOrder order) {
  return order == stsa::cuda_detail::kWorkHeadByHead ? "head-by-head" : "across-heads";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace stsa::cuda_detail;
  using stsa::CudaBlockSchedule;
  CLI::App app{"Models the sm90 kernel's block schedules and work orders at one video shape (no GPU)."};
  Options opt;
  app.add_option("--frames", opt.frames)->capture_default_str();
  app.add_option("--height", opt.height)->capture_default_str();
  app.add_option("--width", opt.width)->capture_default_str();
  app.add_option("--heads", opt.heads, "heads sharing one plan (batch x heads of one launch)")->capture_default_str();
  app.add_option("--blocks", opt.blocks, "persistent blocks (one per SM: 132 on an H200)")->capture_default_str();
  app.add_option("--densities", opt.densities, "kept densities; 1 means the dense mask")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  try {
    STSA_CHECK(opt.frames > 0 && opt.height > 0 && opt.width > 0 && opt.heads > 0 && opt.blocks > 0,
               stsa::InvalidArgument, "every size must be > 0");
    const stsa::VideoGrid grid{opt.frames, opt.height, opt.width, 0, stsa::TextPlacement::After};
    std::printf("%lldx%lldx%lld tokens, %lld heads, %lld blocks; slowest block / mean of the modelled costs\n",
                static_cast<long long>(opt.frames), static_cast<long long>(opt.height),
                static_cast<long long>(opt.width), static_cast<long long>(opt.heads),
                static_cast<long long>(opt.blocks));
    std::printf("density | across-heads round-robin | head-by-head round-robin | across-heads balanced | "
                "head-by-head balanced | Auto round-robin | Auto balanced\n");
    for (const double density : opt.densities) {
      const stsa::MaskSpec spec = density < 1.0 ? stsa::mask_for_density(grid, stsa::SparseKind::Spatial, density)
                                                : stsa::MaskSpec::dense();
      const DevicePlanImage image = make_device_plan_image(*stsa::TilePlan::build(grid, spec));
      std::int64_t total = 0;
      for (const std::int32_t c : image.rank_costs) total += opt.heads * (c + kItemOverheadTiles);
      const auto ratio = [&](const BlockSchedule& s) { return double(s.makespan) * s.blocks() / double(total); };
      std::printf("%s", density < 1.0 ? std::to_string(density).substr(0, 4).c_str() : "dense");
      for (const CudaBlockSchedule policy : {CudaBlockSchedule::RoundRobin, CudaBlockSchedule::Balanced})
        for (const WorkOrder order : {kWorkAcrossHeads, kWorkHeadByHead})
          std::printf(" | %.3f", ratio(make_block_schedule(image.rank_costs, opt.heads, opt.blocks, order, policy)));
      for (const CudaBlockSchedule policy : {CudaBlockSchedule::RoundRobin, CudaBlockSchedule::Balanced}) {
        const OrderChoice auto_choice = choose_work_order(image.rank_costs, opt.heads, opt.blocks, policy);
        std::printf(" | %s %.3f", order_name(auto_choice.order), ratio(auto_choice.schedule));
      }
      std::printf("\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stsa_schedule_model: %s\n", e.what());
    return 2;
  }
  return 0;
}
