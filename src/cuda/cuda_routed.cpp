// cuda_run_routed / cuda_routed_attention: run_routed() (routed.hpp) over an
// executor whose packed buffers are scratch device memory (stream_scratch.hpp),
// whose permutation is cuda_gather_heads (and cuda_scatter_heads when the
// scatter is not fused), whose attention is CudaBackend::run_async (and
// run_async_scattered for the packed heads when it is), all on one stream,
// timed with CUDA events; or, during a CUDA graph capture, recorded untimed
// with the packed heads in the caller's CudaRoutedWorkspace.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "cuda/capture.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device_checks.hpp"
#include "cuda/stream_scratch.hpp"
#include "stsa/cuda_routing.hpp"
#include "stsa/error.hpp"

namespace stsa {
namespace {

// Where the packed heads of `count` temporal heads sit in one allocation.
struct PackedLayout {
  cuda_detail::ScratchLayout scratch;
  std::size_t q = 0, k = 0, v = 0, o = 0, lse = 0;
  bool with_output = false, with_lse = false;
};

PackedLayout packed_layout(const RoutedCall& call, std::int64_t count, bool with_output) {
  const VideoLayout& l = call.layout;
  const auto elements = std::size_t(l.batch * l.tokens() * count * l.head_dim);
  PackedLayout p;
  p.q = p.scratch.add(elements * element_size(call.q.dtype));
  p.k = p.scratch.add(elements * element_size(call.k.dtype));
  p.v = p.scratch.add(elements * element_size(call.v.dtype));
  p.with_output = with_output;
  p.o = p.scratch.add(with_output ? elements * element_size(call.o.dtype) : 0);
  p.with_lse = with_output && call.lse.data != nullptr;
  p.lse = p.scratch.add(p.with_lse ? std::size_t(l.batch * count * l.tokens()) * sizeof(float) : 0);
  return p;
}

class CudaRoutedExecutor final : public RoutedExecutor {
 public:
  CudaRoutedExecutor(const CudaBackend& backend, void* stream, CudaRoutedWorkspace* workspace)
      : backend_(backend), stream_(stream), workspace_(workspace),
        capturing_(cuda_detail::stream_is_capturing(stream, "cuda routed attention: ")) {
    // Scratch allocated while capturing would be memory the graph owns, and the
    // recorded plans must outlive the capture: both go in the caller's workspace.
    STSA_CHECK(!capturing_ || workspace_ != nullptr, Unsupported,
               "cuda routed attention: the stream is being captured into a CUDA graph, and a recorded call needs "
               "memory and plans that outlive the capture: pass a CudaRoutedWorkspace made before it");
  }
  ~CudaRoutedExecutor() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);  // errors ignored in a destructor,
    cudaGetLastError();                                  // and cleared: they must not fail a later launch check
  }
  CudaRoutedExecutor(const CudaRoutedExecutor&) = delete;
  CudaRoutedExecutor& operator=(const CudaRoutedExecutor&) = delete;

  // One allocation for all packed tensors: the caller's workspace, or scratch
  // returned on this stream once run_routed() drops it (after the last step
  // using it is enqueued).
  PackedHeads allocate(const RoutedCall& call, std::int64_t count, bool with_output) override {
    const PackedLayout at = packed_layout(call, count, with_output);
    std::byte* base = nullptr;
    std::shared_ptr<void> storage;
    if (workspace_ != nullptr) {
      STSA_CHECK(workspace_->bytes() >= at.scratch.bytes, InvalidArgument, "cuda routed attention: the workspace holds ",
                 workspace_->bytes(), " bytes; ", count, " temporal heads", with_output ? " with packed outputs" : "",
                 " need ", at.scratch.bytes);
      base = static_cast<std::byte*>(workspace_->data());
    } else {
      auto scratch = std::make_shared<cuda_detail::StreamScratch>(at.scratch.bytes, static_cast<cudaStream_t>(stream_));
      base = scratch->data();
      storage = std::move(scratch);
    }
    const VideoLayout& l = call.layout;
    const auto packed_view = [&](std::size_t offset, DType dtype) {
      return TensorView::contiguous(base + offset, dtype, l.batch, l.tokens(), count, l.head_dim, MemoryLayout::BNHD);
    };
    PackedHeads packed;
    packed.q = packed_view(at.q, call.q.dtype);
    packed.k = packed_view(at.k, call.k.dtype);
    packed.v = packed_view(at.v, call.v.dtype);
    if (at.with_output) packed.o = packed_view(at.o, call.o.dtype);
    if (at.with_lse) packed.lse = LseView::contiguous(reinterpret_cast<float*>(base + at.lse), l.batch, count, l.tokens());
    packed.storage = std::move(storage);
    return packed;
  }

  void gather(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
              std::span<const TensorView> sources, std::span<const TensorView> packed) override {
    cuda_gather_heads(grid, from, to, heads, sources, packed, stream_);
  }

  void scatter(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
               std::span<const TensorView> packed, std::span<const TensorView> dests, const LseView& packed_lse,
               const LseView& lse) override {
    cuda_scatter_heads(grid, from, to, heads, packed, dests, packed_lse, lse, stream_);
  }

  void attend(const Backend& backend, const AttentionCall& call) override {
    STSA_CHECK(&backend == &backend_, InvalidArgument, "cuda routed attention: the executor runs its own CudaBackend");
    backend_.run_async(call, stream_);
  }

