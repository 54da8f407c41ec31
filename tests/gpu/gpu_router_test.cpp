// The GPU router (cuda_route) against the CPU Router: the same decisions on
// synthetic heads of known kind, errors within the rounding of P to the input
// type, identical flops; NaN heads stay dense. GPU routed attention against the
// fp64 reference on awkward shapes (ragged tiles, text before and after, one
// frame). Bad input throws before any launch (also without a GPU).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "bench/cuda/event_stopwatch.hpp"
#include "gpu/gpu_support.hpp"
#include "stsa/cuda.hpp"
#include "stsa/cuda_routing.hpp"
#include "stsa/error.hpp"
#include "stsa/routed.hpp"
#include "stsa/router.hpp"
#include "stsa/synth.hpp"
#include "support/routed_cases.hpp"

namespace stsa {
namespace {

using gpu_testing::tensor_bytes;

struct DeviceTensor {
  DeviceBuffer buffer;
  TensorView view;
  explicit DeviceTensor(const TensorView& host) : buffer(tensor_bytes(host)), view(host) {
    buffer.copy_from_host(host.data, tensor_bytes(host));
    view.data = buffer.data();
  }
};

// GPU and CPU reports of the same call agree: decisions (unless the two best
// candidates are within the rounding tolerance of each other), each error, flops.
void expect_same_report(const RoutingReport& gpu, const RoutingReport& cpu, double max_abs_v, DType dtype,
                        const std::string& label) {
  SCOPED_TRACE(label);
  ASSERT_EQ(gpu.heads.size(), cpu.heads.size());
  EXPECT_EQ(gpu.sampled_rows, cpu.sampled_rows);
  EXPECT_EQ(gpu.flops, cpu.flops);  // integer counts: exact
  // P is rounded to the input type before P.V (the CPU router keeps it in fp32).
  // The rounding errors are many and independent, so the errors move far less
  // than their worst case (2 u max|v| per element): a host emulation of the
  // kernels as written moved each MSE by at most 6.6e-4 of itself on these
  // cases. The bounds below leave ~45x headroom over that and still catch a
  // dropped ragged key tile or a missing accumulator rescale, which a
  // worst-case bound (up to 5x the MSE itself at 9,463 keys) let through.
  const double u_v = unit_roundoff(dtype) * std::max(1.0, max_abs_v);
  for (std::size_t h = 0; h < cpu.heads.size(); ++h) {
    const HeadRoute& g = gpu.heads[h];
    const HeadRoute& c = cpu.heads[h];
    ASSERT_EQ(g.candidates.size(), c.candidates.size());
    bool close_call = false;
    for (std::size_t i = 0; i < c.candidates.size(); ++i) {
      const CandidateError& ge = g.candidates[i];
      const CandidateError& ce = c.candidates[i];
      EXPECT_EQ(ge.route, ce.route);
      EXPECT_EQ(ge.spec, ce.spec);
      if (std::isnan(ce.mse)) {
        EXPECT_TRUE(std::isnan(ge.mse)) << "head " << h;
        continue;
      }
      const double mse_tol = 0.03 * ce.mse + 1e-3 * u_v * u_v;
      EXPECT_NEAR(ge.mse, ce.mse, mse_tol) << "head " << h << " " << ce.spec.describe() << ": difference / bound "
                                           << std::abs(ge.mse - ce.mse) / mse_tol;
      const double rel_tol = 0.015 * ce.rel_l2 + 1e-4;
      EXPECT_NEAR(ge.rel_l2, ce.rel_l2, rel_tol) << "head " << h << " " << ce.spec.describe()
                                                 << ": difference / bound " << std::abs(ge.rel_l2 - ce.rel_l2) / rel_tol;
      for (std::size_t j = 0; j < i; ++j)
        close_call = close_call || std::abs(ce.mse - c.candidates[j].mse) <= 2 * mse_tol;
    }
    if (!close_call) {
      EXPECT_EQ(g.route, c.route) << "head " << h;
      EXPECT_EQ(g.spec, c.spec) << "head " << h;
    }
  }
}

TEST(GpuRouter, DecidesLikeTheCpuRouterOnSyntheticHeads) {
  STSA_REQUIRE_GPU();
  struct Case {
    VideoGrid grid;
    std::int64_t batch, heads, head_dim;
    DType dtype;
    bool frame_window;
  };
  const std::vector<Case> cases = {
      {{13, 12, 16, 0, TextPlacement::After}, 1, 16, 64, DType::BF16, false},
      {{9, 10, 14, 7, TextPlacement::Before}, 2, 6, 128, DType::BF16, true},   // text, two batch entries
      // 1,006 tokens: ragged tiles. (With 7 frames instead of 11 the frame-0
      // anchor alone keeps more than the target density: every candidate would
      // be the bare anchor and every head dense.)
      {{11, 7, 13, 5, TextPlacement::After}, 1, 6, 80, DType::F16, false},
  };
  const std::uint64_t seed = testing::fresh_seed();
  for (const Case& c : cases) {
    const synth::Options o{.grid = c.grid, .batch = c.batch, .heads = c.heads, .head_dim = c.head_dim,
                           .dtype = c.dtype, .seed = seed};
    const synth::Data data = synth::make_video_tokens(o);
    RouterOptions ro;
    ro.seed = seed;
    ro.samples = 40;  // a ragged row block
    ro.try_frame_window = c.frame_window;
    const Router router(ro);
    const RoutingReport cpu = router.route(data.layout, data.q.view(), data.k.view(), data.v.view());
    const DeviceTensor q(data.q.view()), k(data.k.view()), v(data.v.view());
    const RoutingReport gpu = cuda_route(router, data.layout, q.view, k.view, v.view);
    const std::string label = c.grid.describe() + " D=" + std::to_string(c.head_dim) + " seed " + std::to_string(seed);
    expect_same_report(gpu, cpu, gpu_testing::max_abs(data.v.view()), c.dtype, label);
    // The kernels' device time is part of the call's wall time.
    EXPECT_GT(gpu.routing_device_ms, 0.0) << label;
    EXPECT_LE(gpu.routing_device_ms, gpu.routing_ms) << label;
    EXPECT_EQ(cpu.routing_device_ms, 0.0) << label;
    // Against the known kinds: as good as the CPU router (it may differ only on close calls).
    int gpu_correct = 0, cpu_correct = 0;
    for (std::size_t h = 0; h < gpu.heads.size(); ++h) {
      gpu_correct += gpu.heads[h].route == data.truth[h];
      cpu_correct += cpu.heads[h].route == data.truth[h];
    }
    EXPECT_GE(gpu_correct, cpu_correct - 1) << label;
    EXPECT_GT(cpu_correct, 0) << label;
  }
}

// Random heads, both storage orders, a subset of heads, several key splits.
// Without the anchor on the short videos, and with few text tokens: otherwise
// frame 0 or the text alone keeps more than the target densities, every
// candidate is the bare anchor and the band predicate never runs.
struct RandomCase {
  VideoLayout layout;
  DType dtype;
  TokenOrder order;
  int samples;
  bool anchor;
  MemoryLayout memory = MemoryLayout::BNHD;
  float softmax_scale = 0.f;  // 0: 1 / sqrt(D)
  bool frame_window = true;   // three candidates (else two: another block shape of the partials kernel)
  double candidate_density = -1;  // every candidate's density; < 0: spatial 0.2, temporal 0.3, frame window 0.4
};

void expect_routes_like_the_cpu(const RandomCase& c, std::uint64_t seed) {
  testing::Problem p = testing::make_problem(
      c.layout, c.dtype,
      std::vector<HeadMask>(std::size_t(c.layout.heads), HeadMask{MaskSpec::dense(), c.order, nullptr, true}), seed,
      c.memory);
  RouterOptions ro;
  ro.samples = c.samples;
  ro.seed = seed;
  ro.try_frame_window = c.frame_window;
  ro.spatial_density = 0.2;
  ro.temporal_density = 0.3;
  ro.frame_window_density = 0.4;
  if (c.candidate_density >= 0)
    ro.spatial_density = ro.temporal_density = ro.frame_window_density = c.candidate_density;
  ro.anchor = c.anchor;
  const Router router(ro);
  const AttentionCall call = p.call();
  const std::vector<std::int64_t> heads =
      c.layout.heads > 2 ? std::vector<std::int64_t>{2, 0} : std::vector<std::int64_t>{};
  const RoutingReport cpu = router.route(c.layout, call.q, call.k, call.v, c.order, c.softmax_scale, heads);
  const DeviceTensor q(call.q), k(call.k), v(call.v);
  const RoutingReport gpu = cuda_route(router, c.layout, q.view, k.view, v.view, c.order, c.softmax_scale, heads);
  expect_same_report(gpu, cpu, gpu_testing::max_abs(call.v), c.dtype, p.label + " " + std::string(to_string(c.order)));
}

// Three candidates, then two: the partials kernel's two block shapes.
void expect_both_block_shapes_route_like_the_cpu(RandomCase c, std::uint64_t seed) {
  c.frame_window = true;
  expect_routes_like_the_cpu(c, seed);
  c.frame_window = false;
  expect_routes_like_the_cpu(c, seed);
}

const RandomCase kSmallSpatialMajorCase = {
    {{5, 7, 9, 13, TextPlacement::Before}, 2, 4, 128}, DType::BF16, TokenOrder::SpatialMajor, 33, false};

TEST(GpuRouter, ErrorsMatchTheCpuRouterOnRandomAwkwardShapes) {
  STSA_REQUIRE_GPU();
  const std::vector<RandomCase> cases = {
      {{{1, 9, 10, 0, TextPlacement::After}, 1, 3, 64}, DType::BF16, TokenOrder::FrameMajor, 24, false},  // one frame
      kSmallSpatialMajorCase,
      {{{4, 5, 6, 12, TextPlacement::After}, 1, 2, 32}, DType::F16, TokenOrder::FrameMajor, 64, false},
      {{{7, 30, 45, 13, TextPlacement::Before}, 1, 3, 112}, DType::BF16, TokenOrder::FrameMajor, 64, true},  // 9,463 keys
      // Head-major tensors at D = 16 with a softmax scale of its own.
      {{{3, 6, 7, 5, TextPlacement::After}, 1, 3, 16}, DType::BF16, TokenOrder::FrameMajor, 40, false,
       MemoryLayout::BHND, 0.3f},
      // Spatial-major storage with the frame-0 anchor (frame 0 is spread over the
      // positions); 16 frames, so the anchor keeps less than the densities (bands 10, 28).
      {{{16, 4, 5, 4, TextPlacement::Before}, 1, 3, 64}, DType::F16, TokenOrder::SpatialMajor, 48, true},
      // Three batch entries and two samples: some entry has no sampled row.
      {{{3, 5, 6, 0, TextPlacement::After}, 3, 3, 64}, DType::BF16, TokenOrder::FrameMajor, 2, false},
      // 150 samples: three row blocks of 64 rows (the last ragged), each read by two blocks of 32 rows.
      {{{6, 9, 11, 5, TextPlacement::After}, 1, 3, 128}, DType::BF16, TokenOrder::FrameMajor, 150, true},
      // The same with two candidates (one block per row block), fp16, spatial-major, two batch entries.
      {{{6, 9, 11, 5, TextPlacement::After}, 2, 3, 128}, DType::F16, TokenOrder::SpatialMajor, 150, true,
       MemoryLayout::BNHD, 0.f, false},
      {{{5, 7, 9, 13, TextPlacement::Before}, 1, 4, 64}, DType::BF16, TokenOrder::FrameMajor, 33, false,
       MemoryLayout::BHND, 0.f, false},
      // More samples than the 21 tokens: every position sampled once, text rows and frame 0's included.
      {{{2, 3, 3, 3, TextPlacement::Before}, 2, 3, 64}, DType::BF16, TokenOrder::SpatialMajor, 64, true},
  };
  const std::uint64_t seed = testing::fresh_seed();
  for (const RandomCase& c : cases) expect_routes_like_the_cpu(c, seed);
}

// What compute-sanitizer runs on the routing kernels (bench/gpu/check.sh): two
// small calls, every kernel of the router touched, with 973 keys in 16 tiles,
// so the keys are split over several blocks and the combine merges them; with
// three candidates and with two (the partials kernel's two block shapes).
TEST(GpuRouterSanitize, OneSmallRoute) {
  STSA_REQUIRE_GPU();
  const RandomCase split_keys = {
      {{5, 12, 16, 13, TextPlacement::Before}, 2, 4, 128}, DType::BF16, TokenOrder::SpatialMajor, 33, false};
  expect_both_block_shapes_route_like_the_cpu(split_keys, testing::fresh_seed());
}

TEST(GpuRouter, NonFiniteScoresKeepTheHeadDense) {
  STSA_REQUIRE_GPU();
  const VideoLayout layout{{4, 4, 4, 0, TextPlacement::After}, 1, 2, 64};
  testing::Problem p = testing::make_problem(layout, DType::BF16, std::vector<HeadMask>(2), 4);
  for (std::int64_t n = 0; n < layout.tokens(); ++n) p.k.view().store(0, n, 1, 0, NAN);
  RouterOptions lenient;
  lenient.max_rel_l2 = 100;
  lenient.samples = 16;
  const AttentionCall call = p.call();
  const DeviceTensor q(call.q), k(call.k), v(call.v);
  const RoutingReport r = cuda_route(Router(lenient), layout, q.view, k.view, v.view);
  EXPECT_EQ(r.heads[1].route, Route::Dense);
  EXPECT_TRUE(std::isnan(r.heads[1].candidates[0].mse));
  EXPECT_TRUE(std::isnan(r.heads[1].candidates[0].rel_l2));
  EXPECT_NE(r.heads[0].route, Route::Dense);
}

// Candidates that allow a sampled row no key (density 0, no anchor, no text):
// every split's maximum is -inf for them, their output 0 and their error the
// dense output's, as on the CPU; with both block shapes of the partials kernel.
TEST(GpuRouter, CandidatesThatAllowNoKeyMatchTheCpu) {
  STSA_REQUIRE_GPU();
  RandomCase c = {{{5, 12, 16, 0, TextPlacement::After}, 1, 3, 64}, DType::BF16, TokenOrder::FrameMajor, 40, false};
  c.candidate_density = 0;
  expect_both_block_shapes_route_like_the_cpu(c, testing::fresh_seed());
}

// One NaN in one key of a late split (head 1), and one key whose scores are all
// -inf (head 2: q's channel 0 positive, the key's -inf): both heads are
// non-finite and dense, as on the CPU, while head 0 routes with finite errors.
// 1,260 keys in 20 tiles: five key splits on an H200, two or more on any GPU, the
// poisoned key never in the first (tests/cuda_routing_splits_test.cpp), so the
// combine meets one poisoned split among clean ones.
TEST(GpuRouter, OneNonFiniteKeyInOneSplitKeepsTheHeadDense) {
  STSA_REQUIRE_GPU();
  const VideoLayout layout{{9, 10, 14, 0, TextPlacement::After}, 1, 3, 64};
  testing::Problem p =
      testing::make_problem(layout, DType::BF16, std::vector<HeadMask>(3), testing::fresh_seed());
  p.k.view().store(0, 1100, 1, 5, NAN);
  for (std::int64_t n = 0; n < layout.tokens(); ++n)
    p.q.view().store(0, n, 2, 0, 0.5f + std::abs(p.q.view().load(0, n, 2, 0)));
  p.k.view().store(0, 300, 2, 0, -INFINITY);
  RouterOptions lenient;
  lenient.max_rel_l2 = 100;
  lenient.samples = 40;
  const Router router(lenient);
  const AttentionCall call = p.call();
  const RoutingReport cpu = router.route(layout, call.q, call.k, call.v);
  const DeviceTensor q(call.q), k(call.k), v(call.v);
  const RoutingReport gpu = cuda_route(router, layout, q.view, k.view, v.view);
  expect_same_report(gpu, cpu, gpu_testing::max_abs(call.v), DType::BF16, p.label);
  for (std::size_t h : {1u, 2u}) {
    EXPECT_EQ(gpu.heads[h].route, Route::Dense) << "head " << h;
    EXPECT_TRUE(std::isnan(gpu.heads[h].candidates[0].mse)) << "head " << h;
  }
  EXPECT_TRUE(std::isfinite(gpu.heads[0].candidates[0].mse));
}

// Runs without a GPU too: the checks come before any device work.
TEST(GpuRouter, RejectsBadInputBeforeLaunching) {
  const VideoLayout layout{{3, 4, 4, 0, TextPlacement::After}, 1, 2, 64};
  RouterOptions ro;
  ro.samples = 8;
  const Router router(ro);
  testing::Problem f32 = testing::make_problem(layout, DType::F32, std::vector<HeadMask>(2), 1);
  AttentionCall c = f32.call();
  EXPECT_THROW(cuda_route(router, layout, c.q, c.k, c.v), Unsupported);  // fp32
  testing::Problem bf16 = testing::make_problem(layout, DType::BF16, std::vector<HeadMask>(2), 1);
  c = bf16.call();
  EXPECT_THROW(cuda_route(router, layout, c.q, c.k, c.v), Unsupported);  // host memory (or no GPU)
  VideoLayout other = layout;
  other.grid.frames = 4;
  EXPECT_THROW(cuda_route(router, other, c.q, c.k, c.v), InvalidArgument);  // shape
  VideoLayout huge = layout;
  huge.grid.frames = INT_MAX / 16;  // 2^31 - 16 tokens: a valid layout, but one tile past it is not 32-bit
  EXPECT_THROW(cuda_route(router, huge, c.q, c.k, c.v), Unsupported);
  const std::vector<std::int64_t> bad_head = {2};
  EXPECT_THROW(cuda_route(router, layout, c.q, c.k, c.v, TokenOrder::FrameMajor, 0.f, bad_head), InvalidArgument);
  const VideoLayout odd{{3, 4, 4, 0, TextPlacement::After}, 1, 2, 72};  // head dim not a multiple of 16
  testing::Problem p72 = testing::make_problem(odd, DType::BF16, std::vector<HeadMask>(2), 1);
  c = p72.call();
  EXPECT_THROW(cuda_route(router, odd, c.q, c.k, c.v), Unsupported);
  if (cuda_device_count() == 0) return;
  // Device memory, but misaligned rows: a view that starts one element in.
  const DeviceTensor q(bf16.call().q);
  TensorView shifted = q.view;
  shifted.data = static_cast<std::byte*>(shifted.data) + 2;
  c = bf16.call();
  EXPECT_THROW(cuda_route(router, layout, shifted, q.view, q.view), Unsupported);
  EXPECT_THROW(cuda_route(router, layout, q.view, c.k, q.view), Unsupported);  // k on the host
}

RoutedCall routed_call(const AttentionCall& c) { return RoutedCall{c.layout, c.q, c.k, c.v, c.o, c.lse, c.softmax_scale}; }

// Given decisions cycling through every route, against the fp64 reference:
// the temporal heads' scatter fused into the attention's stores (the default)
// and as its own pass, on the default kernel and the portable one, with fp32,
// bf16 and fp16 outputs (the fused stores take the output's type from the
// caller's O, not from the packed call, which has none).
TEST(GpuRoutedAttention, GivenDecisionsMatchTheReferenceOnAwkwardShapes) {
  STSA_REQUIRE_GPU();
  struct Case {
    VideoLayout layout;
    DType in, out;
  };
  const std::vector<Case> cases = {
      {{{1, 7, 9, 0, TextPlacement::After}, 1, 4, 64}, DType::BF16, DType::F32},     // one frame (no temporal order)
      {{{5, 7, 9, 13, TextPlacement::Before}, 2, 5, 128}, DType::BF16, DType::BF16},  // text before, two batch entries
      {{{4, 5, 6, 70, TextPlacement::After}, 1, 4, 64}, DType::F16, DType::F16},     // text after
      {{{6, 11, 13, 0, TextPlacement::After}, 1, 4, 128}, DType::BF16, DType::F32},  // 858 tokens
  };
  const std::uint64_t seed = testing::fresh_seed();
  for (const CudaKernel kernel : {CudaKernel::Auto, CudaKernel::Sm80}) {
    const CudaBackend backend(CudaBackendOptions{kernel});
    for (const bool fuse : {true, false}) {
      RoutedOptions options;
      options.fuse_scatter = fuse;
      for (const auto& [layout, in, out] : cases) {
        const testing::CyclingDecisions given = testing::cycling_decisions(layout);
        const std::vector<HeadRoute>& decisions = given.decisions;
        testing::Problem p =
            testing::make_problem(layout, in, given.reference_masks, seed, MemoryLayout::BNHD, out);
        SCOPED_TRACE(::testing::Message() << to_string(kernel) << (fuse ? ", scatter fused, " : ", scatter pass, ")
                                        << p.label);
        gpu_testing::DeviceProblem d(p);
        PlanCache plans;
        const RoutedResult r = cuda_run_routed(backend, plans, routed_call(d.call), decisions, options);
        EXPECT_TRUE(d.o.guards_intact() && d.lse.guards_intact());
        d.download_into(p);
        gpu_testing::expect_matches_reference(p);
        std::int64_t temporal = 0;
        for (const auto& x : decisions) temporal += x.route == Route::Temporal;
        EXPECT_EQ(std::int64_t(r.temporal.size()), temporal);
        EXPECT_EQ(r.scatter_fused, fuse && temporal > 0);
        EXPECT_GT(r.attention_ms, 0.0);
        if (temporal > 0) {
          EXPECT_GT(r.permutation_bytes, 0.0);
          EXPECT_GT(r.permutation_ms, 0.0);
        }
      }
    }
  }
}

// Every head temporal (so only the packed call runs, nothing in place), head-major
// tensors, bf16 output, against the reference; then the same call without LSE:
// the same O to the bit, and the LSE buffer never written.
TEST(GpuRoutedAttention, AllTemporalHeadMajorAndWithoutLse) {
  STSA_REQUIRE_GPU();
  const VideoLayout layout{{5, 7, 9, 13, TextPlacement::Before}, 1, 3, 64};
  RouterOptions options;
  options.temporal_density = 0.3;
  std::vector<HeadRoute> decisions;
  std::vector<HeadMask> masks;
  for (std::int64_t h = 0; h < layout.heads; ++h) {
    HeadRoute d;
    d.route = Route::Temporal;
    d.spec = route_spec(layout.grid, Route::Temporal, options);
    decisions.push_back(d);
    masks.push_back(HeadMask{d.spec, TokenOrder::FrameMajor, nullptr, true});
  }
  testing::Problem p =
      testing::make_problem(layout, DType::BF16, masks, testing::fresh_seed(), MemoryLayout::BHND, DType::BF16);
  gpu_testing::DeviceProblem with_lse(p), without_lse(p);
  const CudaBackend backend;
  PlanCache plans;
  const RoutedResult r = cuda_run_routed(backend, plans, routed_call(with_lse.call), decisions);
  EXPECT_EQ(std::int64_t(r.temporal.size()), layout.heads);
  RoutedCall no_lse = routed_call(without_lse.call);
  no_lse.lse = LseView{};
  cuda_run_routed(backend, plans, no_lse, decisions);
  EXPECT_TRUE(with_lse.o.guards_intact() && without_lse.o.guards_intact() && without_lse.lse.guards_intact());
  with_lse.download_into(p);
  gpu_testing::expect_matches_reference(p);
  gpu_testing::expect_same_output_and_no_lse(with_lse, without_lse);
}

// A stream the legacy default stream does not wait for, and that does not wait for it.
class NonBlockingStream {
 public:
  NonBlockingStream() { EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess); }
  // Checked without throwing: a failed EXPECT only marks the test, which is still running here.
  ~NonBlockingStream() {
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    }
  }
  NonBlockingStream(const NonBlockingStream&) = delete;
  NonBlockingStream& operator=(const NonBlockingStream&) = delete;
  void* get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Routing and the routed call enqueue everything on the caller's stream: on a
// non-blocking one, a step put on the default stream instead (a memset, a
// copy, a kernel) would not be ordered with the rest, and the outputs would show it.
TEST(GpuRoutedAttention, RunsOnANonBlockingStream) {
  STSA_REQUIRE_GPU();
  const testing::SyntheticRoutedCase c = testing::synthetic_routed_case(DType::BF16, testing::fresh_seed());
  testing::Problem p = c.problem();
  gpu_testing::DeviceProblem d(p);
  const NonBlockingStream stream;
  const RoutingReport routes =
      cuda_route(c.router, p.layout, d.call.q, d.call.k, d.call.v, TokenOrder::FrameMajor, 0.f, {}, stream.get());
  const CudaBackend backend;
  PlanCache plans;
  const RoutedResult r = cuda_run_routed(backend, plans, routed_call(d.call), routes.heads, {}, stream.get());
  ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.get())), cudaSuccess);
  EXPECT_FALSE(r.temporal.empty());  // the permutation ran on the stream too
  EXPECT_TRUE(d.o.guards_intact() && d.lse.guards_intact());
  for (std::size_t h = 0; h < routes.heads.size(); ++h)  // the reference under the GPU's own decisions
    p.heads[h] = HeadMask{routes.heads[h].spec, TokenOrder::FrameMajor, nullptr, true};
  d.download_into(p);
  gpu_testing::expect_matches_reference(p);
}

