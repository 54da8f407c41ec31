// The CUDA backend against the fp64 reference and the CPU backend, on fresh
// random inputs with awkward shapes (token counts that are not tile multiples,
// one frame, text before and after, head dims 64 and 128, bf16 and fp16 in,
// fp32/bf16/fp16 out, both memory layouts, mixed masks per head, rows with
// nothing to attend to). Every GPU test runs once per kernel (sm80, sm90); the
// sm90 runs skip on GPUs other than compute capability 9.0, all of them skip
// without a GPU. The checks of bad input that need no GPU run everywhere.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cuda/block_schedule.hpp"
#include "cuda/device_plan_image.hpp"
#include "gpu/gpu_support.hpp"
#include "stsa/cpu.hpp"
#include "stsa/cuda.hpp"
#include "stsa/error.hpp"
#include "stsa/mask.hpp"
#include "stsa/permute.hpp"
#include "stsa/plan.hpp"

namespace stsa {

// Test names and messages show the kernel by name (found by argument-dependent lookup).
void PrintTo(CudaKernel kernel, std::ostream* out) { *out << to_string(kernel); }

namespace {

using gpu_testing::DeviceProblem;
using gpu_testing::expect_matches_reference;

VideoLayout make_layout(std::int64_t frames, std::int64_t height, std::int64_t width, std::int64_t text,
                        TextPlacement placement, std::int64_t batch, std::int64_t heads, std::int64_t head_dim) {
  VideoLayout layout;
  layout.grid = {frames, height, width, text, placement};
  layout.batch = batch;
  layout.heads = heads;
  layout.head_dim = head_dim;
  return layout;
}

// Head h gets mask h % 4: spatial band (with the frame-0 anchor), temporal
// band and frame window (without it), dense. On the short videos of these tests
// the anchor alone keeps about the target density: with it on every sparse mask
// the bands would shrink to nothing, no tile would be partial and no row would
// ever start its softmax from an empty max.
std::vector<HeadMask> mixed_heads(const VideoLayout& layout, double density, PlanCache& cache) {
  const VideoGrid& g = layout.grid;
  const MaskSpec specs[4] = {mask_for_density(g, SparseKind::Spatial, density),
                             mask_for_density(g, SparseKind::Temporal, density, /*anchor=*/false),
                             MaskSpec::frame_window(1, /*anchor=*/false), MaskSpec::dense()};
  std::vector<HeadMask> heads;
  for (std::int64_t h = 0; h < layout.heads; ++h) {
    const MaskSpec& spec = specs[h % 4];
    heads.push_back({spec, spec.natural_order(), cache.get(g, spec), true});
  }
  return heads;
}

struct Case {
  VideoLayout layout;
  DType in = DType::BF16;
  DType out = DType::F32;
  MemoryLayout memory = MemoryLayout::BNHD;
  double density = 0.3;
  int sample_rows = 0;  // 0: every row
};

// Two runs of the same problem: O within `bound` everywhere, LSE within 1e-4
// (rows with nothing allowed: -inf in both).
void expect_outputs_agree(const testing::Problem& a, const testing::Problem& b, double bound) {
  const VideoLayout& layout = a.layout;
  double worst = 0, worst_lse = 0;
  for (std::int64_t batch = 0; batch < layout.batch; ++batch)
    for (std::int64_t n = 0; n < layout.tokens(); ++n)
      for (std::int64_t h = 0; h < layout.heads; ++h) {
        for (std::int64_t d = 0; d < layout.head_dim; ++d) {
          // NaN (an unwritten row reads the poison) must fail: it counts as infinite.
          const double diff = std::abs(double(a.o.view().load(batch, n, h, d)) - double(b.o.view().load(batch, n, h, d)));
          worst = std::isnan(diff) ? std::numeric_limits<double>::infinity() : std::max(worst, diff);
        }
        const float la = a.lse.view().at(batch, h, n), lb = b.lse.view().at(batch, h, n);
        const bool both_empty = std::isinf(la) && la < 0 && std::isinf(lb) && lb < 0;
        const double d = both_empty ? 0.0 : std::abs(double(la) - double(lb));
        worst_lse = std::max(worst_lse, std::isnan(d) ? std::numeric_limits<double>::infinity() : d);
      }
  EXPECT_LE(worst, bound) << a.label;
  EXPECT_LE(worst_lse, 1e-4) << a.label;
  if (!(worst <= bound && worst_lse <= 1e-4)) {  // where, with b's output as the reference
    testing::ReferenceRows other;
    for (std::int64_t n = 0; n < layout.tokens(); ++n) other.rows.push_back(n);
    other.o.resize(std::size_t(layout.batch * layout.tokens() * layout.heads * layout.head_dim));
    other.lse.resize(std::size_t(layout.batch * layout.heads * layout.tokens()));
    for (std::int64_t batch = 0; batch < layout.batch; ++batch)
      for (std::int64_t n = 0; n < layout.tokens(); ++n)
        for (std::int64_t h = 0; h < layout.heads; ++h) {
          for (std::int64_t d = 0; d < layout.head_dim; ++d)
            other.o[std::size_t(((batch * layout.tokens() + n) * layout.heads + h) * layout.head_dim + d)] =
                b.o.view().load(batch, n, h, d);
          other.lse[std::size_t((batch * layout.heads + h) * layout.tokens() + n)] = b.lse.view().at(batch, h, n);
        }
    ADD_FAILURE() << a.label << ": where the two outputs differ\n"
                  << testing::error_pattern(a.call(), other, bound, 1e-4);
  }
}

// Every row of every computed head was written: finite O, LSE finite or -inf.
// Cheap, so it covers the rows a sampled reference comparison skips (the
// poisoned buffers read NaN where the kernel never stored). Counts, and names
// the first, so that the reference comparison still runs and says where.
void expect_every_row_written(const testing::Problem& p) {
  const VideoLayout& layout = p.layout;
  std::int64_t bad_o = 0, bad_lse = 0;
  std::ostringstream first;
  for (std::int64_t h = 0; h < layout.heads; ++h) {
    if (!p.heads[std::size_t(h)].compute) continue;
    for (std::int64_t batch = 0; batch < layout.batch; ++batch)
      for (std::int64_t n = 0; n < layout.tokens(); ++n) {
        for (std::int64_t d = 0; d < layout.head_dim; ++d)
          if (!std::isfinite(p.o.view().load(batch, n, h, d)) && bad_o++ == 0)
            first << " first O: batch " << batch << " row " << n << " head " << h << " dim " << d << ";";
        const float lse = p.lse.view().at(batch, h, n);
        if ((std::isnan(lse) || (std::isinf(lse) && lse > 0)) && bad_lse++ == 0)
          first << " first LSE: batch " << batch << " row " << n << " head " << h << ";";
      }
  }
  EXPECT_EQ(bad_o + bad_lse, 0) << p.label << ": " << bad_o << " O values not finite, " << bad_lse
                                << " LSE values NaN or +inf;" << first.str();
}

bool is_hopper() {
  const CudaDeviceInfo info = cuda_device_info();
  return info.major == 9 && info.minor == 0;
}

// The GPU tests, once per kernel.
class GpuAttention : public ::testing::TestWithParam<CudaKernel> {
 protected:
  void SetUp() override {
    STSA_REQUIRE_GPU();
    if (GetParam() != CudaKernel::Sm80 && !is_hopper())
      GTEST_SKIP() << "the " << to_string(GetParam()) << " kernel needs compute capability 9.0";
  }
  CudaBackend backend() const {
    return CudaBackend(CudaBackendOptions{GetParam(), work_order_, persistent_blocks_, block_schedule_});
  }
  void run_case(const Case& c) const;  // mixed_heads(c.layout, c.density)
  void run_case(const Case& c, const std::vector<HeadMask>& heads) const;
  // Packed heads stored into heads `targets` of full tensors (run_async_scattered).
  void run_scattered_case(const Case& c, TokenOrder order, const std::vector<std::int64_t>& targets) const;
  // Two launches through 1 and then 3 persistent blocks under `schedule`.
  void run_every_item_on_few_blocks(CudaBlockSchedule schedule);
  // What backend() and run_case() use: the defaults unless a test says otherwise.
  CudaWorkOrder work_order_ = CudaWorkOrder::Auto;
  int persistent_blocks_ = 0;
  CudaBlockSchedule block_schedule_ = CudaBlockSchedule::RoundRobin;
};

// Test-name suffix: sm80, sm90, sm90_overlap, sm90_pingpong (GoogleTest allows no '-').
std::string kernel_name(const ::testing::TestParamInfo<CudaKernel>& info) {
  std::string name(to_string(info.param));
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

void GpuAttention::run_case(const Case& c) const {
  PlanCache cache;
  run_case(c, mixed_heads(c.layout, c.density, cache));
}

void GpuAttention::run_case(const Case& c, const std::vector<HeadMask>& heads) const {
  auto problem = testing::make_problem(c.layout, c.in, heads, testing::fresh_seed(), c.memory, c.out);
  SCOPED_TRACE(problem.label);
  DeviceProblem device(problem);
  const CudaBackend backend = this->backend();
  EXPECT_EQ(backend.resolved_kernel(), GetParam());
  ASSERT_TRUE(backend.supports(device.call).ok) << backend.supports(device.call).why;
  backend.run(device.call);
  EXPECT_TRUE(device.o.guards_intact()) << "device guard bytes around O were overwritten";
  EXPECT_TRUE(device.lse.guards_intact()) << "device guard bytes around LSE were overwritten";
  device.download_into(problem);
  expect_every_row_written(problem);
  expect_matches_reference(problem, c.sample_rows);
}

TEST_P(GpuAttention, RaggedVideoWithTextAfter) {
  // 3 x 7 x 9 + 77 text = 266 tokens: 3 tiles, the last one ragged (10 rows).
  for (const std::int64_t dim : {64, 128})
    for (const DType in : {DType::BF16, DType::F16})
      run_case({make_layout(3, 7, 9, 77, TextPlacement::After, 1, 4, dim), in, DType::F32});
}

TEST_P(GpuAttention, OneFrameSmallerThanATile) {
  run_case({make_layout(1, 9, 11, 0, TextPlacement::After, 1, 4, 128), DType::BF16, DType::BF16});
  run_case({make_layout(1, 13, 11, 0, TextPlacement::After, 1, 4, 64), DType::F16, DType::F16});
}

TEST_P(GpuAttention, TextBeforeBatchTwoHeadMajorMemory) {
  run_case({make_layout(2, 10, 10, 30, TextPlacement::Before, 2, 4, 128), DType::BF16, DType::BF16,
            MemoryLayout::BHND});
  run_case({make_layout(2, 10, 10, 30, TextPlacement::Before, 2, 4, 64), DType::F16, DType::F32,
            MemoryLayout::BHND});
}

TEST_P(GpuAttention, ExactTileMultiple) {
  run_case({make_layout(2, 8, 16, 0, TextPlacement::After, 1, 4, 128), DType::F16, DType::F32});
}

TEST_P(GpuAttention, ManyFramesSeveralDensities) {
  // 21 x 8 x 12 = 2016 tokens: 16 query tiles with different kept-tile counts.
  for (const double density : {0.1, 0.25, 0.5})
    run_case({make_layout(21, 8, 12, 0, TextPlacement::After, 1, 4, 128), DType::BF16, DType::BF16,
              MemoryLayout::BNHD, density, /*sample_rows=*/192});
}

// Every query tile has zero kept tiles; 18 query tiles x 2 batch x 4 heads =
// 144 items, more than an H200's 132 SMs, so persistent blocks also run an
// empty item after an empty item.
TEST_P(GpuAttention, RowsWithNothingToAttendGetZeroAndMinusInfinity) {
  const VideoLayout layout = make_layout(9, 16, 16, 0, TextPlacement::After, 2, 4, 64);
  PlanCache cache;
  const MaskSpec nothing = MaskSpec::spatial(-1, /*anchor=*/false);
  std::vector<HeadMask> heads(4, HeadMask{nothing, nothing.natural_order(), cache.get(layout.grid, nothing), true});
  auto problem = testing::make_problem(layout, DType::BF16, heads, testing::fresh_seed());
  DeviceProblem device(problem);
  backend().run(device.call);
  device.download_into(problem);
  const TensorView o = problem.o.view();
  for (std::int64_t b = 0; b < layout.batch; ++b)
    for (std::int64_t n = 0; n < layout.tokens(); ++n)
      for (std::int64_t h = 0; h < layout.heads; ++h) {
        for (std::int64_t d = 0; d < 64; ++d)
          ASSERT_EQ(o.load(b, n, h, d), 0.f) << "batch " << b << " row " << n << " head " << h;
        ASSERT_EQ(problem.lse.view().at(b, h, n), -std::numeric_limits<float>::infinity());
      }
}

TEST_P(GpuAttention, SkippedHeadsAreLeftUntouched) {
  const VideoLayout layout = make_layout(2, 9, 9, 5, TextPlacement::After, 1, 4, 128);
  PlanCache cache;
  auto heads = mixed_heads(layout, 0.3, cache);
  heads[1].compute = false;
  auto problem = testing::make_problem(layout, DType::BF16, heads, testing::fresh_seed());
  DeviceProblem device(problem);
  backend().run(device.call);
  device.download_into(problem);
  for (std::int64_t n = 0; n < layout.tokens(); ++n) {
    for (std::int64_t d = 0; d < 128; ++d) ASSERT_TRUE(std::isnan(problem.o.view().load(0, n, 1, d)));
    ASSERT_TRUE(std::isnan(problem.lse.view().at(0, 1, n)));
  }
  expect_matches_reference(problem);
}

// A serving loop captures its layers into a CUDA graph (PyTorch's default
// capture mode is global). Before a warm-up call the capture is refused with a
// clear error, since a first call uploads the plans and their block
// schedules, with nothing enqueued and the capture intact; after it, the
// captured launches replay on poisoned outputs and match the reference.
TEST_P(GpuAttention, CapturesIntoACudaGraphAfterAWarmUp) {
  block_schedule_ = CudaBlockSchedule::Balanced;  // the schedule that uploads lists
  const VideoLayout layout = make_layout(5, 8, 12, 9, TextPlacement::After, 1, 4, 64);
  PlanCache cache;
  const auto heads = mixed_heads(layout, 0.3, cache);
  auto problem = testing::make_problem(layout, DType::BF16, heads, testing::fresh_seed());
  DeviceProblem device(problem);
  const CudaBackend backend = this->backend();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  try {
    backend.run_async(device.call, stream);
    ADD_FAILURE() << "a first call during capture was not refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("captured into a CUDA graph"), std::string::npos) << e.what();
  }
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << "the refusal broke the capture";
  std::size_t nodes = 1;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 0u) << "something was enqueued before the refusal";
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  // The plans on the device, but no call run: a Hopper kernel still lacks the
  // launch shape's block schedules (4 plans: 4 launches, none enqueued); sm80
  // needs none and is captured.
  for (const HeadMask& head : heads) backend.device_plan(head.plan);
  const bool persistent = backend.resolved_kernel() != CudaKernel::Sm80;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  try {
    backend.run_async(device.call, stream);
    EXPECT_FALSE(persistent) << "a new launch shape during capture was not refused";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(persistent) << e.what();
    EXPECT_NE(std::string(e.what()).find("block schedule"), std::string::npos) << e.what();
  }
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << "the refusal broke the capture";
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, persistent ? 0u : 4u);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);

