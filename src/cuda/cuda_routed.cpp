// cuda_run_routed / cuda_routed_attention: run_routed() (routed.hpp) over an
// executor whose packed buffers are scratch device memory (stream_scratch.hpp),
// whose permutation is cuda_gather_heads (and cuda_scatter_heads when the
// scatter is not fused), whose attention is CudaBackend::run_async (and
// run_async_scattered for the packed heads when it is), all on one stream,
// timed with CUDA events.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "cuda/capture.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/stream_scratch.hpp"
#include "stsa/cuda_routing.hpp"
#include "stsa/error.hpp"

namespace stsa {
namespace {

class CudaRoutedExecutor final : public RoutedExecutor {
 public:
  CudaRoutedExecutor(const CudaBackend& backend, void* stream) : backend_(backend), stream_(stream) {}
  ~CudaRoutedExecutor() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);  // errors ignored in a destructor,
    cudaGetLastError();                                  // and cleared: they must not fail a later launch check
  }
  CudaRoutedExecutor(const CudaRoutedExecutor&) = delete;
  CudaRoutedExecutor& operator=(const CudaRoutedExecutor&) = delete;

  // One scratch allocation for all packed tensors, returned on this stream once
  // run_routed() drops it (after the last step using it is enqueued).
  PackedHeads allocate(const RoutedCall& call, std::int64_t count, bool with_output) override {
    const VideoLayout& l = call.layout;
    const auto elements = std::size_t(l.batch * l.tokens() * count * l.head_dim);
    cuda_detail::ScratchLayout layout;
    const std::size_t at_q = layout.add(elements * element_size(call.q.dtype));
    const std::size_t at_k = layout.add(elements * element_size(call.k.dtype));
    const std::size_t at_v = layout.add(elements * element_size(call.v.dtype));
    const std::size_t at_o = layout.add(with_output ? elements * element_size(call.o.dtype) : 0);
    const bool with_lse = with_output && call.lse.data != nullptr;
    const std::size_t at_lse = layout.add(with_lse ? std::size_t(l.batch * count * l.tokens()) * sizeof(float) : 0);
    auto scratch = std::make_shared<cuda_detail::StreamScratch>(layout.bytes, static_cast<cudaStream_t>(stream_));
    std::byte* base = scratch->data();
    const auto packed_view = [&](std::size_t at, DType dtype) {
      return TensorView::contiguous(base + at, dtype, l.batch, l.tokens(), count, l.head_dim, MemoryLayout::BNHD);
    };
    PackedHeads packed;
    packed.q = packed_view(at_q, call.q.dtype);
    packed.k = packed_view(at_k, call.k.dtype);
    packed.v = packed_view(at_v, call.v.dtype);
    if (with_output) packed.o = packed_view(at_o, call.o.dtype);
    if (with_lse) packed.lse = LseView::contiguous(reinterpret_cast<float*>(base + at_lse), l.batch, count, l.tokens());
    packed.storage = std::move(scratch);
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

// A routed call allocates its packed heads per call and reads its steps' times
// back on the host: neither fits in a CUDA graph (the wait would invalidate the
// capture after part of the call was enqueued). Refused before anything is.
void refuse_capture(const char* who, void* stream) {
  STSA_CHECK(!cuda_detail::stream_is_capturing(stream), Unsupported, who,
             ": the stream is being captured into a CUDA graph, and a routed call allocates its packed heads and "
             "waits for its timing events, which a graph cannot hold; run it outside the capture, or capture "
             "cuda_gather_heads and CudaBackend::run_async / run_async_scattered on buffers allocated before it");
}

}  // namespace

RoutedResult cuda_run_routed(const CudaBackend& backend, PlanCache& plans, const RoutedCall& call,
                             std::vector<HeadRoute> decisions, const RoutedOptions& options, void* stream) {
  cuda_detail::current_device();  // Unsupported without a GPU, before asking about captures
  refuse_capture("cuda routed attention", stream);
  CudaRoutedExecutor executor(backend, stream);
  return run_routed(executor, backend, plans, call, std::move(decisions), options);
}

RoutedResult cuda_routed_attention(const CudaBackend& backend, PlanCache& plans, const RoutedCall& call,
                                   const Router& router, const RoutedOptions& options, void* stream) {
  check_routed_call(backend, call, "cuda routed attention");
  refuse_capture("cuda routed attention", stream);
  const RoutingReport report = cuda_route(router, call.layout, call.q, call.k, call.v, TokenOrder::FrameMajor,
                                          call.softmax_scale, {}, stream);
  RoutedResult result = cuda_run_routed(backend, plans, call, report.heads, options, stream);
  result.routing_ms = report.routing_ms;
  result.routing_flops = report.flops;
  return result;
}

RoutedResult cuda_policy_attention(const CudaBackend& backend, PlanCache& plans, Policy& policy, const RoutedCall& call,
                                   std::int64_t step, std::int64_t layer, const RoutedOptions& options, void* stream) {
  check_routed_call(backend, call, "cuda policy attention");
  refuse_capture("cuda policy attention", stream);
  const PolicyDecisions decided = policy.decide(step, layer, call.layout, [&](std::span<const std::int64_t> heads) {
    return cuda_route(Router(policy.options().router), call.layout, call.q, call.k, call.v, TokenOrder::FrameMajor,
                      call.softmax_scale, heads, stream);
  });
  RoutedResult result = cuda_run_routed(backend, plans, call, decided.heads, options, stream);
  result.routing_ms = decided.routing.routing_ms;
  result.routing_flops = decided.routing.flops;
  return result;
}

}  // namespace stsa
