// Which backend runs a call from Python, and the routed entry points on it:
// host arrays on a host backend ("cpu", "reference"); CUDA arrays on the CUDA
// backend, on the caller's stream (routing, gather and the fused scatter on
// the GPU too: cuda_routing.hpp), where the build has it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "stsa/attention.hpp"
#include "stsa/policy.hpp"
#include "stsa/routed.hpp"
#include "stsa/router.hpp"
#include "tensor_args.hpp"

namespace stsa::python {

struct Target {
  Placement placement;               // where the call's arrays are
  const Backend* backend = nullptr;  // the backend named (for GPU arrays, "cuda")
  void* stream = nullptr;            // the caller's cudaStream_t (nullptr: the default stream), GPU arrays only
};

// `name` empty: "cuda" for GPU arrays, "cpu" for host arrays. Throws
// InvalidArgument for an unknown backend or one that cannot reach the arrays'
// memory, Unsupported for GPU arrays in a build without the CUDA backend.
Target target_for(const std::string& name, Placement placement, std::uintptr_t stream);

// Router::route (heads `heads` of q, k, v in frame-major order; all when empty), or cuda_route for GPU arrays.
RoutingReport route_on(const Target& target, const Router& router, const RoutedCall& call,
                       std::span<const std::int64_t> heads);

// run_routed, routed_attention and policy_attention (routed.hpp), or their GPU twins.
RoutedResult run_given(const Target& target, PlanCache& plans, const RoutedCall& call, std::vector<HeadRoute> decisions,
                       const RoutedOptions& options);
RoutedResult run_routing(const Target& target, PlanCache& plans, const RoutedCall& call, const Router& router,
                         const RoutedOptions& options);
RoutedResult run_policy(const Target& target, PlanCache& plans, Policy& policy, const RoutedCall& call,
                        std::int64_t step, std::int64_t layer, const RoutedOptions& options);

}  // namespace stsa::python