  backend.run_async(device.call, stream);  // the warm-up
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  device.o.poison();
  device.lse.poison();
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  // What keeps the graph's plans on the device, whatever the backend's cache
  // does: prepare() records nothing and, the call warmed up, refuses nothing.
  std::vector<std::shared_ptr<const DevicePlan>> held;
  try {
    held = backend.prepare(device.call, stream);
    backend.run_async(device.call, stream);
  } catch (const std::exception& e) {  // the capture is ended below either way: later tests need the device
    ADD_FAILURE() << "the warmed-up call was refused during the capture: " << e.what();
  }
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(held.size(), 4u);  // one per plan
  cudaGraphExec_t replay = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&replay, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(replay, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  device.download_into(problem);
  expect_matches_reference(problem);
  EXPECT_EQ(cudaGraphExecDestroy(replay), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST_P(GpuAttention, AgreesWithTheCpuBackend) {
  const VideoLayout layout = make_layout(5, 12, 10, 16, TextPlacement::Before, 1, 4, 128);
  PlanCache cache;
  const auto heads = mixed_heads(layout, 0.2, cache);
  const std::uint64_t seed = testing::fresh_seed();
  auto gpu = testing::make_problem(layout, DType::F16, heads, seed);
  auto cpu = testing::make_problem(layout, DType::F16, heads, seed);
  DeviceProblem device(gpu);
  backend().run(device.call);
  device.download_into(gpu);
  make_cpu_backend()->run(cpu.call());
  // Both are within their bounds of the reference; against each other they differ
  // by at most the GPU's P rounding (fp16: 2^-11 relative) times the largest |v|.
  expect_outputs_agree(gpu, cpu, 4 * unit_roundoff(DType::F16) * gpu_testing::max_abs(gpu.v.view()));
}

// A temporal head stored frame-major: gather into spatial-major order on the
// GPU, run there, scatter O and LSE back; the reference evaluates the mask on
// the frame-major tensors directly.
TEST_P(GpuAttention, TemporalHeadsThroughTheGpuPermutation) {
  const VideoLayout layout = make_layout(6, 5, 7, 9, TextPlacement::After, 1, 2, 128);
  // Density 0.5: band 20. (At 0.3 the anchor and the text leave band -1, a mask
  // that is the same in both orders, so the test would pass without the permutation.)
  const MaskSpec temporal = mask_for_density(layout.grid, SparseKind::Temporal, 0.5);
  ASSERT_GT(temporal.band, 0) << temporal.describe();
  const auto plan = TilePlan::build(layout.grid, temporal);
  std::vector<HeadMask> frame_major(2, HeadMask{temporal, TokenOrder::FrameMajor, nullptr, true});
  auto problem = testing::make_problem(layout, DType::BF16, frame_major, testing::fresh_seed());
  DeviceProblem device(problem);

  const std::size_t bytes = gpu_testing::tensor_bytes(problem.q.view());
  DeviceBuffer pq(bytes), pk(bytes), pv(bytes), plse(device.lse.payload());
  DeviceBuffer po(gpu_testing::tensor_bytes(problem.o.view()));  // o is fp32
  // 0xFF bytes are NaN: a row that the gather, the kernel or the scatter misses shows.
  for (DeviceBuffer* b : {&pq, &pk, &pv, &po, &plse}) b->fill_bytes(0xFF);
  auto packed_view = [&](const DeviceBuffer& b, DType dtype = DType::BF16) {
    return TensorView::contiguous(b.data(), dtype, 1, layout.tokens(), 2, 128, MemoryLayout::BNHD);
  };
  const std::vector<std::int64_t> heads{0, 1};
  const std::vector<TensorView> sources{device.call.q, device.call.k, device.call.v};
  const std::vector<TensorView> packed{packed_view(pq), packed_view(pk), packed_view(pv)};
  cuda_gather_heads(layout.grid, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, heads, sources, packed);

  AttentionCall inner = device.call;
  inner.q = packed[0];
  inner.k = packed[1];
  inner.v = packed[2];
  inner.o = packed_view(po, problem.o.view().dtype);
  inner.lse = LseView::contiguous(static_cast<float*>(plse.data()), 1, 2, layout.tokens());
  inner.heads.assign(2, HeadMask{temporal, TokenOrder::SpatialMajor, plan, true});
  backend().run(inner);
  const std::vector<TensorView> packed_o{inner.o}, dest_o{device.call.o};
  cuda_scatter_heads(layout.grid, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, heads, packed_o, dest_o,
                     inner.lse, device.call.lse);
  cuda_synchronize();
  device.download_into(problem);
  expect_matches_reference(problem);
}

TEST_P(GpuAttention, DevicePlansAreUploadedOnceAndDroppedWithTheirPlan) {
  const VideoLayout layout = make_layout(3, 8, 8, 0, TextPlacement::After, 1, 4, 64);
  const CudaBackend backend = this->backend();
  {
    PlanCache cache;
    auto heads = mixed_heads(layout, 0.3, cache);  // 4 distinct plans
    auto problem = testing::make_problem(layout, DType::BF16, heads, testing::fresh_seed());
    DeviceProblem device(problem);
    backend.run(device.call);
    backend.run(device.call);
    EXPECT_EQ(backend.cached_plans(), 4u);
    const auto uploaded = backend.device_plan(heads[0].plan);
    EXPECT_EQ(uploaded, backend.device_plan(heads[0].plan));
    EXPECT_GT(uploaded->device_bytes(), 0);
    EXPECT_EQ(uploaded->q_tiles(), heads[0].plan->q_tiles());
  }
  // The host plans are gone: the next lookup drops their device copies.
  PlanCache cache;
  const auto plan = cache.get(layout.grid, MaskSpec::dense());
  backend.device_plan(plan);
  EXPECT_EQ(backend.cached_plans(), 1u);
}

// The plan cache drops the least recently used plan first: a plan used on
// every call survives any number of new ones (first-in-first-out would drop it).
TEST(GpuPlanCache, DropsTheLeastRecentlyUsedPlanFirst) {
  STSA_REQUIRE_GPU();
  constexpr std::size_t kMax = CudaBackend::kMaxCachedPlans;
  const VideoGrid grid{2, 4, 4, 0, TextPlacement::After};
  std::vector<std::shared_ptr<const TilePlan>> plans;  // distinct plans: the cache keys by identity
  for (std::size_t i = 0; i <= kMax; ++i) plans.push_back(TilePlan::build(grid, MaskSpec::dense()));
  const CudaBackend backend;
  const auto first = backend.device_plan(plans[0]);
  const auto second = backend.device_plan(plans[1]);
  for (std::size_t i = 2; i < kMax; ++i) backend.device_plan(plans[i]);
  ASSERT_EQ(backend.cached_plans(), kMax);
  EXPECT_EQ(backend.device_plan(plans[0]), first);  // a hit makes it the most recent
  backend.device_plan(plans[kMax]);                 // the cache is full: plans[1] goes
  EXPECT_EQ(backend.cached_plans(), kMax);
  EXPECT_EQ(backend.device_plan(plans[0]), first);
  EXPECT_NE(backend.device_plan(plans[1]), second);  // uploaded again
  EXPECT_EQ(backend.cached_plans(), kMax);
}

// More work items than twice the SMs in one launch: every persistent sm90 block
// runs several items (Q barrier phases flip, the K/V ring carries on across
// items, the producer runs into the next item while the consumers finish one).
// The backend launches once per plan, so all heads share one mask here.
TEST_P(GpuAttention, MoreQueryTilesThanMultiprocessors) {
  // 21 x 8 x 12 + 40 text = 2056 tokens: 17 query tiles x 2 batch x 8 heads = 272 items.
  const int multiprocessors = cuda_device_info().multiprocessors;
  for (const SparseKind kind : {SparseKind::Spatial, SparseKind::Temporal}) {
    const bool spatial = kind == SparseKind::Spatial;
    const Case c{make_layout(21, 8, 12, 40, spatial ? TextPlacement::After : TextPlacement::Before, 2, 8,
                             spatial ? 128 : 64),
                 spatial ? DType::BF16 : DType::F16,
                 spatial ? DType::BF16 : DType::F32,
                 spatial ? MemoryLayout::BNHD : MemoryLayout::BHND,
                 spatial ? 0.2 : 0.3,
                 /*sample_rows=*/96};
    PlanCache cache;
    const MaskSpec spec = mask_for_density(c.layout.grid, kind, c.density, /*anchor=*/spatial);
    const auto plan = cache.get(c.layout.grid, spec);
    ASSERT_GT(plan->q_tiles() * c.layout.batch * c.layout.heads, 2 * multiprocessors) << spec.describe();
    run_case(c, std::vector<HeadMask>(std::size_t(c.layout.heads), HeadMask{spec, spec.natural_order(), plan, true}));
  }
}

// A softmax scale of the caller's, against the reference; then the same call
// without LSE: the same O to the bit, and the LSE buffer never written.
TEST_P(GpuAttention, SoftmaxScaleAndNoLse) {
  const VideoLayout layout = make_layout(3, 7, 9, 11, TextPlacement::After, 1, 4, 64);
  PlanCache cache;
  auto problem = testing::make_problem(layout, DType::BF16, mixed_heads(layout, 0.3, cache), testing::fresh_seed());
  problem.softmax_scale = 0.3f;
  SCOPED_TRACE(problem.label + " scale 0.3");
  DeviceProblem with_lse(problem), without_lse(problem);
  const CudaBackend backend = this->backend();
  backend.run(with_lse.call);
  AttentionCall no_lse = without_lse.call;
  no_lse.lse = LseView{};
  backend.run(no_lse);
  EXPECT_TRUE(without_lse.o.guards_intact() && without_lse.lse.guards_intact());
  with_lse.download_into(problem);
  expect_matches_reference(problem);
  gpu_testing::expect_same_output_and_no_lse(with_lse, without_lse);
}

// Scores of +-(2.6-3.1)e38 with a softmax scale of 1 (testing::plant_scores_at_the_float_limit):
// max x scale x log2 e passes FLT_MAX, so an exp2 offset taken that way is infinite and the row
// NaN (every P 0, or exp2(+inf)), where the reference and the CPU kernels are finite. The
// planted rows' O is the mean of V over exact ties; masked keys and ragged tiles included.
TEST_P(GpuAttention, ScoresAtTheFloatLimitKeepFiniteRows) {
  for (const std::int64_t dim : {64, 128}) {
    const VideoLayout layout = make_layout(3, 7, 9, 11, TextPlacement::After, 1, 4, dim);
    PlanCache cache;
    auto problem = testing::make_problem(layout, DType::BF16, mixed_heads(layout, 0.3, cache), testing::fresh_seed());
    testing::plant_scores_at_the_float_limit(problem, testing::fresh_seed());
    SCOPED_TRACE(problem.label + " scores at the float limit");
    DeviceProblem device(problem);
    backend().run(device.call);
    device.download_into(problem);
    expect_every_row_written(problem);
    expect_matches_reference(problem);
    const testing::FloatLimitErrors planted = testing::float_limit_errors(problem);
    EXPECT_LT(planted.o_max_abs, 1e-4) << planted.rows << " planted rows";
    EXPECT_LT(planted.lse_max_rel, 1e-6) << planted.rows << " planted rows";
  }
}

// What a model's fused QKV projection hands over: q, k and v as views into one
// [B, N, 3, H, D] buffer (token stride 3 H D, head stride D), O with a padded
// token stride, and LSE stored [B, N, H] (token-major). Both kernels' loads (TMA
// maps on sm90) and stores must follow the strides, not assume packed tensors.
TEST_P(GpuAttention, FusedQkvPaddedOutputAndTokenMajorLse) {
  const VideoLayout layout = make_layout(3, 7, 9, 5, TextPlacement::After, 2, 4, 64);
  const std::int64_t b_count = layout.batch, n = layout.tokens(), h_count = layout.heads, d_count = layout.head_dim;
  PlanCache cache;
  auto problem = testing::make_problem(layout, DType::BF16, mixed_heads(layout, 0.3, cache), testing::fresh_seed());
  SCOPED_TRACE(problem.label + ", fused QKV");
  const std::int64_t hd = h_count * d_count, o_token_stride = hd + 8;  // 8 fp32 of padding: rows stay 16-byte aligned
  std::vector<std::uint16_t> fused(std::size_t(b_count * n * 3 * hd));
  const TensorView sources[3] = {problem.q.view(), problem.k.view(), problem.v.view()};
  for (std::int64_t b = 0; b < b_count; ++b)
    for (std::int64_t i = 0; i < n; ++i)
      for (int which = 0; which < 3; ++which)
        for (std::int64_t h = 0; h < h_count; ++h)
          for (std::int64_t d = 0; d < d_count; ++d)
            fused[std::size_t(((b * n + i) * 3 + which) * hd + h * d_count + d)] =
                static_cast<const std::uint16_t*>(sources[which].data)[sources[which].offset(b, i, h, d)];
  DeviceBuffer qkv(fused.size() * 2), o(std::size_t(b_count * n * o_token_stride) * 4),
      lse(std::size_t(b_count * n * h_count) * 4);
  qkv.copy_from_host(fused.data(), fused.size() * 2);
  o.fill_bytes(0xFF);  // NaN: every element must be written
  lse.fill_bytes(0xFF);

  AttentionCall call = problem.call();
  TensorView* views[3] = {&call.q, &call.k, &call.v};
  for (int which = 0; which < 3; ++which) {
    views[which]->data = static_cast<std::uint16_t*>(qkv.data()) + which * hd;
    views[which]->stride = {n * 3 * hd, 3 * hd, d_count, 1};
  }
  call.o.data = o.data();
  call.o.stride = {n * o_token_stride, o_token_stride, d_count, 1};
  call.lse.data = static_cast<float*>(lse.data());
  call.lse.stride = {n * h_count, 1, h_count};  // (batch, head, token): token-major
  const CudaBackend backend = this->backend();
  ASSERT_TRUE(backend.supports(call).ok) << backend.supports(call).why;
  backend.run(call);

  std::vector<float> o_host(std::size_t(b_count * n * o_token_stride)), lse_host(std::size_t(b_count * n * h_count));
  o.copy_to_host(o_host.data(), o_host.size() * 4);
  lse.copy_to_host(lse_host.data(), lse_host.size() * 4);
  for (std::int64_t b = 0; b < b_count; ++b)
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t h = 0; h < h_count; ++h) {
        for (std::int64_t d = 0; d < d_count; ++d)
          problem.o.view().store(b, i, h, d, o_host[std::size_t((b * n + i) * o_token_stride + h * d_count + d)]);
        problem.lse.view().at(b, h, i) = lse_host[std::size_t((b * n + i) * h_count + h)];
      }
  for (std::int64_t b = 0; b < b_count; ++b)  // the padding between rows was never written
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t pad = hd; pad < o_token_stride; ++pad)
        EXPECT_TRUE(std::isnan(o_host[std::size_t((b * n + i) * o_token_stride + pad)])) << "padding written";
  expect_every_row_written(problem);
  expect_matches_reference(problem);
}

// 65 heads on one plan: two launches (64 heads each at most), the second for head 64.
TEST_P(GpuAttention, MoreThan64HeadsTakeTwoLaunches) {
  const VideoLayout layout = make_layout(2, 8, 9, 3, TextPlacement::Before, 1, 65, 64);
  PlanCache cache;
  const MaskSpec spec = mask_for_density(layout.grid, SparseKind::Spatial, 0.5);
  run_case({layout, DType::F16, DType::F32, MemoryLayout::BNHD, 0.5},
           std::vector<HeadMask>(65, HeadMask{spec, spec.natural_order(), cache.get(layout.grid, spec), true}));
}

// Packed heads (the temporal heads of routed attention: q, k, v gathered into
// spatial-major order) whose O and LSE the kernel stores straight into the full
// tensors (run_async_scattered) against the two-step path (packed output, then
// cuda_scatter_heads): the same bytes, and the heads not listed never written.
// Two plans among the packed heads (two launches: each maps its own heads), text
// tokens before the video, ragged tiles; a same-order case remaps heads only.
void GpuAttention::run_scattered_case(const Case& c, TokenOrder order, const std::vector<std::int64_t>& targets) const {
  const VideoLayout& full = c.layout;
  const VideoGrid& g = full.grid;
  const auto count = std::int64_t(targets.size());
  const SparseKind kind = order == TokenOrder::SpatialMajor ? SparseKind::Temporal : SparseKind::Spatial;
  PlanCache cache;
  const MaskSpec specs[2] = {mask_for_density(g, kind, c.density), mask_for_density(g, kind, c.density, false)};
  std::vector<HeadMask> packed_heads;
  for (std::int64_t j = 0; j < count; ++j) {
    const MaskSpec& spec = specs[j % 2];
    ASSERT_EQ(spec.natural_order(), order);
    packed_heads.push_back({spec, order, cache.get(g, spec), true});
  }
  const testing::Problem problem =
      testing::make_problem(full, c.in, std::vector<HeadMask>(std::size_t(full.heads)), testing::fresh_seed(), c.memory,
                            c.out);
  SCOPED_TRACE(problem.label);
  DeviceProblem two_step(problem), fused(problem);  // full tensors; O and LSE poisoned

  const VideoLayout packed_layout{g, full.batch, count, full.head_dim};
  const auto packed_buffer = [&](DType dtype) {
    return DeviceBuffer(std::size_t(packed_layout.batch * g.tokens() * count * full.head_dim) * element_size(dtype));
  };
  const DeviceBuffer q(packed_buffer(c.in)), k(packed_buffer(c.in)), v(packed_buffer(c.in)), o(packed_buffer(c.out));
  const DeviceBuffer lse(std::size_t(full.batch * count * g.tokens()) * sizeof(float));
  const auto packed_view = [&](const DeviceBuffer& b, DType dtype) {
    return TensorView::contiguous(b.data(), dtype, full.batch, g.tokens(), count, full.head_dim, MemoryLayout::BNHD);
  };
  AttentionCall packed;
  packed.layout = packed_layout;
  packed.q = packed_view(q, c.in);
  packed.k = packed_view(k, c.in);
  packed.v = packed_view(v, c.in);
  packed.heads = packed_heads;
  const TensorView sources[] = {two_step.call.q, two_step.call.k, two_step.call.v};
  const TensorView gathered[] = {packed.q, packed.k, packed.v};
  cuda_gather_heads(g, TokenOrder::FrameMajor, order, targets, sources, gathered);

  const CudaBackend backend = this->backend();
  AttentionCall with_output = packed;
  with_output.o = packed_view(o, c.out);
  with_output.lse = LseView::contiguous(static_cast<float*>(lse.data()), full.batch, count, g.tokens());
  backend.run(with_output);
  const TensorView packed_o[] = {with_output.o};
  const TensorView full_o[] = {two_step.call.o};
  cuda_scatter_heads(g, order, TokenOrder::FrameMajor, targets, packed_o, full_o, with_output.lse, two_step.call.lse);
  // Backend::run_scattered: run_async_scattered on the default stream, then a wait.
  backend.run_scattered(packed,
                        ScatteredOutput{g, order, TokenOrder::FrameMajor, targets, fused.call.o, fused.call.lse});

  EXPECT_TRUE(fused.o.guards_intact() && fused.lse.guards_intact()) << "guard bytes around O or LSE overwritten";
  testing::Problem a = problem, b = problem;
  two_step.download_into(a);
  fused.download_into(b);
  EXPECT_EQ(std::memcmp(a.o.view().data, b.o.view().data, gpu_testing::tensor_bytes(a.o.view())), 0)
      << "the fused scatter stored other O bytes than the two-step path";
  std::int64_t written = 0, mismatched_lse = 0;
  for (std::int64_t batch = 0; batch < full.batch; ++batch)
    for (std::int64_t h = 0; h < full.heads; ++h)
      for (std::int64_t n = 0; n < g.tokens(); ++n) {
        const float la = a.lse.view().at(batch, h, n), lb = b.lse.view().at(batch, h, n);
        mismatched_lse += std::memcmp(&la, &lb, sizeof(float)) != 0;
        written += !std::isnan(lb);
      }
  EXPECT_EQ(mismatched_lse, 0);
  // Exactly the listed heads' rows were stored (the others keep the NaN poison).
  EXPECT_EQ(written, full.batch * count * g.tokens());
}

TEST_P(GpuAttention, ScatteredOutputIsTheGatheredCallScattered) {
  run_scattered_case({make_layout(5, 7, 9, 13, TextPlacement::Before, 2, 5, 128), DType::BF16, DType::BF16},
                     TokenOrder::SpatialMajor, {3, 0, 4});
  run_scattered_case({make_layout(4, 5, 6, 70, TextPlacement::After, 1, 4, 64), DType::F16, DType::F32,
                      MemoryLayout::BHND},
                     TokenOrder::SpatialMajor, {2, 1});
  run_scattered_case({make_layout(3, 7, 9, 0, TextPlacement::After, 1, 3, 128), DType::BF16, DType::F32},
                     TokenOrder::FrameMajor, {2, 0});
}

// Every item of a launch through one persistent block, then three: the Q
// barriers flip with every item, the K/V ring wraps again and again (D = 64:
// 4 stages, D = 128: 2), the producer runs ahead into the next item in every
// round, and ping-pong turns carry across items. (The sm80 kernel is not
// persistent: for it this is one more ordinary case.)
void GpuAttention::run_every_item_on_few_blocks(CudaBlockSchedule schedule) {
  for (const int blocks : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << to_string(schedule) << ", " << blocks << " blocks");
    block_schedule_ = schedule;
    persistent_blocks_ = blocks;
    run_case({make_layout(7, 8, 12, 20, TextPlacement::After, 2, 4, 64), DType::BF16, DType::F32,
              MemoryLayout::BNHD, 0.5});
    run_case({make_layout(5, 9, 13, 0, TextPlacement::After, 1, 4, 128), DType::F16, DType::BF16,
              MemoryLayout::BHND, 0.4});
  }
}

