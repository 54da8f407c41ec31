// `stsa bench --backend cuda`: the CUDA backend, dense and sparse on the same
// random inputs as the CPU benchmark, timed in one run with CUDA events around
// each call enqueued on the default stream (after a warm-up; the start event
// waits until the call is enqueued, so the host's checks and launches are not
// timed) and checked against the fp64 reference on sampled rows. The GPU check
// (bench/gpu/check.sh) also times against PyTorch. Where the driver's NVML
// is there, a thread samples the SM clock meanwhile: each kernel's share of
// the tensor peak is taken at the clock it ran at (bench/nvml_clocks.hpp).
#include <cstdio>
#include <string>

#include "bench/figures.hpp"
#include "bench/nvml_clocks.hpp"
#include "bench/record.hpp"
#include "bench/timing_loop.hpp"
#include "cli/bench_shared.hpp"
#include "cli/commands.hpp"
#include "cli/options.hpp"
#include "stsa/error.hpp"
#include "stsa/plan.hpp"
#if defined(STSA_HAS_CUDA)
#include "bench/cuda/event_stopwatch.hpp"
#include "cli/device_tensor.hpp"
#include "stsa/cuda.hpp"
#endif

namespace stsa::cli {

#if defined(STSA_HAS_CUDA)
namespace {

bench::TimedRuns time_calls(const CudaBackend& backend, const AttentionCall& call, int repeats, Progress& progress) {
  bench::CudaEventStopwatch events;  // the default stream, where run_async(call, nullptr) enqueues
  bench::Stopwatch* clocks[] = {&events};
  const bench::TimedRuns runs = bench::time_runs(
      {.warmup = 1, .repeats = repeats}, [&] { backend.run_async(call, nullptr); }, clocks,
      [&](int done, int total) { progress.update(double(done) / total); });
  if (const std::string note = events.host_waits_note(); !note.empty())
    std::fprintf(stderr, "stsa: note: %s\n", note.c_str());
  return runs;
}

// The clock and power over one kernel's timed runs, and its share of the tensor
// peak at that clock; null without samples in its window.
nlohmann::json clock_record(const bench::ClockSampler& sampler, const bench::TimedRuns& runs, double flops,
                            const CudaDeviceInfo& device) {
  const std::optional<bench::ClockSummary> s = sampler.summary(runs.wall_from_s, runs.wall_to_s);
  if (!s) return nullptr;
  return {{"samples", s->samples},
          {"sm_mhz_mean", s->sm_mhz_mean},
          {"sm_mhz_min", s->sm_mhz_min},
          {"power_w_mean", s->power_w_mean},
          {"power_capped_share", s->power_capped_share},
          {"tensor_peak_share", bench::json_number(bench::tensor_peak_share(flops, runs[0].median_ms(), s->sm_mhz_mean,
                                                                     device.multiprocessors, device.major,
                                                                     device.minor))}};
}

}  // namespace

nlohmann::json run_cuda_bench(const BenchArgs& args, bool progress) {
  // Everything is checked before anything large is allocated.
  const BenchOptions options = parse_bench_options(args);
  const VideoLayout& layout = options.layout;
  const CudaKernel kernel = parse_cuda_kernel(args.kernel);
  const CudaWorkOrder work_order = parse_cuda_work_order(args.work_order);
  const CudaBlockSchedule block_schedule = parse_cuda_block_schedule(args.block_schedule);
  STSA_CHECK(options.dtype == DType::BF16 || options.dtype == DType::F16, Unsupported,
             "--backend cuda needs --dtype bf16 or fp16, got '", args.dtype, "'");
  STSA_CHECK(args.head_dim == 64 || args.head_dim == 128, Unsupported,
             "--backend cuda supports --head-dim 64 and 128, got ", args.head_dim);
  STSA_CHECK(args.tile == 128, Unsupported, "--backend cuda runs 128x128 tiles, got --tile ", args.tile);
  STSA_CHECK(args.threads == 0 && args.isa == "auto", InvalidArgument,
             "--threads and --isa choose the CPU kernel; they do not go with --backend cuda");
  STSA_CHECK(cuda_device_count() > 0, Unsupported, "--backend cuda: no CUDA device (", cuda_unavailable_reason(), ")");
  const CudaBackend backend(CudaBackendOptions{kernel, work_order, args.persistent_blocks, block_schedule});
  const CudaKernel resolved = backend.resolved_kernel();  // Unsupported when this GPU cannot run `kernel`
  const CudaDeviceInfo device = cuda_device_info();
  // Q, K, V and the two outputs (one dtype here: the GPU takes bf16 or fp16), and the two fp32 LSE.
  const double tensor_bytes = double(layout.batch) * double(layout.tokens()) * double(layout.heads) *
                              double(layout.head_dim) * double(element_size(options.dtype));
  const double needed = 5 * tensor_bytes + 2 * double(layout.batch * layout.heads * layout.tokens()) * sizeof(float);
  STSA_CHECK(needed < 0.8 * double(device.global_memory_bytes), ResourceError, "the benchmark tensors need ",
             needed / 1e9, " GB on the GPU, more than 80% of the ", double(device.global_memory_bytes) / 1e9, " GB of ",
             device.name);
  BenchCase c(options, args.seed);  // host inputs and outputs; the calls below are its calls on device copies

  const DeviceTensor dq = upload(c.q.view()), dk = upload(c.k.view()), dv = upload(c.v.view());
  const DeviceTensor do_dense = empty_like(c.o_dense.view()), do_sparse = empty_like(c.o_sparse.view());
  const std::size_t lse_bytes = std::size_t(layout.batch * layout.heads * layout.tokens()) * sizeof(float);
  DeviceBuffer dlse_dense(lse_bytes), dlse_sparse(lse_bytes);
  dlse_dense.fill_bytes(0xFF);  // NaN, as the outputs
  dlse_sparse.fill_bytes(0xFF);
  AttentionCall dense = c.dense, sparse = c.sparse;
  for (AttentionCall* call : {&dense, &sparse}) {
    call->q = dq.view;
    call->k = dk.view;
    call->v = dv.view;
  }
  dense.o = do_dense.view;
  dense.lse.data = static_cast<float*>(dlse_dense.data());
  sparse.o = do_sparse.view;
  sparse.lse.data = static_cast<float*>(dlse_sparse.data());
  for (const AttentionCall* call : {&dense, &sparse}) {
    const Support support = backend.supports(*call);
    STSA_CHECK(support.ok, Unsupported, "--backend cuda: ", support.why);
  }

  std::string no_clocks;
  const std::unique_ptr<bench::ClockSampler> sampler = bench::ClockSampler::open(device.pci_bus_id, &no_clocks);
  if (sampler) sampler->start();
  bench::TimedRuns dense_runs, sparse_runs;
  {
    Progress p("timing the dense kernel", progress);
    dense_runs = time_calls(backend, dense, args.repeats, p);
  }
  {
    Progress p("timing the sparse kernel", progress);
    sparse_runs = time_calls(backend, sparse, args.repeats, p);
  }
  if (sampler) sampler->stop();
  const bench::Samples &dense_t = dense_runs[0], &sparse_t = sparse_runs[0];

  // The outputs back on the host, checked as the CPU benchmark checks its own.
  do_dense.buffer.copy_to_host(c.o_dense.view().data, host_bytes(c.o_dense.view()));
  do_sparse.buffer.copy_to_host(c.o_sparse.view().data, host_bytes(c.o_sparse.view()));
  dlse_dense.copy_to_host(c.lse_dense.view().data, lse_bytes);
  dlse_sparse.copy_to_host(c.lse_sparse.view().data, lse_bytes);
  const BenchErrors errors = check_dense_and_sparse(c.dense, c.sparse, c.plan, args.check_rows, args.seed, progress);

  const bench::AttentionWork work = bench::attention_work(layout, *c.plan);
  const double dense_ms = dense_t.median_ms(), sparse_ms = sparse_t.median_ms();
  nlohmann::json record = bench_case_record(args, options, *c.plan, errors);
  record.update({
      {"backend", "cuda"},
      {"device", device.name},
      {"compute_capability", std::to_string(device.major) + "." + std::to_string(device.minor)},
      {"kernel", std::string(to_string(resolved))},
      {"timer", "cuda events"},
      {"work_order", std::string(to_string(work_order))},
      {"persistent_blocks", args.persistent_blocks},
      {"block_schedule", std::string(to_string(block_schedule))},
      {"speedup", bench::speedup(dense_ms, sparse_ms)},
      {"dense_tflops", bench::tflops(work.dense_flops, dense_ms)},
      {"sparse_tflops_on_kept_tiles", bench::tflops(work.kept_tile_flops, sparse_ms)},
      {"sparse_tflops_dense_equivalent", bench::tflops(work.dense_flops, sparse_ms)},
  });
  bench::add_timing(record, "dense_", dense_t);  // dense_ms (median), _min, _max, _runs
  bench::add_timing(record, "sparse_", sparse_t);
  if (sampler) {
    record["clocks"] = {{"board", sampler->board().name},
                        {"max_sm_mhz", sampler->board().max_sm_mhz},
                        {"power_limit_w", sampler->board().power_limit_w},
                        {"sampler_error", sampler->error()},
                        {"dense", clock_record(*sampler, dense_runs, work.dense_flops, device)},
                        {"sparse", clock_record(*sampler, sparse_runs, work.kept_tile_flops, device)}};
  } else {
    record["clocks"] = {{"unavailable", no_clocks}};
  }
  return record;
}

#else

nlohmann::json run_cuda_bench(const BenchArgs&, bool) {
  throw Unsupported(
      "this stsa was built without the CUDA backend (nvcc not found at configure time, or -DSTSA_CUDA=OFF)");
}

#endif

namespace {

void print_cuda_clocks(const nlohmann::json& clocks) {
  if (clocks.contains("unavailable")) {
    std::printf("SM clock not read: %s\n", clocks["unavailable"].get<std::string>().c_str());
    return;
  }
  if (!clocks.contains("dense")) return;
  std::printf("SM clock (board max %.2f GHz, power limit %.0f W; power as NVML reports it, a 1 s average):",
              json_double(clocks["max_sm_mhz"]) / 1e3, json_double(clocks["power_limit_w"]));
  for (const char* kernel : {"dense", "sparse"}) {
    const nlohmann::json& c = clocks[kernel];
    if (c.is_null()) {
      std::printf(" %s not sampled;", kernel);
      continue;
    }
    std::printf(" %s %.2f GHz, %.0f W, power-capped %.0f%% of the time, %.0f%% of the tensor peak at that clock;",
                kernel, json_double(c["sm_mhz_mean"]) / 1e3, json_double(c["power_w_mean"]),
                100 * json_double(c["power_capped_share"]), 100 * json_double(c["tensor_peak_share"]));
  }
  std::printf("\n");
}

}  // namespace

void print_cuda_bench(const nlohmann::json& r) {
  const auto f = [&](const char* key) { return json_double(r[key]); };
  std::printf("cuda backend: %s (compute capability %s), kernel %s\n", r["device"].get<std::string>().c_str(),
              r["compute_capability"].get<std::string>().c_str(), r["kernel"].get<std::string>().c_str());
  std::printf("grid %s: %lld tokens, batch %lld, %lld heads x %lld, %s\n", r["grid"].get<std::string>().c_str(),
              (long long)r["tokens"].get<std::int64_t>(), (long long)r["batch"].get<std::int64_t>(),
              (long long)r["heads"].get<std::int64_t>(), (long long)r["head_dim"].get<std::int64_t>(),
              r["dtype"].get<std::string>().c_str());
  std::printf("mask %s: kept fraction %.4f, tile density %.4f (%lld full, %lld partial tiles)\n",
              r["mask"].get<std::string>().c_str(), f("kept_fraction"), f("tile_density"),
              (long long)r["tiles_full"].get<std::int64_t>(), (long long)r["tiles_partial"].get<std::int64_t>());
  std::printf("dense : %9.3f ms  %6.1f TFLOP/s\n", f("dense_ms"), f("dense_tflops"));
  std::printf("sparse: %9.3f ms  %6.1f TFLOP/s on kept tiles, %.1f dense-equivalent\n", f("sparse_ms"),
              f("sparse_tflops_on_kept_tiles"), f("sparse_tflops_dense_equivalent"));
  std::printf("speedup %.2fx (ideal %.2fx: dense work / kept tiles' work, %.0f%% of it)\n", f("speedup"),
              f("ideal_speedup"), 100.0 * f("speedup") / f("ideal_speedup"));
  std::printf("vs fp64 reference on %lld rows: sparse rel L2 %.2e, max abs %.2e, LSE %.2e; dense rel L2 %.2e, "
              "max abs %.2e\n",
              (long long)r["check_rows"].get<std::int64_t>(), f("rel_l2_err"), f("max_abs_err"), f("lse_max_abs_err"),
              f("dense_rel_l2_err"), f("dense_max_abs_err"));
  print_cuda_clocks(r.value("clocks", nlohmann::json::object()));
}

}  // namespace stsa::cli