// A CUDA graph cannot hold routing (its errors come back to the host), nor a
// routed call without a workspace (scratch allocated during the capture would
// belong to the graph, and the recorded plans must outlive it): on a capturing
// stream each is refused before anything is enqueued, and the caller's capture
// stays intact (global mode, PyTorch's default). A warm-up first, so that no
// refusal can come from a plan not yet uploaded.
TEST(GpuRoutedAttention, RefusedDuringGraphCaptureWithTheCaptureIntact) {
  STSA_REQUIRE_GPU();
  const testing::SyntheticRoutedCase c = testing::synthetic_routed_case(DType::BF16, testing::fresh_seed());
  testing::Problem p = c.problem();
  gpu_testing::DeviceProblem d(p);
  const NonBlockingStream stream;
  const auto capturing = static_cast<cudaStream_t>(stream.get());
  const CudaBackend backend;
  PlanCache plans;
  const RoutingReport routes =
      cuda_route(c.router, p.layout, d.call.q, d.call.k, d.call.v, TokenOrder::FrameMajor, 0.f, {}, stream.get());
  cuda_run_routed(backend, plans, routed_call(d.call), routes.heads, {}, stream.get());
  ASSERT_EQ(cudaStreamSynchronize(capturing), cudaSuccess);
  ASSERT_GT(testing::count_routes(routes.heads, Route::Temporal), 0);
  PolicyOptions po;
  po.router = c.router.options();
  Policy policy(po);

  ASSERT_EQ(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeGlobal), cudaSuccess);
  const auto expect_refused = [](const char* what, const auto& call) {
    try {
      call();
      ADD_FAILURE() << what << " was not refused during a capture";
    } catch (const Unsupported& e) {
      EXPECT_NE(std::string(e.what()).find("captured into a CUDA graph"), std::string::npos) << what << ": " << e.what();
    }
  };
  expect_refused("cuda_route", [&] {
    cuda_route(c.router, p.layout, d.call.q, d.call.k, d.call.v, TokenOrder::FrameMajor, 0.f, {}, stream.get());
  });
  expect_refused("cuda_run_routed",
                 [&] { cuda_run_routed(backend, plans, routed_call(d.call), routes.heads, {}, stream.get()); });
  expect_refused("cuda_routed_attention",
                 [&] { cuda_routed_attention(backend, plans, routed_call(d.call), c.router, {}, stream.get()); });
  expect_refused("cuda_policy_attention", [&] {
    cuda_policy_attention(backend, plans, policy, routed_call(d.call), /*step=*/0, /*layer=*/0, {}, stream.get());
  });
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(capturing, &graph), cudaSuccess) << "a refusal broke the capture";
  std::size_t nodes = 1;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 0u) << "something was enqueued before a refusal";
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(policy.cached_count(), 0u) << "a refused call left decisions behind";
}