// The default schedule (round-robin: block b runs items b, b + G, ...) only:
// bench/gpu/check.sh's smoke test runs this one, and a kernel that fails it is
// left out of the whole run, so a bug in another schedule must not drop it.
TEST_P(GpuAttention, FewPersistentBlocksRunEveryItem) {
  run_every_item_on_few_blocks(CudaBlockSchedule::RoundRobin);
}

// The other schedules: snake (b, 2G - 1 - b, 2G + b, ...) and the balanced
// lists (the same count per block here, 4 of 12 items on 3 blocks, but of
// unequal items). A failure here fails the GPU tests, not the kernel.
TEST_P(GpuAttention, FewPersistentBlocksRunEveryItemOnTheOtherSchedules) {
  for (const CudaBlockSchedule schedule : {CudaBlockSchedule::Snake, CudaBlockSchedule::Balanced})
    run_every_item_on_few_blocks(schedule);
}

// One backend, one plan, three launch shapes in turn (4 heads, then 3 with one
// skipped, then 4 again): each shape gets its own block schedule, kept with the
// device plan and found again, never another shape's.
TEST_P(GpuAttention, EachLaunchShapeGetsItsOwnBlockSchedule) {
  block_schedule_ = CudaBlockSchedule::Balanced;  // the schedule kept on the device
  for (const CudaWorkOrder order :
       {CudaWorkOrder::Auto, CudaWorkOrder::AcrossHeads, CudaWorkOrder::HeadByHead, CudaWorkOrder::HeavyFirst}) {
    SCOPED_TRACE(to_string(order));
    work_order_ = order;
    persistent_blocks_ = 5;
    const VideoLayout layout = make_layout(9, 8, 12, 20, TextPlacement::After, 1, 4, 64);
    PlanCache cache;
    const MaskSpec spec = mask_for_density(layout.grid, SparseKind::Spatial, 0.3);
    std::vector<HeadMask> heads(4, HeadMask{spec, spec.natural_order(), cache.get(layout.grid, spec), true});
    const CudaBackend backend = this->backend();
    std::vector<std::int64_t> device_bytes;
    for (const int skipped : {-1, 2, -1}) {
      for (int h = 0; h < 4; ++h) heads[std::size_t(h)].compute = h != skipped;
      auto problem = testing::make_problem(layout, DType::BF16, heads, testing::fresh_seed());
      SCOPED_TRACE(problem.label);
      DeviceProblem device(problem);
      backend.run(device.call);
      device.download_into(problem);
      expect_matches_reference(problem, 0);
      device_bytes.push_back(backend.device_plan(heads[0].plan)->device_bytes());
    }
    EXPECT_EQ(backend.cached_plans(), 1u);
    // The plan's device bytes count each new shape's schedule (persistent
    // kernels only; sm80 has none), and a shape seen before adds nothing.
    EXPECT_EQ(device_bytes[1] > device_bytes[0], backend.resolved_kernel() != CudaKernel::Sm80);
    EXPECT_EQ(device_bytes[2], device_bytes[1]);
  }
}