  bool fuses_scatter(const Backend& backend) const override { return &backend == &backend_; }

  void attend_scattered(const Backend& backend, const AttentionCall& packed, const ScatteredOutput& out) override {
    STSA_CHECK(&backend == &backend_, InvalidArgument, "cuda routed attention: the executor runs its own CudaBackend");
    backend_.run_async_scattered(packed, out, stream_);
  }

  // While capturing, what the launches would upload is refused before any step is recorded.
  void prepare(const Backend& backend, const AttentionCall& call, const ScatteredOutput* out) override {
    STSA_CHECK(&backend == &backend_, InvalidArgument, "cuda routed attention: the executor runs its own CudaBackend");
    if (capturing_) workspace_->keep(backend_.prepare(call, stream_, out));
  }

  bool timed() const override { return !capturing_; }

  int mark() override {
    cudaEvent_t e = nullptr;
    STSA_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
    STSA_CUDA_CHECK(cudaEventRecord(e, static_cast<cudaStream_t>(stream_)));
    return int(events_.size()) - 1;
  }

  double elapsed_ms(int from, int to) override {
    STSA_CUDA_CHECK(cudaEventSynchronize(events_.at(std::size_t(to))));
    float ms = 0;
    STSA_CUDA_CHECK(cudaEventElapsedTime(&ms, events_.at(std::size_t(from)), events_.at(std::size_t(to))));
    return double(ms);
  }

 private:
  const CudaBackend& backend_;
  void* stream_;
  CudaRoutedWorkspace* workspace_;
  bool capturing_;
  std::vector<cudaEvent_t> events_;
};

// The whole call (shapes, dtypes, aliasing, what the backend takes), checked
// before anything is routed or launched.
void check_routed_call(const CudaBackend& backend, const RoutedCall& call, const char* who) {
  const AttentionCall check = call.unrouted_call();  // no plans yet: tensors, dtypes and memory only
  validate(check, /*require_plans=*/false);
  const Support support = backend.supports(check);
  STSA_CHECK(support.ok, Unsupported, who, ": ", support.why);
}

}  // namespace

std::size_t CudaRoutedWorkspace::bytes_needed(const RoutedCall& call, std::int64_t count, bool with_output) {
  call.layout.validate();
  STSA_CHECK(count >= 0 && count <= call.layout.heads, InvalidArgument, "cuda routed workspace: ", count,
             " temporal heads of ", call.layout.heads);
  return count == 0 ? 0 : packed_layout(call, count, with_output).scratch.bytes;
}

void CudaRoutedWorkspace::keep(const std::vector<std::shared_ptr<const DevicePlan>>& plans) {
  for (const auto& plan : plans)
    if (std::find(kept_.begin(), kept_.end(), plan) == kept_.end()) kept_.push_back(plan);
}

CudaRoutedWorkspace::CudaRoutedWorkspace(const RoutedCall& call, std::int64_t temporal_heads, bool fuse_scatter)
    : buffer_(bytes_needed(call, temporal_heads == -1 ? call.layout.heads : temporal_heads, !fuse_scatter)) {}

RoutedResult cuda_run_routed(const CudaBackend& backend, PlanCache& plans, const RoutedCall& call,
                             std::vector<HeadRoute> decisions, const RoutedOptions& options, void* stream,
                             CudaRoutedWorkspace* workspace) {
  // Before the gather: it would hand the kernel one K/V copy per temporal head, an ungrouped
  // call, so a call with every head temporal would pass no refusal of the backend's own.
  cuda_detail::refuse_grouped_kv("cuda routed attention: ", call.k, call.layout.heads);
  cuda_detail::current_device();  // Unsupported without a GPU, before asking about captures
  CudaRoutedExecutor executor(backend, stream, workspace);
  return run_routed(executor, backend, plans, call, std::move(decisions), options);
}

RoutedResult cuda_routed_attention(const CudaBackend& backend, PlanCache& plans, const RoutedCall& call,
                                   const Router& router, const RoutedOptions& options, void* stream) {
  check_routed_call(backend, call, "cuda routed attention");
  const RoutingReport report = cuda_route(router, call.layout, call.q, call.k, call.v, TokenOrder::FrameMajor,
                                          call.softmax_scale, {}, stream);
  RoutedResult result = cuda_run_routed(backend, plans, call, report.heads, options, stream);
  result.routing_ms = report.routing_ms;
  result.routing_flops = report.flops;
  return result;
}

RoutedResult cuda_policy_attention(const CudaBackend& backend, PlanCache& plans, Policy& policy, const RoutedCall& call,
                                   std::int64_t step, std::int64_t layer, const RoutedOptions& options, void* stream,
                                   CudaRoutedWorkspace* workspace) {
  check_routed_call(backend, call, "cuda policy attention");
  const PolicyDecisions decided = policy.decide(step, layer, call.layout, [&](std::span<const std::int64_t> heads) {
    return cuda_route(Router(policy.options().router), call.layout, call.q, call.k, call.v, TokenOrder::FrameMajor,
                      call.softmax_scale, heads, stream);
  });
  RoutedResult result = cuda_run_routed(backend, plans, call, decided.heads, options, stream, workspace);
  result.routing_ms = decided.routing.routing_ms;
  result.routing_flops = decided.routing.flops;
  return result;
}

}  // namespace stsa
