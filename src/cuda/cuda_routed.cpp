// cuda_run_routed / cuda_routed_attention: run_routed() (routed.hpp) over an
// executor whose packed buffers are device memory, whose permutation is
// cuda_gather_heads / cuda_scatter_heads, whose attention is
// CudaBackend::run_async, all on one stream, timed with CUDA events.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "cuda/cuda_check.hpp"
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

  PackedHeads allocate(const RoutedCall& call, std::int64_t count) override {
    const VideoLayout& l = call.layout;
    const auto rows = std::size_t(l.batch * l.tokens() * count * l.head_dim);
    struct Storage {
      DeviceBuffer q, k, v, o, lse;
    };
    auto s = std::make_shared<Storage>();
    s->q = DeviceBuffer(rows * element_size(call.q.dtype));
    s->k = DeviceBuffer(rows * element_size(call.k.dtype));
    s->v = DeviceBuffer(rows * element_size(call.v.dtype));
    s->o = DeviceBuffer(rows * element_size(call.o.dtype));
    PackedHeads packed;
    packed.q = TensorView::contiguous(s->q.data(), call.q.dtype, l.batch, l.tokens(), count, l.head_dim, MemoryLayout::BNHD);
    packed.k = TensorView::contiguous(s->k.data(), call.k.dtype, l.batch, l.tokens(), count, l.head_dim, MemoryLayout::BNHD);
    packed.v = TensorView::contiguous(s->v.data(), call.v.dtype, l.batch, l.tokens(), count, l.head_dim, MemoryLayout::BNHD);
    packed.o = TensorView::contiguous(s->o.data(), call.o.dtype, l.batch, l.tokens(), count, l.head_dim, MemoryLayout::BNHD);
    if (call.lse.data != nullptr) {
      s->lse = DeviceBuffer(std::size_t(l.batch * count * l.tokens()) * sizeof(float));
      packed.lse = LseView::contiguous(static_cast<float*>(s->lse.data()), l.batch, count, l.tokens());
    }
    packed.storage = std::move(s);
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

}  // namespace

RoutedResult cuda_run_routed(const CudaBackend& backend, PlanCache& plans, const RoutedCall& call,
                             std::vector<HeadRoute> decisions, const RoutedOptions& options, void* stream) {
  CudaRoutedExecutor executor(backend, stream);
  return run_routed(executor, backend, plans, call, std::move(decisions), options);
}

RoutedResult cuda_routed_attention(const CudaBackend& backend, PlanCache& plans, const RoutedCall& call,
                                   const Router& router, const RoutedOptions& options, void* stream) {
  // Check the whole call (shapes, dtypes, aliasing, what the backend takes) before routing.
  AttentionCall check = call.attention_call();
  check.heads.assign(std::size_t(std::max<std::int64_t>(call.layout.heads, 0)),
                     HeadMask{MaskSpec::dense(), TokenOrder::FrameMajor, nullptr, true});
  validate(check, /*require_plans=*/false);
  for (HeadMask& head : check.heads) head.compute = false;  // no plans yet: tensors, dtypes and memory only
  const Support support = backend.supports(check);
  STSA_CHECK(support.ok, Unsupported, "cuda routed attention: ", support.why);

  const RoutingReport report = cuda_route(router, call.layout, call.q, call.k, call.v, TokenOrder::FrameMajor,
                                          call.softmax_scale, {}, stream);
  RoutedResult result = cuda_run_routed(backend, plans, call, report.heads, options, stream);
  result.routing_ms = report.routing_ms;
  result.routing_flops = report.flops;
  return result;
}

}  // namespace stsa
