// stsa_schedule_model: the balance the persistent sm90 kernel's block schedules
// give each work order at one video shape, from the host model the kernel's
// launches use (block_schedule.hpp: an item costs its kept key tiles plus a
// fixed overhead, a block the sum of its items). For predictions written down
// before a GPU run (bench/NOTES.md); no GPU needed. What it leaves out, L2
// sharing above all, is what the GPU run measures.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>

#include "cuda/block_schedule.hpp"
#include "cuda/work_order_model.hpp"
#include "model_shape.hpp"

namespace {

const char* order_name(stsa::cuda_detail::WorkOrder order) {
  switch (order) {
    case stsa::cuda_detail::kWorkHeadByHead: return "head-by-head";
    case stsa::cuda_detail::kWorkHeavyFirst: return "heavy-first";
    default: return "across-heads";
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace stsa::cuda_detail;
  using stsa::CudaBlockSchedule;
  CLI::App app{"Models the sm90 kernel's block schedules and work orders at one video shape (no GPU)."};
  stsa::bench_models::ModelShape opt;
  opt.add_options(app);
  CLI11_PARSE(app, argc, argv);
  try {
    opt.grid();  // checks the sizes
    std::printf("%lldx%lldx%lld tokens, %d heads, %d blocks; slowest block / mean of the modelled costs\n",
                static_cast<long long>(opt.frames), static_cast<long long>(opt.height),
                static_cast<long long>(opt.width), opt.heads, opt.blocks);
    std::printf("density | across-heads round-robin | head-by-head round-robin | across-heads balanced | "
                "head-by-head balanced | Auto round-robin | Auto balanced | head-by-head snake | heavy-first snake\n");
    for (const double density : opt.densities) {
      const DevicePlanImage image = opt.plan_image(density);
      std::int64_t total = 0;
      for (const std::int32_t c : image.rank_costs) total += opt.heads * (c + kItemOverheadTiles);
      const auto ratio = [&](const BlockSchedule& s) { return double(s.makespan) * s.blocks() / double(total); };
      std::printf("%s", opt.label(density).c_str());
      for (const CudaBlockSchedule policy : {CudaBlockSchedule::RoundRobin, CudaBlockSchedule::Balanced})
        for (const WorkOrder order : {kWorkAcrossHeads, kWorkHeadByHead})
          std::printf(" | %.3f", ratio(make_block_schedule(image.rank_costs, opt.heads, opt.blocks, order, policy)));
      for (const CudaBlockSchedule policy : {CudaBlockSchedule::RoundRobin, CudaBlockSchedule::Balanced}) {
        const OrderChoice auto_choice = choose_work_order(image.rank_costs, opt.heads, opt.blocks, policy);
        std::printf(" | %s %.3f", order_name(auto_choice.order), ratio(auto_choice.schedule));
      }
      for (const WorkOrder order : {kWorkHeadByHead, kWorkHeavyFirst})
        std::printf(" | %.3f", ratio(make_block_schedule(image.rank_costs, opt.heads, opt.blocks, order,
                                                          CudaBlockSchedule::Snake)));
      std::printf("\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stsa_schedule_model: %s\n", e.what());
    return 2;
  }
  return 0;
}
