// `stsa bench`: the CPU backend, dense and sparse on the same random inputs,
// timed in one run (by the harness in src/bench) against this machine's
// measured peak of the units the kernel runs on (FMA, or AMX tiles for bf16, fp16, fp8)
// and checked against the fp64 reference. (--dist hands over
// to cmd_bench_dist.cpp.)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "bench/figures.hpp"
#include "bench/record.hpp"
#include "bench/timing_loop.hpp"
#include "cli/bench_shared.hpp"
#include "cli/commands.hpp"
#include "cli/json_text.hpp"
#include "cli/options.hpp"
#include "stsa/attention.hpp"
#include "stsa/cpu.hpp"
#include "stsa/error.hpp"
#include "stsa/flops.hpp"
#include "stsa/plan.hpp"

namespace stsa::cli {
namespace {

// One warm-up, then `repeats` timed runs in wall time (clock 0) and process CPU time (clock 1).
bench::TimedRuns time_kernel(const Backend& backend, const AttentionCall& call, int repeats, Progress& progress) {
  bench::WallStopwatch wall;
  bench::ProcessCpuStopwatch cpu;
  bench::Stopwatch* clocks[] = {&wall, &cpu};
  return bench::time_runs({.warmup = 1, .repeats = repeats}, [&] { backend.run(call); }, clocks,
                          [&](int done, int total) { progress.update(double(done) / total); });
}

void print_text(const nlohmann::json& r) {
  const auto f = [&](const char* key) { return json_double(r[key]); };
  const std::string dtype = r["dtype"].get<std::string>(), out_dtype = r["out_dtype"].get<std::string>();
  const std::int64_t heads = r["heads"].get<std::int64_t>(), kv_heads = r["kv_heads"].get<std::int64_t>();
  const std::string kv =
      kv_heads == heads ? "" : " (" + std::to_string(kv_heads) + (kv_heads == 1 ? " K/V head)" : " K/V heads)");
  std::printf("grid %s: %lld tokens, batch %lld, %lld heads%s x %lld, %s, tiles %lldx%lld %s\n",
              r["grid"].get<std::string>().c_str(), (long long)r["tokens"].get<std::int64_t>(),
              (long long)r["batch"].get<std::int64_t>(), (long long)heads, kv.c_str(),
              (long long)r["head_dim"].get<std::int64_t>(),
              (dtype == out_dtype ? dtype : dtype + " in, " + out_dtype + " out").c_str(),
              (long long)r["tile"].get<std::int64_t>(), (long long)r["tile"].get<std::int64_t>(),
              r["align"].get<std::string>().c_str());
  std::printf("mask %s: kept fraction %.4f, tile density %.4f (%lld full, %lld partial tiles)\n",
              r["mask"].get<std::string>().c_str(), f("kept_fraction"), f("tile_density"),
              (long long)r["tiles_full"].get<std::int64_t>(), (long long)r["tiles_partial"].get<std::int64_t>());
  const auto kernel_dim = r["kernel_head_dim"].get<std::int64_t>(), head_dim = r["head_dim"].get<std::int64_t>();
  const std::string padded = kernel_dim == head_dim ? std::string()
                                                    : " at head dim " + std::to_string(kernel_dim) + ", zero-padded";
  std::printf("cpu backend: %s (the %s kernel ran%s), %lld threads; %s peak measured %.1f GFLOP/s\n",
              r["isa"].get<std::string>().c_str(), r["kernel"].get<std::string>().c_str(), padded.c_str(),
              (long long)r["threads"].get<std::int64_t>(), peak_units_text(r["peak_of"].get<std::string>()),
              f("peak_gflops"));
  std::printf("dense : %9.2f ms  %7.1f GFLOP/s  (%.2f of peak)\n", f("dense_ms"), f("dense_gflops"),
              f("peak_fraction"));
  std::printf("sparse: %9.2f ms  %7.1f GFLOP/s on kept tiles (%.2f of peak), %.1f dense-equivalent\n", f("sparse_ms"),
              f("sparse_gflops_on_kept_tiles"), f("sparse_peak_fraction"), f("sparse_gflops_dense_equivalent"));
  std::printf("speedup %.2fx (ideal %.2fx: dense work / kept tiles' work, %.0f%% of it)\n", f("speedup"),
              f("ideal_speedup"), 100.0 * f("speedup") / f("ideal_speedup"));
  std::printf("in CPU time (other jobs excluded): dense %.2f of peak, sparse kept tiles %.2f, speedup %.2fx\n",
              f("peak_fraction_cpu_time"), f("sparse_peak_fraction_cpu_time"), f("speedup_cpu_time"));
  std::printf(
      "vs fp64 reference on %lld rows: sparse rel L2 %.2e, max abs %.2e, LSE %.2e; dense rel L2 %.2e, max abs "
      "%.2e\n",
      (long long)r["check_rows"].get<std::int64_t>(), f("rel_l2_err"), f("max_abs_err"), f("lse_max_abs_err"),
      f("dense_rel_l2_err"), f("dense_max_abs_err"));
}

}  // namespace

nlohmann::json run_cpu_bench(const BenchArgs& args, bool progress) {
  // Everything is checked before anything large is allocated.
  const BenchOptions options = parse_bench_options(args);
  const Isa isa = resolve_isa(parse_isa(args.isa));
  const int threads = resolve_threads(args.threads);
  const auto backend = make_cpu_backend({isa, threads});
  {
    AttentionCall shape_only;
    shape_only.layout = options.layout;
    const Support support = backend->supports(shape_only);
    if (!support.ok) throw Unsupported(support.why);
  }
  // The work of the warm-up and timed calls, dense and sparse. The dense part alone
  // first: it needs no plan, and an absurd shape's plan would take long to build.
  const std::string calls = std::to_string(1 + args.repeats);
  check_bench_work(args, (1 + args.repeats) * dense_attention_flops(options.layout) / 1e12,
                   "the " + calls + " dense calls alone");
  check_bench_memory(options);
  auto plan = TilePlan::build(options.layout.grid, options.spec, options.tile, options.alignment);
  const bench::AttentionWork work = bench::attention_work(options.layout, *plan);
  check_bench_work(args, (1 + args.repeats) * (work.dense_flops + work.kept_tile_flops) / 1e12,
                   "dense and kept tiles, " + calls + " calls each");
  const BenchCase c(options, args.seed, std::move(plan));
  const AttentionCall &dense = c.dense, &sparse = c.sparse;

  bench::TimedRuns dense_t, sparse_t;
  {
    Progress p("timing the dense kernel", progress);
    dense_t = time_kernel(*backend, dense, args.repeats, p);
  }
  {
    Progress p("timing the sparse kernel", progress);
    sparse_t = time_kernel(*backend, sparse, args.repeats, p);
  }
  const BenchErrors errors =
      check_dense_and_sparse(dense, sparse, c.plan, args.check_rows, args.seed, progress);
  // The ceiling of the units the kernel runs on: AMX tile products take bf16, fp16 and fp8 calls where there is
  // AMX; the AVX-512 kernel both products of bf16 and fp8 calls with a bf16 output through VDPBF16PS.
  const Isa kernel = kernel_isa(isa, dense);
  const ProductUnits units = kernel_product_units(isa, dense);
  const auto measure = units == ProductUnits::AmxTiles  ? measure_amx_peak_gflops
                       : units == ProductUnits::Bf16Dot ? measure_bf16_dot_peak_gflops
                                                        : measure_fma_peak_gflops;
  double peak = 0;
  {
    Progress p(std::string("measuring the ") + peak_units_text(to_string(units)) + " peak", progress);
    peak = measure(threads, 0.3);
  }

  const bench::Samples &dense_wall = dense_t[0], &sparse_wall = sparse_t[0];
  const bench::Samples &dense_cpu = dense_t[1], &sparse_cpu = sparse_t[1];
  const double dense_ms = dense_wall.median_ms(), sparse_ms = sparse_wall.median_ms();
  const double dense_gflops = bench::gflops(work.dense_flops, dense_ms);
  const double kept_gflops = bench::gflops(work.kept_tile_flops, sparse_ms);
  // The same from process CPU time spread over the threads: what the rates are
  // while the threads actually run, so other jobs on the machine drop out. More
  // threads than hardware threads share the cores: spread over the cores, as the peak is.
  const double dense_cpu_ms = dense_cpu.median_ms(), sparse_cpu_ms = sparse_cpu.median_ms();
  const int running = std::min(threads, hardware_threads());
  const double dense_gflops_cpu = bench::gflops(work.dense_flops, dense_cpu_ms / running);
  const double kept_gflops_cpu = bench::gflops(work.kept_tile_flops, sparse_cpu_ms / running);
  nlohmann::json record = bench_case_record(args, options, *c.plan, errors);
  record.update({
      {"backend", "cpu"},
      {"isa", std::string(to_string(isa))},
      {"threads", threads},
      {"speedup", bench::speedup(dense_ms, sparse_ms)},
      {"dense_gflops", dense_gflops},
      {"sparse_gflops_on_kept_tiles", kept_gflops},
      {"sparse_gflops_dense_equivalent", bench::gflops(work.dense_flops, sparse_ms)},
      {"peak_gflops", peak},
      {"peak_of", std::string(to_string(units))},
      {"kernel", std::string(to_string(kernel))},
      {"kernel_head_dim", kernel_head_dim(isa, dense)},
      {"peak_fraction", bench::fraction_of_peak(dense_gflops, peak)},
      {"sparse_peak_fraction", bench::fraction_of_peak(kept_gflops, peak)},
      {"speedup_cpu_time", bench::speedup(dense_cpu_ms, sparse_cpu_ms)},
      {"dense_gflops_cpu_time", dense_gflops_cpu},
      {"sparse_gflops_on_kept_tiles_cpu_time", kept_gflops_cpu},
      {"peak_fraction_cpu_time", bench::fraction_of_peak(dense_gflops_cpu, peak)},
      {"sparse_peak_fraction_cpu_time", bench::fraction_of_peak(kept_gflops_cpu, peak)},
  });
  // dense_ms, sparse_ms (wall) and dense_cpu_ms, sparse_cpu_ms (process CPU): medians, with _min, _max and _runs.
  bench::add_timing(record, "dense_", dense_wall);
  bench::add_timing(record, "sparse_", sparse_wall);
  bench::add_timing(record, "dense_cpu_", dense_cpu);
  bench::add_timing(record, "sparse_cpu_", sparse_cpu);
  return record;
}

void run_bench_command(const BenchArgs& args) {
  STSA_CHECK(args.dist || (args.mask != "mixed" && args.mask != "routed"), InvalidArgument,
             "--mask ", args.mask, " needs --dist (one process runs one mask kind for all heads)");
  STSA_CHECK(args.backend == "cuda" || (args.kernel == "auto" && args.work_order == "auto" &&
                                         args.persistent_blocks == 0 && args.block_schedule == "round-robin"),
             InvalidArgument, "--kernel, --work-order, --persistent-blocks and --block-schedule set up the CUDA "
                              "kernel: they need --backend cuda");
  STSA_CHECK(!(args.dist && args.backend == "cuda"), InvalidArgument,
             "--dist runs the CPU backend on every rank; --backend cuda is single-process");
  STSA_CHECK(args.kv_heads == 0 || args.kv_heads == args.heads || args.backend == "cpu", InvalidArgument,
             "--kv-heads (grouped-query attention) runs on the CPU backend");
  if (args.backend == "cuda") {
    const nlohmann::json record = run_cuda_bench(args, /*progress=*/true);
    if (args.json)
      std::printf("%s\n", json_text(record).c_str());
    else
      print_cuda_bench(record);
    return;
  }
  if (args.dist) {
    const int code = run_dist_bench(args);
    if (code != 0) {
      std::fflush(stdout);
      std::exit(code);
    }
    return;
  }
  const nlohmann::json record = run_cpu_bench(args, /*progress=*/true);
  if (args.json)
    std::printf("%s\n", json_text(record).c_str());
  else
    print_text(record);
}

}  // namespace stsa::cli