// Each fixed work order walks the same items in its own order: same answers,
// through the persistent loop (more items than SMs, batch 2) and through calls
// with several plans (one launch each); heavy first (the anchor rows lead) by
// round-robin and by snake; head by head in balanced lists that hand the heavy
// items out first (the GPU tests' only such case: pinned on the host by
// BlockSchedule.TheGpuTestsRunHeavyFirstLists, and checked here on this GPU).
TEST_P(GpuAttention, EveryWorkOrderGivesTheSameAnswers) {
  for (const auto& [order, schedule] :
       {std::pair{CudaWorkOrder::HeadByHead, CudaBlockSchedule::RoundRobin},
        std::pair{CudaWorkOrder::HeadByHead, CudaBlockSchedule::Balanced},
        std::pair{CudaWorkOrder::AcrossHeads, CudaBlockSchedule::RoundRobin},
        std::pair{CudaWorkOrder::HeavyFirst, CudaBlockSchedule::Snake},
        std::pair{CudaWorkOrder::HeavyFirst, CudaBlockSchedule::RoundRobin}}) {
    SCOPED_TRACE(::testing::Message() << to_string(order) << ", " << to_string(schedule));
    work_order_ = order;
    block_schedule_ = schedule;
    const Case many{make_layout(21, 8, 12, 40, TextPlacement::After, 2, 8, 128), DType::BF16, DType::BF16,
                    MemoryLayout::BNHD, 0.2, /*sample_rows=*/96};
    PlanCache cache;
    const MaskSpec spec = mask_for_density(many.layout.grid, SparseKind::Spatial, many.density);
    const auto plan = cache.get(many.layout.grid, spec);
    const int multiprocessors = cuda_device_info().multiprocessors;
    ASSERT_GT(plan->q_tiles() * many.layout.batch * many.layout.heads, 2 * multiprocessors);
    if (schedule == CudaBlockSchedule::Balanced && GetParam() != CudaKernel::Sm80) {
      // The lists this launch gets (one per persistent block): heavy items first, or this case covers nothing new.
      const auto costs = cuda_detail::make_device_plan_image(*plan).rank_costs;
      EXPECT_TRUE(cuda_detail::make_block_schedule(costs, many.layout.batch * many.layout.heads, multiprocessors,
                                                   cuda_detail::kWorkHeadByHead, schedule)
                      .heavy_first)
          << multiprocessors << " blocks";
    }
    run_case(many,
             std::vector<HeadMask>(std::size_t(many.layout.heads), HeadMask{spec, spec.natural_order(), plan, true}));
    run_case({make_layout(3, 7, 9, 77, TextPlacement::After, 2, 4, 64), DType::F16, DType::F32});
  }
}