// Begins a capture on `stream` (global mode), runs `call`, which must throw
// `Expected`, ends the capture and expects an empty graph: refused before
// anything was recorded, the capture intact; the message must hold `says`.
template <class Expected, class Call>
void expect_refused_before_recording(cudaStream_t stream, const char* what, const Call& call, const char* says = "") {
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  try {
    call();
    ADD_FAILURE() << what << " was not refused during a capture";
  } catch (const Expected& e) {
    EXPECT_NE(std::string_view(e.what()).find(says), std::string_view::npos)
        << what << ": the refusal does not say \"" << says << "\": " << e.what();
  } catch (const std::exception& e) {  // the capture must still be ended, or it breaks the tests after this one
    ADD_FAILURE() << what << ": refused with the wrong exception: " << e.what();
  }
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << what << ": the refusal broke the capture";
  std::size_t nodes = 1;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 0u) << what << ": recorded before the refusal";
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

// A routed call with given decisions captured into a CUDA graph (global mode),
// the scatter fused and as its own pass: after a warm-up outside the capture
// (plans and block schedules on the device), the captured call is recorded
// untimed into the caller's workspace, and the graph's replay on poisoned
// outputs matches the fp64 reference, the workspace holding the plans the graph
// reads. Refused before anything is recorded: no workspace, a workspace too
// small, a decision whose plan was never uploaded, and any call on the legacy
// stream while another stream is captured.
TEST(GpuRoutedAttention, CapturesIntoACudaGraphWithAWorkspace) {
  STSA_REQUIRE_GPU();
  const VideoLayout layout{{5, 7, 9, 13, TextPlacement::Before}, 2, 5, 128};
  const testing::CyclingDecisions given = testing::cycling_decisions(layout);  // heads 0 and 4 temporal
  const testing::Problem p = testing::make_problem(layout, DType::BF16, given.reference_masks, testing::fresh_seed(),
                                                   MemoryLayout::BNHD, DType::BF16);
  const NonBlockingStream stream;
  const auto capturing = static_cast<cudaStream_t>(stream.get());
  const CudaBackend backend;
  PlanCache plans;
  for (const bool fuse : {true, false}) {
    SCOPED_TRACE(fuse ? "scatter fused" : "scatter pass");
    RoutedOptions options;
    options.fuse_scatter = fuse;
    gpu_testing::DeviceProblem d(p);
    const RoutedCall call = routed_call(d.call);
    CudaRoutedWorkspace workspace(call, /*temporal_heads=*/-1, fuse);
    const RoutedResult warm = cuda_run_routed(backend, plans, call, given.decisions, options, stream.get(), &workspace);
    ASSERT_EQ(warm.temporal.size(), 2u);
    EXPECT_TRUE(warm.timed);
    EXPECT_GT(warm.attention_ms, 0.0);
    ASSERT_EQ(cudaStreamSynchronize(capturing), cudaSuccess);
    d.o.poison();
    d.lse.poison();

    ASSERT_EQ(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeGlobal), cudaSuccess);
    RoutedResult captured;
    try {
      captured = cuda_run_routed(backend, plans, call, given.decisions, options, stream.get(), &workspace);
    } catch (const Error& e) {
      ADD_FAILURE() << "the warmed-up call was refused during the capture: " << e.what();
    }
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(capturing, &graph), cudaSuccess);
    EXPECT_FALSE(captured.timed);
    EXPECT_EQ(captured.attention_ms, 0.0);
    EXPECT_EQ(captured.scatter_fused, fuse);
    EXPECT_EQ(workspace.kept_plans(), 4u);  // temporal, spatial, dense, frame window: what the graph reads
    cudaGraphExec_t replay = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&replay, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(replay, capturing), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(capturing), cudaSuccess);
    EXPECT_EQ(cudaGraphExecDestroy(replay), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    EXPECT_TRUE(d.o.guards_intact() && d.lse.guards_intact());
    testing::Problem replayed = p;
    d.download_into(replayed);
    gpu_testing::expect_matches_reference(replayed);
  }

  gpu_testing::DeviceProblem d(p);
  const RoutedCall call = routed_call(d.call);
  expect_refused_before_recording<Unsupported>(
      capturing, "no workspace", [&] { cuda_run_routed(backend, plans, call, given.decisions, {}, stream.get()); },
      "pass a CudaRoutedWorkspace made before it");
  CudaRoutedWorkspace one_head(call, /*temporal_heads=*/1);
  expect_refused_before_recording<InvalidArgument>(capturing, "a workspace for one of two temporal heads", [&] {
    cuda_run_routed(backend, plans, call, given.decisions, {}, stream.get(), &one_head);
  });
  CudaRoutedWorkspace workspace(call);
  std::vector<HeadRoute> unseen = given.decisions;
  RouterOptions denser = given.options;
  denser.temporal_density = 0.5;  // below ~0.41 the anchor alone keeps the density: the same band
  unseen[4].spec = route_spec(layout.grid, Route::Temporal, denser);  // a plan never uploaded
  ASSERT_NE(unseen[4].spec, given.decisions[4].spec);
  expect_refused_before_recording<InvalidArgument>(capturing, "a plan not on the device", [&] {
    cuda_run_routed(backend, plans, call, unseen, {}, stream.get(), &workspace);
  });
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  expect_refused_before_recording<Unsupported>(
      blocking, "the legacy stream during another stream's capture",
      [&] { cuda_run_routed(backend, plans, call, given.decisions, {}, nullptr, &workspace); },
      "on the legacy default stream while another stream is being captured");
  EXPECT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
}

