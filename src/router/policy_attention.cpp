#include "stsa/error.hpp"
#include "stsa/routed.hpp"

namespace stsa {

RoutedResult policy_attention(const Backend& backend, PlanCache& plans, Policy& policy, const RoutedCall& call,
                              std::int64_t step, std::int64_t layer, const RoutedOptions& options) {
  call.layout.validate();
  const std::int64_t heads = call.layout.heads;
  std::vector<HeadRoute> decisions(static_cast<std::size_t>(heads));
  if (policy.dense(step, layer)) return run_routed(backend, plans, call, decisions, options);  // default: dense

  std::vector<std::int64_t> stale;
  for (std::int64_t h = 0; h < heads; ++h) {
    if (auto hit = policy.cached(step, layer, h, call.layout.grid)) decisions[std::size_t(h)] = *hit;
    else stale.push_back(h);
  }
  RoutingReport report;
  if (!stale.empty()) {
    // Check the tensors against the layout before routing reads them.
    AttentionCall check = call.attention_call();
    check.heads.assign(std::size_t(heads), HeadMask{});
    validate(check, /*require_plans=*/false);
    report = Router(policy.options().router)
                 .route(call.layout, call.q, call.k, call.v, TokenOrder::FrameMajor, call.softmax_scale, stale);
    for (std::size_t i = 0; i < stale.size(); ++i) {
      decisions[std::size_t(stale[i])] = report.heads[i];
      policy.remember(step, layer, stale[i], call.layout.grid, report.heads[i]);
    }
  }
  RoutedResult result = run_routed(backend, plans, call, std::move(decisions), options);
  result.routing_ms = report.routing_ms;
  result.routing_flops = report.flops;
  return result;
}

}  // namespace stsa