// Each Hopper kernel against the portable one on identical inputs: both round P
// to the input type, in a different order of accumulation, so they agree to
// that rounding.
TEST_P(GpuAttention, AgreesWithTheSm80Kernel) {
  if (GetParam() == CudaKernel::Sm80) GTEST_SKIP() << "compares a Hopper kernel with sm80";
  const VideoLayout layout = make_layout(4, 11, 13, 9, TextPlacement::After, 1, 4, 128);
  PlanCache cache;
  const auto heads = mixed_heads(layout, 0.25, cache);
  const std::uint64_t seed = testing::fresh_seed();
  auto hopper = testing::make_problem(layout, DType::BF16, heads, seed);
  auto portable = testing::make_problem(layout, DType::BF16, heads, seed);
  DeviceProblem on_hopper(hopper), on_portable(portable);
  backend().run(on_hopper.call);
  CudaBackend(CudaBackendOptions{CudaKernel::Sm80}).run(on_portable.call);
  on_hopper.download_into(hopper);
  on_portable.download_into(portable);
  expect_outputs_agree(hopper, portable, 4 * unit_roundoff(DType::BF16) * gpu_testing::max_abs(hopper.v.view()));
}

// What compute-sanitizer runs (bench/gpu/check.sh): one small mixed call and
// one permutation round trip, with every kernel variant touched once.
class GpuSanitize : public GpuAttention {};