// Routed calls take their packed buffers from the library's scratch pool: calls
// of one shape after the first reserve nothing new (no cudaMalloc, which would
// synchronize the device), the outputs stay right, and release returns the memory.
// (The runtime allows, rather than promises, reuse of a block freed on the same
// stream; with one allocation of one size per call it is what it does.)
TEST(GpuRoutedAttention, RepeatedCallsReuseTheScratchPool) {
  STSA_REQUIRE_GPU();
  if (!cuda_device_info().memory_pools) GTEST_SKIP() << "no stream-ordered allocation on this device";
  const VideoLayout layout{{6, 11, 13, 0, TextPlacement::After}, 1, 4, 128};
  const testing::CyclingDecisions given = testing::cycling_decisions(layout);
  testing::Problem p = testing::make_problem(layout, DType::BF16, given.reference_masks, testing::fresh_seed());
  gpu_testing::DeviceProblem d(p);
  const CudaBackend backend;
  PlanCache plans;
  const RoutedResult first = cuda_run_routed(backend, plans, routed_call(d.call), given.decisions);
  ASSERT_FALSE(first.temporal.empty());  // the packed buffers are used
  const std::int64_t held = cuda_scratch_bytes();
  EXPECT_GT(held, 0);
  for (int call = 0; call < 3; ++call) {
    d.o.poison();
    d.lse.poison();
    cuda_run_routed(backend, plans, routed_call(d.call), given.decisions);
    EXPECT_EQ(cuda_scratch_bytes(), held) << "call " << call;
  }
  EXPECT_TRUE(d.o.guards_intact() && d.lse.guards_intact());
  d.download_into(p);
  gpu_testing::expect_matches_reference(p);
  cuda_release_scratch();
  EXPECT_LT(cuda_scratch_bytes(), held);
}

