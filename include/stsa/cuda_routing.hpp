// Routing and routed attention with every tensor on the GPU: a whole call
// (route, plans, permutation, attention, inverse permutation) never copies a
// tensor to the host; only the per-head routing errors come back.
//
// Plain C++: using it needs no CUDA header. q, k, v (and o, lse) must be device
// memory of the current device. Checked before anything is launched: shapes
// against the layout (InvalidArgument, as Router::route), then what the GPU
// router takes (Unsupported): q, k, v all bf16 or all fp16; head dim a multiple
// of 16 up to 128; head dim contiguous; data pointers and the B, N, H strides
// 16-byte aligned; device pointers; compute capability 8.0 or newer. Routed
// attention adds the CudaBackend's own requirements (cuda.hpp).
// CUDA graphs (docs/cuda.md): routing cannot be captured (its errors come
// back to the host): on a capturing stream cuda_route throws Unsupported before
// enqueuing anything. A routed call with given (or reused) decisions can be,
// with its packed heads in a CudaRoutedWorkspace made before the capture.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "stsa/cuda.hpp"
#include "stsa/layout.hpp"
#include "stsa/plan.hpp"
#include "stsa/policy.hpp"
#include "stsa/routed.hpp"
#include "stsa/router.hpp"
#include "stsa/tensor.hpp"

namespace stsa {

// Router::route() on the GPU: the same sampled rows (Router::sample_rows), the
// same candidates, errors and decision rule, computed on `stream` (a
// cudaStream_t; nullptr: the default stream); returns once the errors are on
// the host. The errors differ from the CPU router's by the rounding of the
// attention weights to the input type before P.V (as in any tensor-core
// attention); the report's flops equal the CPU router's exactly. routing_ms is
// the wall time of the whole call, routing_device_ms that of its kernels on the
// stream (the rest is host work, copies and the wait).
RoutingReport cuda_route(const Router& router, const VideoLayout& layout, const TensorView& q, const TensorView& k,
                         const TensorView& v, TokenOrder order = TokenOrder::FrameMajor, float softmax_scale = 0.f,
                         std::span<const std::int64_t> heads = {}, void* stream = nullptr);

// What routed calls captured into a CUDA graph keep on the device for as long
// as the graph may replay (hold the workspace that long): the temporal heads'
// packed copies (memory made before the capture) and the device plans and
// block schedules the recorded launches read. Sized for `call`'s shape with up
// to `temporal_heads` temporal heads (-1: every head; 0: plans only; other
// values outside [-1, heads]: InvalidArgument), and for
// packed outputs too when the scatter will not be fused. Allocated on the
// current device; Unsupported without a GPU, ResourceError when the device is
// out of memory. One call at a time: calls sharing a workspace must be
// ordered (one stream).
class CudaRoutedWorkspace {
 public:
  explicit CudaRoutedWorkspace(const RoutedCall& call, std::int64_t temporal_heads = -1, bool fuse_scatter = true);
  std::size_t bytes() const { return buffer_.bytes(); }
  void* data() const { return buffer_.data(); }
  // The bytes the packed heads of `call` take: `count` temporal heads, with
  // packed O (and LSE when the call has one) when `with_output`.
  static std::size_t bytes_needed(const RoutedCall& call, std::int64_t count, bool with_output);
  // Keeps `plans` alive with the workspace (a captured call adds the plans it recorded).
  void keep(const std::vector<std::shared_ptr<const DevicePlan>>& plans);
  std::size_t kept_plans() const { return kept_.size(); }

 private:
  DeviceBuffer buffer_;
  std::vector<std::shared_ptr<const DevicePlan>> kept_;
};

// run_routed() on the GPU: plans from `plans`, non-temporal heads in place,
// temporal heads gathered into packed device buffers (cuda_gather_heads) and
// run with their O and LSE stored in place by the kernel (run_async_scattered;
// with options.fuse_scatter off, into packed buffers and scattered back by
// cuda_scatter_heads), all enqueued on `stream`; returns when the outputs are
// written. Times come from CUDA events. The packed buffers come from the
// library's scratch pool, or from `workspace` when one is given.
// On a stream being captured into a CUDA graph the call is recorded, not run:
// it needs a workspace (which then keeps the recorded plans), nothing is timed
// (RoutedResult::timed false), and every plan and block schedule must be on the
// device already (the same call once before the capture); what is missing is
// refused (Unsupported, InvalidArgument) before any step is recorded.
RoutedResult cuda_run_routed(const CudaBackend& backend, PlanCache& plans, const RoutedCall& call,
                             std::vector<HeadRoute> decisions, const RoutedOptions& options = {},
                             void* stream = nullptr, CudaRoutedWorkspace* workspace = nullptr);

// routed_attention() on the GPU: cuda_route() over all heads, then cuda_run_routed().
RoutedResult cuda_routed_attention(const CudaBackend& backend, PlanCache& plans, const RoutedCall& call,
                                   const Router& router, const RoutedOptions& options = {}, void* stream = nullptr);

// policy_attention() on the GPU, the call a serving loop makes per layer and
// step: dense in the policy's warm-up; elsewhere reused decisions, cuda_route()
// for the other heads (remembered), then cuda_run_routed() (with `workspace`).
// A step that routes cannot be captured into a CUDA graph; a dense or reusing
// step can, as cuda_run_routed() says.
RoutedResult cuda_policy_attention(const CudaBackend& backend, PlanCache& plans, Policy& policy, const RoutedCall& call,
                                   std::int64_t step, std::int64_t layer, const RoutedOptions& options = {},
                                   void* stream = nullptr, CudaRoutedWorkspace* workspace = nullptr);

}  // namespace stsa
