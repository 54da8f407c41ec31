#include "stsa/routed.hpp"

#include <chrono>

#include "stsa/error.hpp"
#include "stsa/flops.hpp"
#include "stsa/permute.hpp"

namespace stsa {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}


}  // namespace

RoutedResult routed_attention(const Backend& backend, PlanCache& plans, const RoutedCall& call, const Router& router,
                              const RoutedOptions& options) {
  // Check the whole call (shapes, dtypes, aliasing) before spending time on routing.
  AttentionCall check = call.attention_call();
  check.heads.assign(std::size_t(std::max<std::int64_t>(call.layout.heads, 0)), HeadMask{MaskSpec::dense(), TokenOrder::FrameMajor, nullptr, true});
  validate(check, /*require_plans=*/false);

  RoutingReport report = router.route(call.layout, call.q, call.k, call.v, TokenOrder::FrameMajor, call.softmax_scale);
  RoutedResult result = run_routed(backend, plans, call, report.heads, options);
  result.routing_ms = report.routing_ms;
  result.routing_flops = report.flops;
  return result;
}

RoutedResult run_routed(const Backend& backend, PlanCache& plans, const RoutedCall& call,
                        std::vector<HeadRoute> decisions, const RoutedOptions& options) {
  const VideoLayout& layout = call.layout;
  layout.validate();
  STSA_CHECK(std::int64_t(decisions.size()) == layout.heads, InvalidArgument, "routed attention: ", decisions.size(),
             " decisions for ", layout.heads, " heads");
  for (auto& d : decisions) d.spec.validate(layout.grid);

  RoutedResult result;
  result.heads = std::move(decisions);
  AttentionCall direct = call.attention_call();
  for (std::int64_t h = 0; h < layout.heads; ++h) {
    const MaskSpec& spec = result.heads[std::size_t(h)].spec;
    const bool permuted = spec.natural_order() == TokenOrder::SpatialMajor;
    if (permuted) result.temporal.push_back(h);
    auto plan = plans.get(layout.grid, spec, options.tile, options.alignment);
    result.kept_tile_flops += kept_tile_flops(VideoLayout{layout.grid, layout.batch, 1, layout.head_dim}, *plan);
    direct.heads.push_back(HeadMask{spec, TokenOrder::FrameMajor, permuted ? nullptr : plan, !permuted});
  }
  validate(direct, /*require_plans=*/false);

  const auto count = std::int64_t(result.temporal.size());
  if (count < layout.heads) {
    const auto start = Clock::now();
    backend.run(direct);
    result.attention_ms += ms_since(start);
  }
  if (count == 0) return result;

  // Temporal heads: packed [B, N, Ht, D] copies in spatial-major order.
  const VideoLayout packed_layout{layout.grid, layout.batch, count, layout.head_dim};
  const std::uint64_t packed_bytes =
      std::uint64_t(layout.batch * layout.tokens() * count * layout.head_dim) *
      (3 * element_size(call.q.dtype) + element_size(call.o.dtype));
  check_host_allocation(packed_bytes, "packed temporal heads");
  Tensor pq(call.q.dtype, layout.batch, layout.tokens(), count, layout.head_dim);
  Tensor pk(call.k.dtype, layout.batch, layout.tokens(), count, layout.head_dim);
  Tensor pv(call.v.dtype, layout.batch, layout.tokens(), count, layout.head_dim);
  Tensor po(call.o.dtype, layout.batch, layout.tokens(), count, layout.head_dim);
  LseBuffer plse;
  if (call.lse.data != nullptr) plse = LseBuffer(layout.batch, count, layout.tokens());

  auto start = Clock::now();
  const TensorView sources[] = {call.q, call.k, call.v};
  const TensorView packed[] = {pq.view(), pk.view(), pv.view()};
  gather_heads(layout.grid, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, result.temporal, sources, packed,
               options.permute_threads);
  result.permutation_ms += ms_since(start);

  AttentionCall gathered;
  gathered.layout = packed_layout;
  gathered.q = pq.view();
  gathered.k = pk.view();
  gathered.v = pv.view();
  gathered.o = po.view();
  gathered.lse = plse.view();
  gathered.softmax_scale = call.softmax_scale;
  for (std::int64_t h : result.temporal) {
    const MaskSpec& spec = result.heads[std::size_t(h)].spec;
    gathered.heads.push_back(
        HeadMask{spec, TokenOrder::SpatialMajor, plans.get(layout.grid, spec, options.tile, options.alignment), true});
  }
  start = Clock::now();
  backend.run(gathered);
  result.attention_ms += ms_since(start);

  start = Clock::now();
  const TensorView packed_out[] = {po.view()};
  const TensorView outputs[] = {call.o};
  scatter_heads(layout.grid, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, result.temporal, packed_out, outputs,
                plse.view(), call.lse, options.permute_threads);
  result.permutation_ms += ms_since(start);
  result.permutation_bytes = permutation_bytes(layout, count, 3, element_size(call.q.dtype)) +
                             permutation_bytes(layout, count, 1, element_size(call.o.dtype)) +
                             (call.lse.data ? 2.0 * double(layout.batch * count * layout.tokens()) * 4.0 : 0.0);
  return result;
}

}  // namespace stsa
