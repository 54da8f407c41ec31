// cuda_route(): checks, sampled rows and candidate masks on the host, one
// workspace from the library's scratch pool (stream_scratch.hpp), the routing launches
// (routing_launch.hpp), and the report built from the per-head sums with the
// decision rule of Router::route().
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstddef>
#include <vector>

#include "cuda/capture.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device_checks.hpp"
#include "cuda/mask_predicate_host.hpp"
#include "cuda/routing_launch.hpp"
#include "cuda/routing_splits.hpp"
#include "cuda/stream_scratch.hpp"
#include "stsa/cuda_routing.hpp"
#include "stsa/error.hpp"
#include "stsa/route_eval.hpp"

namespace stsa {
namespace {

using cuda_detail::kMaxRoutingCandidates;
using cuda_detail::kRoutingOutputs;
using cuda_detail::kRoutingRows;
using cuda_detail::kRoutingStats;

void check_shape(const char* name, const TensorView& t, const VideoLayout& layout) {
  STSA_CHECK(t.data != nullptr, InvalidArgument, "cuda router: ", name, " is null");
  const std::array<std::int64_t, 4> expected{layout.batch, layout.tokens(), layout.heads, layout.head_dim};
  STSA_CHECK(t.shape == expected, InvalidArgument, "cuda router: ", name, " has shape [", t.shape[0], ", ",
             t.shape[1], ", ", t.shape[2], ", ", t.shape[3], "] but the layout ", layout.grid.describe(), " needs [",
             expected[0], ", ", expected[1], ", ", expected[2], ", ", expected[3], "]");
  for (int i = 0; i < 4; ++i)
    STSA_CHECK(t.stride[i] >= 0, InvalidArgument, "cuda router: ", name, " has a negative stride");
  t.byte_extent();  // InvalidArgument when the strides reach past the address space
}

// Two events around work on a stream: elapsed_ms() once the stream has passed
// stop(). Events are destroyed with it (errors ignored and cleared there).
class DeviceInterval {
 public:
  explicit DeviceInterval(cudaStream_t stream) : stream_(stream) {
    STSA_CUDA_CHECK(cudaEventCreate(&start_));
    cudaError_t e = cudaEventCreate(&stop_);
    if (e == cudaSuccess) e = cudaEventRecord(start_, stream_);
    if (e != cudaSuccess) {  // no destructor runs for a constructor that throws
      cudaEventDestroy(start_);
      if (stop_ != nullptr) cudaEventDestroy(stop_);
      STSA_CUDA_CHECK(e);
    }
  }
  ~DeviceInterval() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaGetLastError();
  }
  DeviceInterval(const DeviceInterval&) = delete;
  DeviceInterval& operator=(const DeviceInterval&) = delete;

