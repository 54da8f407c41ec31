// stsa_gpu_route_bench: the overhead of routed attention on the GPU at one
// shape (default 1440p: 21 x 90 x 160 tokens, 12 heads, D = 128, bf16):
// routing (cuda_route over all heads) and the temporal heads' permutation
// against the attention itself (cuda_run_routed with given decisions: the
// first --temporal-heads heads temporal, the rest spatial, at --density).
// Warm-up, then the median of --repeats runs of each (statistics and figures
// from the shared benchmark harness, src/bench); prints one JSON record with the
// share (routing + permutation) / attention, with the temporal heads' O
// scatter fused into the kernel's stores (the default) and, interleaved, as its
// own pass (the two_step_ figures). Random inputs: the values
// do not change the amount of work, only the decisions, which are given here.
// With --graph, instead: the routed call (given decisions) eager against the
// same call captured into a CUDA graph and replayed, wall clock to completion
// each, and whether the replay writes the eager call's output to the bit.
#include <CLI/CLI.hpp>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/figures.hpp"
#include "bench/record.hpp"
#include "bench/samples.hpp"
#include "stsa/cuda.hpp"
#include "stsa/cuda_routing.hpp"
#include "stsa/dtype.hpp"
#include "stsa/error.hpp"
#include "stsa/routed.hpp"
#include "stsa/router.hpp"