TEST_P(GpuSanitize, SmallMixedCalls) {
  for (const std::int64_t dim : {64, 128})
    for (const DType in : {DType::BF16, DType::F16})
      run_case({make_layout(2, 9, 9, 7, TextPlacement::After, 1, 4, dim), in, DType::BF16});
  // The heavy-first order walked by snake over three blocks (memcheck: every item decoded in bounds).
  work_order_ = CudaWorkOrder::HeavyFirst;
  block_schedule_ = CudaBlockSchedule::Snake;
  persistent_blocks_ = 3;
  run_case({make_layout(3, 9, 9, 7, TextPlacement::After, 1, 4, 128), DType::BF16, DType::BF16});
  // Rows stored through the fused scatter (memcheck: every row in its tensor).
  work_order_ = CudaWorkOrder::Auto;
  block_schedule_ = CudaBlockSchedule::RoundRobin;
  persistent_blocks_ = 0;
  run_scattered_case({make_layout(3, 9, 9, 7, TextPlacement::Before, 1, 4, 64), DType::BF16, DType::BF16},
                     TokenOrder::SpatialMajor, {3, 1});
}

// One call (two query tiles, every mask kind, a ragged tile): what the slow
// shared-memory checkers (racecheck, synccheck) run.
TEST_P(GpuSanitize, OneSmallCall) {
  run_case({make_layout(2, 9, 9, 7, TextPlacement::After, 1, 4, 128), DType::BF16, DType::BF16});
}