// RoutedOptions::timed off: the call returns once its steps are enqueued. The
// stream is held behind the stopwatch's host gate while the call is made; a call
// that waited for the device would hold the host until the gate gave up, which
// host_waits() counts (the timed call, for contrast, does). Warmed up first, so no
// plan or schedule upload (which waits by design) happens in the calls watched.
TEST(GpuRoutedAttention, AnUntimedCallReturnsWithoutWaitingForTheDevice) {
  STSA_REQUIRE_GPU();
  const VideoLayout layout{{5, 7, 9, 13, TextPlacement::Before}, 2, 5, 128};
  const testing::CyclingDecisions given = testing::cycling_decisions(layout);  // temporal heads: gather + scatter
  testing::Problem p = testing::make_problem(layout, DType::BF16, given.reference_masks, testing::fresh_seed());
  gpu_testing::DeviceProblem d(p);
  const NonBlockingStream stream;
  const CudaBackend backend;
  PlanCache plans;
  cuda_run_routed(backend, plans, routed_call(d.call), given.decisions, {}, stream.get());
  for (const bool timed : {false, true}) {
    SCOPED_TRACE(timed ? "timed" : "untimed");
    d.o.poison();
    d.lse.poison();
    RoutedOptions options;
    options.timed = timed;
    bench::CudaEventStopwatch watch(static_cast<cudaStream_t>(stream.get()));
    watch.start();
    const RoutedResult r = cuda_run_routed(backend, plans, routed_call(d.call), given.decisions, options, stream.get());
    watch.stop_ms();
    EXPECT_EQ(watch.host_waits(), timed ? 1 : 0);
    EXPECT_EQ(r.timed, timed);
    EXPECT_EQ(r.attention_ms > 0.0, timed);
    ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.get())), cudaSuccess);
    EXPECT_TRUE(d.o.guards_intact() && d.lse.guards_intact());
    d.download_into(p);
    gpu_testing::expect_matches_reference(p);
  }
}

