#include "targets.hpp"

#include "stsa/error.hpp"
#ifdef STSA_HAS_CUDA
#include "stsa/cuda.hpp"
#include "stsa/cuda_routing.hpp"
#endif

namespace stsa::python {
namespace {

#ifdef STSA_HAS_CUDA
const CudaBackend& cuda_backend(const Target& target) { return dynamic_cast<const CudaBackend&>(*target.backend); }
#endif

}  // namespace

Target target_for(const std::string& name, Placement placement, std::uintptr_t stream) {
#ifndef STSA_HAS_CUDA
  STSA_CHECK(!placement.gpu, Unsupported, "the arrays are on CUDA device ", placement.device,
             ", and this build of stsa has no CUDA backend (built without nvcc, or with STSA_CUDA=OFF)");
#endif
  Target target;
  target.placement = placement;
  target.backend = &backend(name.empty() ? (placement.gpu ? "cuda" : "cpu") : std::string_view(name));
  const bool gpu_backend = target.backend->name() == "cuda";
  STSA_CHECK(
      gpu_backend == placement.gpu, InvalidArgument, "backend '", target.backend->name(), "' takes ",
      gpu_backend ? "CUDA" : "host", " arrays; these are in ",
      placement.gpu ? detail::concat("the memory of CUDA device ", placement.device) : std::string("host memory"),
      " (leave backend unset to run where they are)");
  target.stream = reinterpret_cast<void*>(stream);
  return target;
}

// Without the CUDA backend, target_for has refused GPU arrays: the throws below
// are unreachable there and only keep the branches total.
RoutingReport route_on(const Target& target, const Router& router, const RoutedCall& call,
                       std::span<const std::int64_t> heads) {
  if (target.placement.gpu) {
    STSA_CHECK(call.descales.empty(), Unsupported,
               "the cuda router takes no per-(batch, head) descales yet (host arrays do)");
#ifdef STSA_HAS_CUDA
    return cuda_route(router, call.layout, call.q, call.k, call.v, TokenOrder::FrameMajor, call.softmax_scale, heads,
                      target.stream);
#else
    throw Unsupported("this build of stsa has no CUDA backend");
#endif
  }
  return router.route(call.layout, call.q, call.k, call.v, TokenOrder::FrameMajor, call.softmax_scale, heads,
                      call.descales);
}

RoutedResult run_given(const Target& target, PlanCache& plans, const RoutedCall& call, std::vector<HeadRoute> decisions,
                       const RoutedOptions& options) {
  if (target.placement.gpu) {
#ifdef STSA_HAS_CUDA
    return cuda_run_routed(cuda_backend(target), plans, call, std::move(decisions), options, target.stream);
#else
    throw Unsupported("this build of stsa has no CUDA backend");
#endif
  }
  return run_routed(*target.backend, plans, call, std::move(decisions), options);
}

RoutedResult run_routing(const Target& target, PlanCache& plans, const RoutedCall& call, const Router& router,
                         const RoutedOptions& options) {
  if (target.placement.gpu) {
#ifdef STSA_HAS_CUDA
    return cuda_routed_attention(cuda_backend(target), plans, call, router, options, target.stream);
#else
    throw Unsupported("this build of stsa has no CUDA backend");
#endif
  }
  return routed_attention(*target.backend, plans, call, router, options);
}

RoutedResult run_policy(const Target& target, PlanCache& plans, Policy& policy, const RoutedCall& call,
                        std::int64_t step, std::int64_t layer, const RoutedOptions& options) {
  if (target.placement.gpu) {
#ifdef STSA_HAS_CUDA
    return cuda_policy_attention(cuda_backend(target), plans, policy, call, step, layer, options, target.stream);
#else
    throw Unsupported("this build of stsa has no CUDA backend");
#endif
  }
  return policy_attention(*target.backend, plans, policy, call, step, layer, options);
}

}  // namespace stsa::python