const auto kAllKernels =
    ::testing::Values(CudaKernel::Sm80, CudaKernel::Sm90, CudaKernel::Sm90Overlap, CudaKernel::Sm90PingPong);
INSTANTIATE_TEST_SUITE_P(Kernels, GpuAttention, kAllKernels, kernel_name);
INSTANTIATE_TEST_SUITE_P(Kernels, GpuSanitize, kAllKernels, kernel_name);

// ---- Bad input: checked before any launch (most of it without a GPU). ----

struct HostCall {
  VideoLayout layout = make_layout(2, 8, 8, 0, TextPlacement::After, 1, 2, 64);
  PlanCache cache;
  testing::Problem problem;
  explicit HostCall(DType dtype = DType::BF16, std::int64_t head_dim = 64, TileShape tile = {})
      : problem([&] {
          layout.head_dim = head_dim;
          const MaskSpec spec = MaskSpec::spatial(20);
          std::vector<HeadMask> heads(2, HeadMask{spec, spec.natural_order(), cache.get(layout.grid, spec, tile), true});
          return testing::make_problem(layout, dtype, heads, 1);
        }()) {}
};

void expect_unsupported(const AttentionCall& call, const std::string& fragment) {
  const CudaBackend backend;
  const Support s = backend.supports(call);
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.why.find(fragment), std::string::npos) << s.why;
  EXPECT_THROW(backend.run(call), Unsupported);
}

TEST(GpuAttentionInput, Fp32InputsAreUnsupported) { expect_unsupported(HostCall(DType::F32).problem.call(), "bf16"); }

TEST(GpuAttentionInput, Fp8InputsAreUnsupported) {
  expect_unsupported(HostCall(DType::F8E4M3).problem.call(), "bf16 or fp16");
}

TEST(GpuAttentionInput, DescalesAreUnsupported) {
  HostCall c(DType::BF16);
  c.problem.v_descale.assign(2, 0.5f);  // batch 1 x 2 heads
  expect_unsupported(c.problem.call(), "descales");
}

TEST(GpuAttentionInput, NegativeSoftmaxScaleIsUnsupported) {
  HostCall c(DType::BF16);
  c.problem.softmax_scale = -0.2f;
  expect_unsupported(c.problem.call(), "positive softmax scale");
}

TEST(GpuAttentionInput, HeadDim80IsUnsupported) {
  expect_unsupported(HostCall(DType::BF16, 80).problem.call(), "head dims 64 and 128");
}

TEST(GpuAttentionInput, MoreTokensThanTheKernelsIndexAreUnsupported) {
  HostCall host;
  AttentionCall call = host.problem.call();
  call.layout.grid.frames = INT_MAX / 64;  // 8 x 8 per frame: 2^31 - 64 tokens, valid for the CPU backend
  expect_unsupported(call, "32 bits");
}

TEST(GpuAttentionInput, OtherTileShapesAreUnsupported) {
  expect_unsupported(HostCall(DType::BF16, 64, TileShape{64, 128}).problem.call(), "128x128");
}

TEST(GpuAttentionInput, MisalignedRowsAreUnsupported) {
  HostCall host;
  AttentionCall call = host.problem.call();
  // A view starting one element in: the data pointer is 2 bytes off 16.
  std::vector<std::uint16_t> storage(std::size_t(call.q.numel()) + 8);
  call.q.data = storage.data() + 1;
  expect_unsupported(call, "16-byte aligned");
}

TEST(GpuAttentionInput, StridedHeadDimIsUnsupported) {
  HostCall host;
  AttentionCall call = host.problem.call();
  std::vector<std::uint16_t> storage(std::size_t(call.k.numel()) * 2);
  call.k = TensorView::contiguous(storage.data(), DType::BF16, 1, host.layout.tokens(), 2, 64 * 2, MemoryLayout::BNHD);
  call.k.shape[3] = 64;
  call.k.stride[3] = 2;
  expect_unsupported(call, "head-dim stride");
}

TEST(GpuAttentionInput, APlanForAnotherGridIsInvalid) {
  HostCall host;
  AttentionCall call = host.problem.call();
  VideoGrid other = host.layout.grid;
  other.frames = 3;
  call.heads[0].plan = TilePlan::build(other, call.heads[0].spec);
  EXPECT_THROW(CudaBackend().run(call), InvalidArgument);
  EXPECT_FALSE(CudaBackend().supports(call).ok);
}

TEST(GpuAttentionInput, TensorsInTheWrongOrderForThePlanAreInvalid) {
  HostCall host;
  AttentionCall call = host.problem.call();
  call.heads[1].order = TokenOrder::SpatialMajor;  // the spatial plan indexes frame-major tokens
  EXPECT_THROW(CudaBackend().run(call), InvalidArgument);
}

TEST(GpuAttentionInput, HostMemoryOrNoGpuIsUnsupported) {
  HostCall host;
  const AttentionCall call = host.problem.call();  // valid, but host memory
  expect_unsupported(call, cuda_device_count() == 0 ? "no CUDA device" : "host memory");
}