// The serving loop's call on the GPU: the dense warm-up, then routed (decisions
// as the CPU router's, remembered), then reused without routing; each step's
// output against the fp64 reference under the decisions it ran with.
TEST(GpuPolicyAttention, WarmUpThenRoutedThenReused) {
  STSA_REQUIRE_GPU();
  const testing::SyntheticRoutedCase c = testing::synthetic_routed_case(DType::BF16, testing::fresh_seed());
  PolicyOptions po;
  po.dense_steps = 1;
  po.reuse_steps = 2;
  po.router = c.router.options();
  Policy policy(po);
  const CudaBackend backend;
  PlanCache plans;
  std::vector<HeadRoute> routed;
  for (std::int64_t step = 0; step < 3; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    testing::Problem p = c.problem();
    gpu_testing::DeviceProblem d(p);
    const RoutedResult r = cuda_policy_attention(backend, plans, policy, routed_call(d.call), step, /*layer=*/2);
    ASSERT_EQ(r.heads.size(), c.report.heads.size());
    if (step == 0) {
      EXPECT_EQ(testing::count_routes(r.heads, Route::Dense), std::int64_t(r.heads.size()));
      EXPECT_EQ(r.routing_flops, 0.0);
      EXPECT_EQ(policy.cached_count(), 0u);
    } else if (step == 1) {
      EXPECT_EQ(r.routing_flops, c.report.flops);
      for (std::size_t h = 0; h < r.heads.size(); ++h)
        EXPECT_EQ(r.heads[h].route, c.report.heads[h].route) << "head " << h;
      EXPECT_EQ(policy.cached_count(), r.heads.size());
      routed = r.heads;
    } else {
      EXPECT_EQ(r.routing_flops, 0.0);  // reused
      for (std::size_t h = 0; h < r.heads.size(); ++h) EXPECT_EQ(r.heads[h].spec, routed[h].spec) << "head " << h;
    }
    for (std::size_t h = 0; h < r.heads.size(); ++h)
      p.heads[h] = HeadMask{r.heads[h].spec, TokenOrder::FrameMajor, nullptr, true};
    EXPECT_TRUE(d.o.guards_intact() && d.lse.guards_intact());
    d.download_into(p);
    gpu_testing::expect_matches_reference(p);
  }
}

