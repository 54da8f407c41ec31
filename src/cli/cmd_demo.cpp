// `stsa` with no arguments: a 720p-shaped plan, a small CPU benchmark, routing,
// and the CUDA kernel at 720p where a GPU is present, explained.
#include <cstdio>

#include "cli/bench_shared.hpp"
#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "stsa/error.hpp"
#include "stsa/flops.hpp"
#include "stsa/plan.hpp"

namespace stsa::cli {

void run_demo() {
  std::printf("stsa demo: spatio-temporal sparse attention (run `stsa --help` for the commands)\n\n");
  // Wan2.1 720p: 21 latent frames of 45 x 80 tokens, 40 heads of 128 dims.
  const VideoGrid grid{21, 45, 80, 0, TextPlacement::After};
  const VideoLayout layout{grid, 1, 40, 128};
  std::printf("1. Tile plans for a Wan2.1-14B 720p layer (%s = %lld tokens, 40 heads x 128), kept density 0.25:\n",
              grid.describe().c_str(), (long long)grid.tokens());
  for (const char* name : {"spatial", "temporal"}) {
    const auto plan = TilePlan::build(grid, mask_by_name(grid, name, 0.25));
    const PlanStats& s = plan->stats();
    std::printf("   %-8s %s: keeps %.3f of pairs; 128x128 tiles: %lld full, %lld partial, %lld empty "
                "(%.3f of tiles computed); built in %.1f ms, %.0f KiB\n",
                name, plan->spec().describe().c_str(), s.kept_fraction(), (long long)s.tiles_full,
                (long long)s.tiles_partial, (long long)s.tiles_empty, s.tile_density(), s.build_ms,
                double(s.plan_bytes) / 1024.0);
    std::printf("            -> a tiled kernel does %.2fx less work than dense attention (%.1f vs %.1f TFLOP per layer)\n",
                dense_attention_flops(layout) / kept_tile_flops(layout, *plan), kept_tile_flops(layout, *plan) / 1e12,
                dense_attention_flops(layout) / 1e12);
  }
  std::printf("   Frame 0 is the global anchor (all queries see it, it sees all), so temporal heads keep their\n"
              "   first-frame partners; temporal heads run in spatial-major token order, where the band is contiguous.\n\n");

  BenchArgs bench;
  bench.grid = {13, 16, 16, 0, "after", ""};
  bench.heads = 4;
  bench.head_dim = 128;
  bench.density = 0.25;
  bench.repeats = 3;
  bench.check_rows = 32;
  std::printf("2. CPU kernel on this machine (%lldx%lldx%lld tokens, %lld heads x %lld, spatial 0.25):\n",
              (long long)bench.grid.frames, (long long)bench.grid.height, (long long)bench.grid.width, (long long)bench.heads,
              (long long)bench.head_dim);
  // fp32, then bf16, which on a CPU with AMX runs the tile kernel.
  for (const char* dtype : {"fp32", "bf16"}) {
    bench.dtype = dtype;
    const nlohmann::json r = run_cpu_bench(bench, true);
    std::printf("   %s (%s kernel): dense %.2f ms, sparse %.2f ms: %.2fx faster (ideal %.2fx: the dense work over "
                "the kept tiles')\n",
                dtype, r["kernel"].get<std::string>().c_str(), json_double(r["dense_ms"]),
                json_double(r["sparse_ms"]), json_double(r["speedup"]), json_double(r["ideal_speedup"]));
    std::printf("     dense kernel %.1f GFLOP/s = %.2f of this machine's measured %s peak (%.1f GFLOP/s);\n",
                json_double(r["dense_gflops"]), json_double(r["peak_fraction"]),
                peak_units_text(r["peak_of"].get<std::string>()), json_double(r["peak_gflops"]));
    std::printf("     error vs the fp64 reference on sampled rows: rel L2 %.2e, max abs %.2e%s\n",
                json_double(r["rel_l2_err"]), json_double(r["max_abs_err"]),
                std::string(dtype) == "bf16" ? " (the bf16 output's rounding, and P's where the kernel rounds it)"
                                             : "");
  }

  RouteArgs route;
  route.synthetic = true;
  route.grid.frames = 13;
  route.grid.height = 12;
  route.grid.width = 16;
  route.heads = 8;
  route.head_dim = 64;
  std::printf("\n3. Online routing of %lld synthetic heads (%lldx%lldx%lld tokens, each built spatial or temporal;\n"
              "   synthetic data, not a model's) from 64 sampled query rows each, at kept density 0.25:\n",
              (long long)route.heads, (long long)route.grid.frames, (long long)route.grid.height,
              (long long)route.grid.width);
  const nlohmann::json routed = run_route(route);
  std::string decisions;
  for (const auto& d : routed["decisions"]) {
    if (!decisions.empty()) decisions += ' ';
    decisions += d.get<std::string>();
  }
  std::printf("   decisions: %s\n   accuracy against the known kinds: %.2f\n", decisions.c_str(),
              routed["accuracy"].is_null() ? 0.0 : routed["accuracy"].get<double>());
  std::printf("   error of the routed sparse output vs dense attention: rel L2 %.4f (temporal heads %.4f;\n"
              "   %.4f when the anchor is the first frame-sized block of the permuted order, as elsewhere)\n",
              json_double(routed["rel_l2_err"]), json_double(routed["rel_l2_err_temporal"]),
              json_double(routed["rel_l2_err_first_block_anchor_temporal"]));
  BenchArgs gpu;
  gpu.grid = {21, 45, 80, 0, "after", ""};
  gpu.heads = 12;
  gpu.head_dim = 128;
  gpu.dtype = "bf16";
  gpu.density = 0.2;
  gpu.check_rows = 8;
  gpu.backend = "cuda";
  std::printf("\n4. CUDA kernel on this machine (a Wan2.1-1.3B 720p layer: 21x45x80 tokens, 12 heads x 128, bf16,\n"
              "   spatial 0.2):\n");
  try {
    const nlohmann::json c = run_cuda_bench(gpu, true);
    std::printf("   %s, kernel %s: dense %.2f ms (%.0f TFLOP/s), sparse %.2f ms (%.0f TFLOP/s on kept tiles)\n",
                c["device"].get<std::string>().c_str(), c["kernel"].get<std::string>().c_str(),
                json_double(c["dense_ms"]), json_double(c["dense_tflops"]), json_double(c["sparse_ms"]),
                json_double(c["sparse_tflops_on_kept_tiles"]));
    std::printf("   %.2fx faster (ideal %.2fx); error vs the fp64 reference on 8 rows: rel L2 %.2e\n",
                json_double(c["speedup"]), json_double(c["ideal_speedup"]), json_double(c["rel_l2_err"]));
  } catch (const Unsupported& e) {  // no GPU, or none this build can use: the demo goes on
    std::printf("   not run: %s\n", e.what());
  } catch (const ResourceError& e) {  // a GPU too small for the 720p tensors
    std::printf("   not run: %s\n", e.what());
  }
  std::printf("\nNext: `stsa plan --help`, `stsa bench --help` (--backend cuda), `stsa route --synthetic --json`.\n");
}

}  // namespace stsa::cli