// run_async_scattered: the head map, the grid and the full tensors are checked
// before anything else (InvalidArgument, with or without a GPU); a valid
// scattered call on host memory is then Unsupported like any other.
TEST(GpuAttentionInput, ScatteredOutputsAreCheckedBeforeTheDevice) {
  HostCall host;
  AttentionCall packed = host.problem.call();
  packed.o = TensorView{};
  packed.lse = LseView{};
  const VideoLayout& l = host.layout;
  Tensor full_o(DType::F32, l.batch, l.tokens(), 3, l.head_dim);
  LseBuffer full_lse(l.batch, 3, l.tokens());
  const std::vector<std::int64_t> heads = {2, 0}, twice = {1, 1}, outside = {0, 3}, one = {0}, swapped = {1, 0};
  const ScatteredOutput out{l.grid, TokenOrder::FrameMajor, TokenOrder::FrameMajor, heads, full_o.view(),
                            full_lse.view()};
  const CudaBackend backend;
  const auto expect_invalid = [&](const AttentionCall& call, const ScatteredOutput& o, const std::string& fragment) {
    try {
      backend.run_async_scattered(call, o, nullptr);
      ADD_FAILURE() << "accepted; expected an error naming '" << fragment << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_invalid(host.problem.call(), out, "must be empty");  // call.o set too
  ScatteredOutput bad = out;
  bad.heads = twice;
  expect_invalid(packed, bad, "listed twice");
  bad.heads = outside;
  expect_invalid(packed, bad, "out of range");
  bad.heads = one;
  expect_invalid(packed, bad, "1 output heads for 2 heads");
  bad = out;
  bad.grid.frames = 3;
  expect_invalid(packed, bad, "output grid");
  bad = out;
  bad.o = packed.q;  // the output over an input (and of another dtype)
  bad.heads = std::span<const std::int64_t>(swapped);
  bad.lse = LseView{};
  expect_invalid(packed, bad, "overlaps an input");
  bad = out;
  bad.o.shape[3] = 32;  // the full tensor against the call's layout with its own head count
  expect_invalid(packed, bad, "scattered o has shape");
  bad = out;
  bad.o.shape[2] = -100;  // a head count no layout has (not an allocation of that size)
  expect_invalid(packed, bad, "heads");
  bad = out;
  bad.lse.shape[1] = 2;
  expect_invalid(packed, bad, "scattered lse has shape");
  bad = out;
  bad.lse.stride[1] = 0;  // every head's LSE row in one place
  expect_invalid(packed, bad, "scattered lse has overlapping strides");
  bad = out;
  bad.o.data = nullptr;
  expect_invalid(packed, bad, "no output tensor");
  bad = out;
  bad.from = TokenOrder::SpatialMajor;  // the heads' plans are frame-major
  expect_invalid(packed, bad, "order");
  // One packed head: the narrowed view has one head, so the full tensor's head
  // stride must be checked on its own: heads overlapping each other, then rows
  // that are not 16-byte aligned.
  const AttentionCall one_head = testing::first_heads(packed, 1);
  bad = out;
  bad.heads = std::span<const std::int64_t>(heads).first(1);
  bad.o.stride[2] = l.head_dim / 2;
  expect_invalid(one_head, bad, "scattered o has overlapping strides");
  // Rows of 208 floats (832 bytes, 16-byte multiples) holding 3 heads 65 floats (260 bytes) apart.
  Tensor skewed(DType::F32, l.batch, l.tokens(), 208, 1);
  ScatteredOutput narrow = out;
  narrow.heads = std::span<const std::int64_t>(heads).first(1);
  narrow.o = skewed.view();
  narrow.o.shape = {l.batch, l.tokens(), 3, l.head_dim};
  narrow.o.stride = {skewed.view().stride[0], skewed.view().stride[1], 65, 1};
  narrow.lse = LseView{};
  try {
    backend.run_async_scattered(one_head, narrow, nullptr);
    ADD_FAILURE() << "a head stride of 260 bytes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head stride"), std::string::npos) << e.what();
  }
  EXPECT_THROW(backend.run_async_scattered(packed, out, nullptr), Unsupported);  // host memory (or no GPU)
}

TEST(GpuAttentionInput, NegativePersistentBlocksAreInvalid) {
  EXPECT_THROW(CudaBackend(CudaBackendOptions{CudaKernel::Auto, CudaWorkOrder::AcrossHeads, -1}), InvalidArgument);
  EXPECT_NO_THROW(CudaBackend(CudaBackendOptions{CudaKernel::Auto, CudaWorkOrder::AcrossHeads, 0}));
}

TEST(GpuAttentionInput, BlockScheduleNamesRoundTrip) {
  for (const CudaBlockSchedule schedule :
       {CudaBlockSchedule::Balanced, CudaBlockSchedule::RoundRobin, CudaBlockSchedule::Snake})
    EXPECT_EQ(parse_cuda_block_schedule(to_string(schedule)), schedule);
  EXPECT_THROW(parse_cuda_block_schedule("dynamic"), InvalidArgument);
  EXPECT_EQ(CudaBackend().options().block_schedule, CudaBlockSchedule::RoundRobin);
  CudaBackendOptions nonsense;
  nonsense.block_schedule = static_cast<CudaBlockSchedule>(7);
  EXPECT_THROW(CudaBackend{nonsense}, InvalidArgument);
}

TEST(GpuAttentionInput, WorkOrderNamesRoundTrip) {
  for (const CudaWorkOrder order :
       {CudaWorkOrder::Auto, CudaWorkOrder::AcrossHeads, CudaWorkOrder::HeadByHead, CudaWorkOrder::HeavyFirst})
    EXPECT_EQ(parse_cuda_work_order(to_string(order)), order);
  EXPECT_THROW(parse_cuda_work_order("random"), InvalidArgument);
  EXPECT_EQ(CudaBackend().options().work_order, CudaWorkOrder::Auto);
  CudaBackendOptions nonsense;
  nonsense.work_order = static_cast<CudaWorkOrder>(4);
  EXPECT_THROW(CudaBackend{nonsense}, InvalidArgument);
}

TEST(GpuAttentionInput, KernelNamesRoundTrip) {
  for (const CudaKernel k : {CudaKernel::Auto, CudaKernel::Sm80, CudaKernel::Sm90, CudaKernel::Sm90Overlap,
                             CudaKernel::Sm90PingPong})
    EXPECT_EQ(parse_cuda_kernel(to_string(k)), k);
  EXPECT_THROW(parse_cuda_kernel("sm100"), InvalidArgument);
  EXPECT_EQ(CudaBackend().options().kernel, CudaKernel::Auto);
  EXPECT_EQ(CudaBackend(CudaBackendOptions{CudaKernel::Sm80}).options().kernel, CudaKernel::Sm80);
  EXPECT_THROW(CudaBackend{CudaBackendOptions{static_cast<CudaKernel>(9)}}, InvalidArgument);
}

TEST(GpuAttentionInput, TheKernelResolvesOnlyWithAGpu) {
  if (cuda_device_count() == 0) {
    EXPECT_THROW(CudaBackend().resolved_kernel(), Unsupported);
    return;
  }
  const CudaKernel automatic = CudaBackend().resolved_kernel();
  EXPECT_EQ(automatic, is_hopper() ? CudaKernel::Sm90PingPong : CudaKernel::Sm80);
  if (!is_hopper()) {
    for (const CudaKernel k : {CudaKernel::Sm90, CudaKernel::Sm90Overlap, CudaKernel::Sm90PingPong}) {
      EXPECT_THROW(CudaBackend(CudaBackendOptions{k}).resolved_kernel(), Unsupported);
      HostCall host;
      DeviceProblem device(host.problem);
      const CudaBackend hopper_only(CudaBackendOptions{k});
      EXPECT_FALSE(hopper_only.supports(device.call).ok);
      EXPECT_THROW(hopper_only.run(device.call), Unsupported);
    }
  }
}

TEST(GpuAttentionInput, TheBackendIsRegistered) {
  const Backend& cuda = backend("cuda");
  EXPECT_EQ(cuda.name(), "cuda");
}

TEST(GpuAttentionInput, OneHostTensorAmongDeviceTensorsIsUnsupported) {
  STSA_REQUIRE_GPU();
  HostCall host;
  DeviceProblem device(host.problem);
  AttentionCall call = device.call;
  call.v = host.problem.v.view();  // host memory
  expect_unsupported(call, "v is host memory");
}

}  // namespace
}  // namespace stsa