// Routed on the GPU: decisions equal the CPU router's, the output the reference's.
TEST(GpuRoutedAttention, RoutesSyntheticHeadsAndMatchesTheReference) {
  STSA_REQUIRE_GPU();
  const testing::SyntheticRoutedCase c = testing::synthetic_routed_case(DType::BF16, testing::fresh_seed());
  testing::Problem p = c.problem();
  const RoutingReport& cpu = c.report;
  const Router& router = c.router;
  gpu_testing::DeviceProblem d(p);
  const CudaBackend backend;
  PlanCache plans;
  const RoutedResult r = cuda_routed_attention(backend, plans, routed_call(d.call), router);
  ASSERT_EQ(r.heads.size(), cpu.heads.size());
  for (std::size_t h = 0; h < r.heads.size(); ++h) EXPECT_EQ(r.heads[h].route, cpu.heads[h].route) << "head " << h;
  // Both sparse routes ran (temporal heads through the GPU permutation).
  EXPECT_FALSE(r.temporal.empty());
  EXPECT_GT(testing::count_routes(r.heads, Route::Spatial), 0);
  EXPECT_GT(r.routing_ms, 0.0);
  EXPECT_EQ(r.routing_flops, cpu.flops);
  d.download_into(p);
  gpu_testing::expect_matches_reference(p);
}

TEST(GpuRoutedAttention, RejectsHostTensorsBeforeRouting) {
  const VideoLayout layout{{3, 4, 4, 0, TextPlacement::After}, 1, 2, 64};
  testing::Problem p = testing::make_problem(layout, DType::BF16, std::vector<HeadMask>(2), 1);
  RouterOptions ro;
  ro.samples = 8;
  const CudaBackend backend;
  PlanCache plans;
  EXPECT_THROW(cuda_routed_attention(backend, plans, routed_call(p.call()), Router(ro)), Unsupported);
  RoutedCall bad = routed_call(p.call());
  bad.o = bad.q;  // output aliases an input
  EXPECT_THROW(cuda_routed_attention(backend, plans, bad, Router(ro)), InvalidArgument);
}

}  // namespace
}  // namespace stsa