  void stop() const { STSA_CUDA_CHECK(cudaEventRecord(stop_, stream_)); }
  double elapsed_ms() const {
    float ms = 0;
    STSA_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return double(ms);
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace

RoutingReport cuda_route(const Router& router, const VideoLayout& layout, const TensorView& q, const TensorView& k,
                         const TensorView& v, TokenOrder order, float softmax_scale,
                         std::span<const std::int64_t> heads, void* stream) {
  const auto start = std::chrono::steady_clock::now();
  const RouterOptions& options = router.options();
  layout.validate();
  // Token positions are 32-bit on the device, up to one key tile past the last.
  constexpr std::int64_t kMaxTokens = std::int64_t(INT_MAX) - cuda_detail::kRoutingKeys;
  STSA_CHECK(layout.tokens() <= kMaxTokens, Unsupported, "cuda router: token positions are 32-bit: at most ",
             kMaxTokens, " tokens per sequence, got ", layout.tokens());
  check_shape("q", q, layout);
  cuda_detail::refuse_grouped_kv("cuda router: ", k, layout.heads);
  check_shape("k", k, layout);
  check_shape("v", v, layout);
  STSA_CHECK(std::isfinite(softmax_scale), InvalidArgument, "cuda router: softmax scale must be finite");
  std::vector<std::int64_t> which(heads.begin(), heads.end());
  if (which.empty())
    for (std::int64_t h = 0; h < layout.heads; ++h) which.push_back(h);
  for (std::int64_t h : which)
    STSA_CHECK(h >= 0 && h < layout.heads, InvalidArgument, "cuda router: head ", h, " out of range [0, ",
               layout.heads, ")");
  RoutingReport report;
  router.sample_rows(layout, order, report.sampled_rows, report.sampled_batch);

  for (const auto& [name, tensor] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}}) {
    STSA_CHECK(tensor->dtype == DType::BF16 || tensor->dtype == DType::F16, Unsupported, "cuda router: ", name, " is ",
               to_string(tensor->dtype), "; the GPU router takes bf16 or fp16");
    cuda_detail::require_row_vectors("cuda router: ", name, *tensor);
  }
  STSA_CHECK(q.dtype == k.dtype && q.dtype == v.dtype, Unsupported, "cuda router: q, k and v must share one dtype (",
             to_string(q.dtype), ", ", to_string(k.dtype), ", ", to_string(v.dtype), ")");
  STSA_CHECK(cuda_detail::routing_head_dim_supported(int(layout.head_dim)), Unsupported, "cuda router: head dim ",
             layout.head_dim, " is not supported (multiples of 16 up to 128)");
  STSA_CHECK(which.size() <= 65535, Unsupported, "cuda router: at most 65535 heads per call, got ", which.size());
  const int device = cuda_detail::current_device();
  int major = 0, smem_optin = 0, sms = 0;
  STSA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  STSA_CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  STSA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  STSA_CHECK(major >= 8, Unsupported, "cuda router: needs compute capability 8.0 or newer, device ", device, " has ",
             major, ".x");
  const int candidates = options.try_frame_window ? 3 : 2;
  const int smem = cuda_detail::routing_shared_bytes(int(layout.head_dim), candidates);
  STSA_CHECK(smem_optin >= smem, Unsupported, "cuda router: needs ", smem, " bytes of shared memory per block at head dim ",
             layout.head_dim, " with ", candidates, " candidates; device ", device, " offers ", smem_optin);
  for (const auto& [name, tensor] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}})
    cuda_detail::require_device_memory("cuda router: ", name, tensor->byte_extent(), device,
                                       "the GPU router takes device pointers (Router::route takes host tensors)");

  std::vector<Route> routes{Route::Spatial, Route::Temporal};
  if (candidates == 3) routes.push_back(Route::FrameWindow);
  static_assert(kMaxRoutingCandidates >= 3);
  std::vector<MaskSpec> specs;
  for (Route r : routes) {
    specs.push_back(route_spec(layout.grid, r, options));
    specs.back().validate(layout.grid);
  }

  // Row blocks: the sampled rows of each batch entry in sample order, kRoutingRows at a time.
  std::vector<std::int32_t> positions, row_batch;
  for (std::int64_t b = 0; b < layout.batch; ++b) {
    std::vector<std::int32_t> rows;
    for (std::size_t i = 0; i < report.sampled_rows.size(); ++i)
      if (report.sampled_batch[i] == b) rows.push_back(std::int32_t(report.sampled_rows[i]));
    for (std::size_t first = 0; first < rows.size(); first += kRoutingRows) {
      row_batch.push_back(std::int32_t(b));
      for (std::size_t i = first; i < first + kRoutingRows; ++i) positions.push_back(i < rows.size() ? rows[i] : -1);
    }
  }
  const auto row_blocks = std::int64_t(row_batch.size());
  const auto head_count = std::int64_t(which.size());

  const cuda_detail::RoutingSplits key_splits =
      cuda_detail::routing_splits(layout.tokens(), sms, head_count * row_blocks);
  const std::int64_t splits = key_splits.splits, tiles_per_split = key_splits.tiles_per_split;

  const std::int64_t slots = head_count * row_blocks * splits * kRoutingOutputs;
  const std::int64_t slot_rows = slots * kRoutingRows;
  cuda_detail::ScratchLayout ws;
  const std::size_t at_ints = ws.add((positions.size() + row_batch.size() + which.size()) * sizeof(std::int32_t));
  const std::size_t at_max = ws.add(std::size_t(slot_rows) * sizeof(float));
  const std::size_t at_sum = ws.add(std::size_t(slot_rows) * sizeof(float));
  const std::size_t at_kept = ws.add(std::size_t(slot_rows) * sizeof(std::int32_t));
  const std::size_t at_acc = ws.add(std::size_t(slot_rows * layout.head_dim) * sizeof(float));
  const std::size_t at_row_stats =
      ws.add(std::size_t(head_count * row_blocks * kRoutingRows * kRoutingStats) * sizeof(double));
  const std::size_t at_head_stats = ws.add(std::size_t(head_count * kRoutingStats) * sizeof(double));

  // The errors come back to the host (a copy and a wait), which a CUDA graph cannot hold.
  STSA_CHECK(!cuda_detail::stream_is_capturing(stream, "cuda router: "), Unsupported,
             "cuda router: the stream is being captured into a CUDA graph, and routing reads its errors back to "
             "the host and waits for them, which a graph cannot hold; route before the capture (a Policy keeps "
             "the decisions for the steps that reuse them)");
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const cuda_detail::StreamScratch workspace(ws.bytes, cuda_stream);
  std::byte* base = workspace.data();
  std::vector<std::int32_t> ints = positions;
  ints.insert(ints.end(), row_batch.begin(), row_batch.end());
  for (std::int64_t h : which) ints.push_back(std::int32_t(h));
  STSA_CUDA_CHECK(cudaMemcpyAsync(base + at_ints, ints.data(), ints.size() * sizeof(std::int32_t),
                                  cudaMemcpyHostToDevice, cuda_stream));

  cuda_detail::RoutingParams p;
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = q.stride[i];
    p.k_stride[i] = k.stride[i];
    p.v_stride[i] = v.stride[i];
  }
  p.tokens = std::int32_t(layout.tokens());
  p.head_dim = std::int32_t(layout.head_dim);
  p.bf16 = q.dtype == DType::BF16;
  const double scale = softmax_scale != 0.f ? softmax_scale : float(1.0 / std::sqrt(double(layout.head_dim)));
  p.scale_log2 = float(scale * 1.4426950408889634);  // log2(e)
  p.grid = cuda_detail::predicate_grid(layout.grid, order);
  p.candidates = std::int32_t(specs.size());
  for (std::size_t c = 0; c < specs.size(); ++c) p.masks[c] = cuda_detail::predicate_mask(specs[c]);
  const auto* ints_device = reinterpret_cast<const std::int32_t*>(base + at_ints);
  p.row_positions = ints_device;
  p.row_batch = ints_device + positions.size();
  p.row_blocks = std::int32_t(row_blocks);
  p.heads = ints_device + positions.size() + row_batch.size();
  p.head_count = std::int32_t(head_count);
  p.splits = std::int32_t(splits);
  p.tiles_per_split = std::int32_t(tiles_per_split);
  p.part_max = reinterpret_cast<float*>(base + at_max);
  p.part_sum = reinterpret_cast<float*>(base + at_sum);
  p.part_kept = reinterpret_cast<std::int32_t*>(base + at_kept);
  p.part_acc = reinterpret_cast<float*>(base + at_acc);
  p.row_stats = reinterpret_cast<double*>(base + at_row_stats);
  p.head_stats = reinterpret_cast<double*>(base + at_head_stats);
  const DeviceInterval kernels(cuda_stream);
  cuda_detail::launch_routing(p, stream);
  kernels.stop();

  std::vector<double> stats(std::size_t(head_count * kRoutingStats));
  STSA_CUDA_CHECK(cudaMemcpyAsync(stats.data(), base + at_head_stats, stats.size() * sizeof(double),
                                  cudaMemcpyDeviceToHost, cuda_stream));
  STSA_CUDA_CHECK(cudaStreamSynchronize(cuda_stream));

  // The report, exactly as Router::route() builds it.
  const double values = double(report.sampled_rows.size()) * double(layout.head_dim);
  const double score_flops = 4.0 * double(report.sampled_rows.size()) * double(layout.tokens()) *
                             double(layout.head_dim);  // scores and the dense P.V
  for (std::int64_t i = 0; i < head_count; ++i) {
    const double* s = stats.data() + i * kRoutingStats;
    const double squared_reference = s[0];
    HeadRoute head;
    for (std::size_t c = 0; c < routes.size(); ++c) {
      const double squared_error = s[1 + c];
      CandidateError ce;
      ce.route = routes[c];
      ce.spec = specs[c];
      ce.mse = squared_error / values;
      ce.rel_l2 = relative_l2(squared_error, squared_reference);
      head.candidates.push_back(ce);
    }
    const CandidateError* best = head.best();
    if (best != nullptr && std::isfinite(best->rel_l2) && best->rel_l2 <= options.max_rel_l2) {
      head.route = best->route;
      head.spec = best->spec;
    } else {
      head.route = Route::Dense;
      head.spec = MaskSpec::dense();
    }
    report.flops += score_flops + 2.0 * s[kRoutingStats - 1] * double(layout.head_dim);
    report.heads.push_back(std::move(head));
  }
  report.routing_device_ms = kernels.elapsed_ms();
  report.routing_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace stsa