namespace {

struct Options {
  std::int64_t frames = 21, height = 90, width = 160, heads = 12, head_dim = 128, temporal_heads = 6;
  double density = 0.1;
  int samples = 64;
  bool frame_window = false;
  int warmup = 1, repeats = 5;
  std::string kernel = "auto";  // attention kernel: auto, sm80, sm90, sm90-overlap or sm90-pingpong
  std::string work_order = "auto";
  std::string block_schedule = "round-robin";
  bool graph = false;
};

// A CUDA runtime call that must succeed (the benchmark's own calls; the library checks its own).
void cuda_ok(cudaError_t status, const char* what) {
  STSA_CHECK(status == cudaSuccess, stsa::Error, what, ": ", cudaGetErrorString(status));
}

double wall_ms(const std::function<void()>& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// The routed call eager (timed with events, so it waits for itself) and as a
// CUDA graph replay (launch, then wait), interleaved, wall clock each; the
// difference is what the host adds to an eager call that the device does not hide.
nlohmann::json graph_record(const stsa::CudaBackend& backend, stsa::PlanCache& plans, const stsa::RoutedCall& call,
                            const std::vector<stsa::HeadRoute>& decisions, std::int64_t temporal_heads,
                            const stsa::DeviceBuffer& o, const Options& opt) {
  // First, so that it outlives the graph (it holds the packed heads and the plans the graph reads).
  stsa::CudaRoutedWorkspace workspace(call, temporal_heads);
  struct Cleanup {
    cudaStream_t stream = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ~Cleanup() {
      if (exec) cudaGraphExecDestroy(exec);
      if (graph) cudaGraphDestroy(graph);
      if (stream) cudaStreamDestroy(stream);
    }
  } held;
  cuda_ok(cudaStreamCreateWithFlags(&held.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cudaStream_t stream = held.stream;
  stsa::RoutedResult eager;
  for (int i = 0; i <= opt.warmup; ++i)  // at least once: the plans and schedules on the device
    eager = stsa::cuda_run_routed(backend, plans, call, decisions, {}, stream, &workspace);
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  stsa::RoutedResult recorded;
  try {
    recorded = stsa::cuda_run_routed(backend, plans, call, decisions, {}, stream, &workspace);
  } catch (...) {  // end the capture, or every CUDA call after this one fails in global mode
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(stream, &partial) == cudaSuccess && partial) cudaGraphDestroy(partial);
    throw;
  }
  cuda_ok(cudaStreamEndCapture(stream, &held.graph), "cudaStreamEndCapture");
  std::size_t nodes = 0;
  cuda_ok(cudaGraphGetNodes(held.graph, nullptr, &nodes), "cudaGraphGetNodes");
  cuda_ok(cudaGraphInstantiate(&held.exec, held.graph, 0), "cudaGraphInstantiate");
  const auto replay = [&] {
    cuda_ok(cudaGraphLaunch(held.exec, stream), "cudaGraphLaunch");
    cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  };
  replay();  // the first launch uploads the graph

  // The replay writes what the eager call writes, to the bit (the kernels are deterministic).
  std::vector<unsigned char> eager_o(o.bytes()), replayed_o(o.bytes());
  stsa::cuda_run_routed(backend, plans, call, decisions, {}, stream, &workspace);
  cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // o is read through the legacy stream
  o.copy_to_host(eager_o.data(), o.bytes());
  cuda_ok(cudaMemsetAsync(o.data(), 0xFF, o.bytes(), stream), "cudaMemsetAsync");  // NaN
  replay();
  o.copy_to_host(replayed_o.data(), o.bytes());
  const bool same = std::memcmp(eager_o.data(), replayed_o.data(), o.bytes()) == 0;

  stsa::bench::Samples eager_wall, graph_wall, eager_device;
  for (int i = 0; i < opt.repeats; ++i) {
    eager_wall.ms.push_back(wall_ms([&] {
      eager = stsa::cuda_run_routed(backend, plans, call, decisions, {}, stream, &workspace);
    }));
    eager_device.ms.push_back(eager.attention_ms + eager.permutation_ms);
    graph_wall.ms.push_back(wall_ms(replay));
  }
  return {{"mode", "graph"},
          {"recorded_timed", recorded.timed},
          {"graph_nodes", nodes},
          {"kept_plans", workspace.kept_plans()},
          {"graph_matches_eager", same},
          {"eager_wall_ms", eager_wall.median_ms()},
          {"eager_device_ms", eager_device.median_ms()},  // the events around its steps
          {"graph_wall_ms", graph_wall.median_ms()},
          {"graph_over_eager", graph_wall.median_ms() / eager_wall.median_ms()},
          {"host_ms_saved", eager_wall.median_ms() - graph_wall.median_ms()}};
}

void fill_random(stsa::DeviceBuffer& buffer, std::uint64_t seed) {
  const std::size_t block = std::min<std::size_t>(buffer.bytes() / 2, std::size_t(1) << 24);
  std::vector<std::uint16_t> values(block);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  for (auto& v : values) v = stsa::float_to_bf16(normal(rng));
  for (std::size_t at = 0; at < buffer.bytes(); at += block * 2)
    buffer.copy_from_host(values.data(), std::min(block * 2, buffer.bytes() - at), at);
}

nlohmann::json run(const Options& opt) {
  STSA_CHECK(stsa::cuda_device_count() > 0, stsa::Unsupported, "no CUDA device (", stsa::cuda_unavailable_reason(), ")");
  stsa::VideoLayout layout{{opt.frames, opt.height, opt.width, 0, stsa::TextPlacement::After}, 1, opt.heads,
                           opt.head_dim};
  layout.validate();
  STSA_CHECK(opt.temporal_heads >= 0 && opt.temporal_heads <= opt.heads, stsa::InvalidArgument,
             "--temporal-heads must be in [0, heads]");
  const std::int64_t n = layout.tokens();
  const std::size_t elements = std::size_t(n * layout.heads * layout.head_dim);
  stsa::DeviceBuffer q(elements * 2), k(elements * 2), v(elements * 2), o(elements * 2);
  fill_random(q, 1);
  fill_random(k, 2);
  fill_random(v, 3);
  auto view = [&](const stsa::DeviceBuffer& b) {
    return stsa::TensorView::contiguous(b.data(), stsa::DType::BF16, 1, n, layout.heads, layout.head_dim,
                                        stsa::MemoryLayout::BNHD);
  };
  const stsa::RoutedCall call{layout, view(q), view(k), view(v), view(o), {}, 0.f};

  stsa::RouterOptions ro;
  ro.samples = opt.samples;
  ro.spatial_density = ro.temporal_density = ro.frame_window_density = opt.density;
  ro.try_frame_window = opt.frame_window;
  const stsa::Router router(ro);
  std::vector<stsa::HeadRoute> decisions;
  for (std::int64_t h = 0; h < layout.heads; ++h) {
    stsa::HeadRoute d;
    d.route = h < opt.temporal_heads ? stsa::Route::Temporal : stsa::Route::Spatial;
    d.spec = stsa::route_spec(layout.grid, d.route, ro);
    decisions.push_back(d);
  }

  const stsa::CudaBackend backend(
      stsa::CudaBackendOptions{stsa::parse_cuda_kernel(opt.kernel), stsa::parse_cuda_work_order(opt.work_order), 0,
                               stsa::parse_cuda_block_schedule(opt.block_schedule)});
  stsa::PlanCache plans;
  if (opt.graph) {
    nlohmann::json record = graph_record(backend, plans, call, decisions, opt.temporal_heads, o, opt);
    record["device"] = stsa::cuda_device_info().name;
    record["shape"] = layout.grid.describe();
    record["heads"] = layout.heads;
    record["temporal_heads"] = opt.temporal_heads;
    record["density"] = opt.density;
    record["kernel"] = std::string(stsa::to_string(backend.resolved_kernel()));
    return record;
  }
  stsa::bench::Samples routing, routing_device, permutation, attention, two_step_permutation, two_step_attention;
  double routing_flops = 0;
  bool scatter_fused = false;
  stsa::RoutedOptions two_step;  // the O scatter as its own pass, interleaved with the default (fused) calls
  two_step.fuse_scatter = false;
  for (int i = 0; i < opt.warmup + opt.repeats; ++i) {
    const stsa::RoutingReport report = stsa::cuda_route(router, layout, call.q, call.k, call.v);
    const stsa::RoutedResult r = stsa::cuda_run_routed(backend, plans, call, decisions);
    const stsa::RoutedResult t = stsa::cuda_run_routed(backend, plans, call, decisions, two_step);
    if (i < opt.warmup) continue;
    routing.ms.push_back(report.routing_ms);
    routing_device.ms.push_back(report.routing_device_ms);
    routing_flops = report.flops;
    permutation.ms.push_back(r.permutation_ms);
    attention.ms.push_back(r.attention_ms);
    scatter_fused = r.scatter_fused;
    two_step_permutation.ms.push_back(t.permutation_ms);
    two_step_attention.ms.push_back(t.attention_ms);
  }
  const double routing_ms = routing.median_ms(), permutation_ms = permutation.median_ms(),
               attention_ms = attention.median_ms();
  const stsa::CudaDeviceInfo info = stsa::cuda_device_info();
  nlohmann::json record = {{"device", info.name},
          {"shape", layout.grid.describe()},
          {"heads", layout.heads},
          {"head_dim", layout.head_dim},
          {"density", opt.density},
          {"samples", opt.samples},
          {"candidates", opt.frame_window ? 3 : 2},
          {"temporal_heads", opt.temporal_heads},
          {"kernel", std::string(stsa::to_string(backend.resolved_kernel()))},
          {"work_order", std::string(stsa::to_string(backend.options().work_order))},
          {"block_schedule", std::string(stsa::to_string(backend.options().block_schedule))},
          {"routing_ms", routing_ms},
          {"routing_tflops", stsa::bench::json_number(stsa::bench::tflops(routing_flops, routing_ms))},
          // The router's kernels alone; routing_ms less this is host work, copies and the wait.
          {"routing_device_ms", routing_device.median_ms()},
          {"permutation_ms", permutation_ms},
          {"attention_ms", attention_ms},
          {"overhead_share", (routing_ms + permutation_ms) / attention_ms},
          // The issue does not say how many heads are temporal: the worst case, every
          // head permuted (the permutation time scaled; attention does the same work).
          {"overhead_share_all_temporal",
           stsa::bench::json_number(
               (routing_ms + permutation_ms * double(layout.heads) / double(opt.temporal_heads)) / attention_ms)},
          {"target_share", 0.03},
          // The default call stores the temporal heads' O and LSE from the kernel (no scatter
          // pass); the same call with the scatter as its own pass, for comparison:
          {"scatter_fused", scatter_fused},
          {"two_step_permutation_ms", two_step_permutation.median_ms()},
          {"two_step_attention_ms", two_step_attention.median_ms()},
          {"two_step_overhead_share",
           (routing_ms + two_step_permutation.median_ms()) / two_step_attention.median_ms()}};
  stsa::bench::add_timing(record, "routing_", routing);
  stsa::bench::add_timing(record, "permutation_", permutation);
  stsa::bench::add_timing(record, "attention_", attention);
  return record;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPU routing + permutation against attention (routed attention overhead)"};
  Options opt;
  app.add_option("--frames", opt.frames);
  app.add_option("--height", opt.height);
  app.add_option("--width", opt.width);
  app.add_option("--heads", opt.heads);
  app.add_option("--head-dim", opt.head_dim);
  app.add_option("--temporal-heads", opt.temporal_heads, "heads run temporal (permuted); the rest spatial");
  app.add_option("--density", opt.density, "kept density of every candidate and of the run masks");
  app.add_option("--samples", opt.samples, "sampled query rows per head");
  app.add_flag("--frame-window", opt.frame_window, "also try the frame-window candidate");
  app.add_option("--kernel", opt.kernel, "attention kernel: auto, sm80, sm90, sm90-overlap or sm90-pingpong");
  app.add_option("--work-order", opt.work_order, "attention work order: auto, across-heads, head-by-head or heavy-first");
  app.add_option("--block-schedule", opt.block_schedule, "persistent blocks' schedule: balanced, round-robin or snake");
  app.add_option("--warmup", opt.warmup);
  app.add_option("--repeats", opt.repeats);
  app.add_flag("--graph", opt.graph, "the routed call eager against its CUDA graph replay (no routing)");
  CLI11_PARSE(app, argc, argv);
  try {
    stsa::parse_cuda_kernel(opt.kernel);  // bad options fail before the GPU is looked for
    stsa::parse_cuda_work_order(opt.work_order);
    stsa::parse_cuda_block_schedule(opt.block_schedule);
    STSA_CHECK(opt.warmup >= 0 && opt.repeats >= 1, stsa::InvalidArgument, "--warmup must be >= 0 and --repeats >= 1");
    const nlohmann::json record = run(opt);
    std::cout << record.dump(2) << "\n";
    // A replay that does not write what the eager call writes is a failure, not a figure.
    if (record.contains("graph_matches_eager") && !record["graph_matches_eager"].get<bool>()) return 1;
  } catch (const std::exception& e) {  // stsa::Error, and bad_alloc or a JSON error too
    std::cerr << "stsa_gpu_route_bench: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
