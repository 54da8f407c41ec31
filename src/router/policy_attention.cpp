#include "stsa/error.hpp"
#include "stsa/routed.hpp"

namespace stsa {

RoutedResult policy_attention(const Backend& backend, PlanCache& plans, Policy& policy, const RoutedCall& call,
                              std::int64_t step, std::int64_t layer, const RoutedOptions& options) {
  const PolicyDecisions decided = policy.decide(step, layer, call.layout, [&](std::span<const std::int64_t> heads) {
    // Check the tensors against the layout before routing reads them.
    validate(call.unrouted_call(), /*require_plans=*/false);
    return Router(policy.options().router)
        .route(call.layout, call.q, call.k, call.v, TokenOrder::FrameMajor, call.softmax_scale, heads, call.descales);
  });
  RoutedResult result = run_routed(backend, plans, call, decided.heads, options);
  result.routing_ms = decided.routing.routing_ms;
  result.routing_flops = decided.routing.flops;
  return result;
}

}  // namespace stsa
