#include "stsa/routed.hpp"

#include <chrono>
#include <memory>
#include <optional>

#include "stsa/error.hpp"
#include "stsa/flops.hpp"
#include "stsa/permute.hpp"

namespace stsa {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

RoutedResult routed_attention(const Backend& backend, PlanCache& plans, const RoutedCall& call, const Router& router,
                              const RoutedOptions& options) {
  // Check the whole call (shapes, dtypes, aliasing) before spending time on routing.
  validate(call.unrouted_call(), /*require_plans=*/false);

  RoutingReport report =
      router.route(call.layout, call.q, call.k, call.v, TokenOrder::FrameMajor, call.softmax_scale, {}, call.descales);
  RoutedResult result = run_routed(backend, plans, call, report.heads, options);
  result.routing_ms = report.routing_ms;
  result.routing_flops = report.flops;
  return result;
}

RoutedResult run_routed(const Backend& backend, PlanCache& plans, const RoutedCall& call,
                        std::vector<HeadRoute> decisions, const RoutedOptions& options) {
  HostRoutedExecutor executor(options.permute_threads);
  return run_routed(executor, backend, plans, call, std::move(decisions), options);
}

RoutedResult run_routed(RoutedExecutor& executor, const Backend& backend, PlanCache& plans, const RoutedCall& call,
                        std::vector<HeadRoute> decisions, const RoutedOptions& options) {
  const VideoLayout& layout = call.layout;
  layout.validate();
  STSA_CHECK(std::int64_t(decisions.size()) == layout.heads, InvalidArgument, "routed attention: ", decisions.size(),
             " decisions for ", layout.heads, " heads");
  for (auto& d : decisions) d.spec.validate(layout.grid);

  RoutedResult result;
  result.heads = std::move(decisions);
  AttentionCall direct = call.attention_call();
  for (const HeadRoute& head : result.heads) {
    const bool permuted = head.spec.natural_order() == TokenOrder::SpatialMajor;
    direct.heads.push_back(HeadMask{head.spec, TokenOrder::FrameMajor, nullptr, !permuted});
  }
  // The tensors first: a grid the tensors do not have must not get its plans built (and
  // cached) first, which for a large grid took seconds and gigabytes before the refusal.
  validate(direct, /*require_plans=*/false);
  for (std::int64_t h = 0; h < layout.heads; ++h) {
    HeadMask& head = direct.heads[std::size_t(h)];
    if (!head.compute) result.temporal.push_back(h);
    auto plan = plans.get(layout.grid, head.spec, options.tile, options.alignment);
    const VideoLayout one_head{layout.grid, layout.batch, 1, layout.head_dim};
    result.kept_tile_flops += kept_tile_flops(one_head, *plan);
    result.kept_flops += kept_pair_flops(one_head, *plan);
    if (head.compute) head.plan = plan;
  }

  const auto count = std::int64_t(result.temporal.size());
  const bool timed = options.timed && executor.timed();
  result.timed = timed;
  const auto mark = [&] { return timed ? executor.mark() : -1; };
  const auto elapsed_ms = [&](int from, int to) { return timed ? executor.elapsed_ms(from, to) : 0.0; };

  // Temporal heads: packed [B, N, Ht, D] copies in spatial-major order. Their
  // buffers and both backend calls are set up (and prepared) before any step
  // is enqueued.
  const bool fused = count > 0 && options.fuse_scatter && executor.fuses_scatter(backend);
  const bool fused_gather = fused && options.fuse_gather && executor.fuses_gather(backend);
  PackedHeads packed_heads;
  AttentionCall gathered;
  std::vector<float> gathered_descales;  // the temporal heads' descales, in the gathered call's head order
  std::optional<ScatteredOutput> scattered;
  if (count > 0) {
    if (!fused_gather) packed_heads = executor.allocate(call, count, /*with_output=*/!fused);
    gathered.layout = VideoLayout{layout.grid, layout.batch, count, layout.head_dim};
    gathered.q = packed_heads.q;
    gathered.k = packed_heads.k;
    gathered.v = packed_heads.v;
    gathered.o = packed_heads.o;
    gathered.lse = packed_heads.lse;
    gathered.softmax_scale = call.softmax_scale;
    gathered.descales = call.descales.for_heads(result.temporal, layout.batch, layout.heads, gathered_descales);
    for (std::int64_t h : result.temporal) {
      const MaskSpec& spec = result.heads[std::size_t(h)].spec;
      gathered.heads.push_back(
          HeadMask{spec, TokenOrder::SpatialMajor, plans.get(layout.grid, spec, options.tile, options.alignment), true});
    }
    if (fused)
      scattered = ScatteredOutput{layout.grid, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, result.temporal,
                                  call.o, call.lse};
  }
  // The direct call even with every head temporal (nothing to compute): its
  // checks of o and lse then come before the gather, not at the scatter.
  executor.prepare(backend, direct, nullptr);
  if (count > 0 && !fused_gather) executor.prepare(backend, gathered, scattered ? &*scattered : nullptr);

  // Times are read after everything was enqueued, so an asynchronous executor never waits in between.
  int direct_start = -1, direct_end = -1;
  if (count < layout.heads) {
    direct_start = mark();
    executor.attend(backend, direct);
    direct_end = mark();
  }
  if (count == 0) {
    result.attention_ms = elapsed_ms(direct_start, direct_end);
    return result;
  }

  if (fused_gather) {
    const int start = mark();
    executor.attend_gathered(backend, gathered,
                             GatheredInput{layout.grid, TokenOrder::FrameMajor, TokenOrder::SpatialMajor,
                                           result.temporal, call.q, call.k, call.v},
                             *scattered);
    result.attention_ms = elapsed_ms(start, mark());
    if (count < layout.heads) result.attention_ms += elapsed_ms(direct_start, direct_end);
    result.scatter_fused = result.gather_fused = true;
    return result;
  }
  const int gather_start = mark();
  if (call.k.heads() == call.q.heads()) {
    const TensorView sources[] = {call.q, call.k, call.v};
    const TensorView packed[] = {packed_heads.q, packed_heads.k, packed_heads.v};
    executor.gather(layout.grid, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, result.temporal, sources, packed);
  } else {
    // Grouped K/V: each temporal head gets its own copy of the K/V head it reads, so
    // the packed call is an ungrouped one (two temporal heads may share that head).
    std::vector<std::int64_t> kv_heads;
    for (const std::int64_t h : result.temporal) kv_heads.push_back(grouped_kv_head(h, call.q, call.k));
    const TensorView q_source[] = {call.q}, q_packed[] = {packed_heads.q};
    const TensorView kv_sources[] = {call.k, call.v}, kv_packed[] = {packed_heads.k, packed_heads.v};
    executor.gather(layout.grid, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, result.temporal, q_source,
                    q_packed);
    executor.gather(layout.grid, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, kv_heads, kv_sources, kv_packed);
  }
  const int gather_end = mark();

  int attention_end = -1, scatter_end = -1;
  if (fused) {
    executor.attend_scattered(backend, gathered, *scattered);
    attention_end = mark();
  } else {
    executor.attend(backend, gathered);
    attention_end = mark();
    const TensorView packed_out[] = {packed_heads.o};
    const TensorView outputs[] = {call.o};
    executor.scatter(layout.grid, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, result.temporal, packed_out,
                     outputs, packed_heads.lse, call.lse);
    scatter_end = mark();
  }
  result.scatter_fused = fused;
  result.attention_ms = elapsed_ms(gather_end, attention_end);
  if (count < layout.heads) result.attention_ms += elapsed_ms(direct_start, direct_end);
  result.permutation_ms = elapsed_ms(gather_start, gather_end);
  result.permutation_bytes = permutation_bytes(layout, count, 3, element_size(call.q.dtype));
  if (!fused) {
    result.permutation_ms += elapsed_ms(attention_end, scatter_end);
    result.permutation_bytes += permutation_bytes(layout, count, 1, element_size(call.o.dtype)) +
                                (call.lse.data ? 2.0 * double(layout.batch * count * layout.tokens()) * 4.0 : 0.0);
  }
  return result;
}

void RoutedExecutor::attend_scattered(const Backend& backend, const AttentionCall& packed, const ScatteredOutput& out) {
  (void)backend, (void)packed, (void)out;
  throw Unsupported("this routed executor does not fuse the scatter into the attention");
}

void RoutedExecutor::attend_gathered(const Backend& backend, const AttentionCall& packed, const GatheredInput& in,
                                     const ScatteredOutput& out) {
  (void)backend, (void)packed, (void)in, (void)out;
  throw Unsupported("this routed executor does not fuse the gather into the attention");
}

PackedHeads HostRoutedExecutor::allocate(const RoutedCall& call, std::int64_t count, bool with_output) {
  const VideoLayout& layout = call.layout;
  const std::uint64_t bytes = std::uint64_t(layout.batch * layout.tokens() * count * layout.head_dim) *
                              (3 * element_size(call.q.dtype) + (with_output ? element_size(call.o.dtype) : 0));
  check_host_allocation(bytes, "packed temporal heads");
  struct Storage {
    Tensor q, k, v, o;
    LseBuffer lse;
  };
  auto storage = std::make_shared<Storage>();
  storage->q = Tensor(call.q.dtype, layout.batch, layout.tokens(), count, layout.head_dim);
  storage->k = Tensor(call.k.dtype, layout.batch, layout.tokens(), count, layout.head_dim);
  storage->v = Tensor(call.v.dtype, layout.batch, layout.tokens(), count, layout.head_dim);
  if (with_output) {
    storage->o = Tensor(call.o.dtype, layout.batch, layout.tokens(), count, layout.head_dim);
    if (call.lse.data != nullptr) storage->lse = LseBuffer(layout.batch, count, layout.tokens());
  }
  PackedHeads packed{storage->q.view(), storage->k.view(), storage->v.view(),
                     with_output ? storage->o.view() : TensorView{}, storage->lse.view(), nullptr};
  packed.storage = std::move(storage);
  return packed;
}

void HostRoutedExecutor::gather(const VideoGrid& grid, TokenOrder from, TokenOrder to,
                                std::span<const std::int64_t> heads, std::span<const TensorView> sources,
                                std::span<const TensorView> packed) {
  gather_heads(grid, from, to, heads, sources, packed, threads_);
}

void HostRoutedExecutor::scatter(const VideoGrid& grid, TokenOrder from, TokenOrder to,
                                 std::span<const std::int64_t> heads, std::span<const TensorView> packed,
                                 std::span<const TensorView> dests, const LseView& packed_lse, const LseView& lse) {
  scatter_heads(grid, from, to, heads, packed, dests, packed_lse, lse, threads_);
}

void HostRoutedExecutor::attend(const Backend& backend, const AttentionCall& call) { backend.run(call); }

bool HostRoutedExecutor::fuses_scatter(const Backend& backend) const { return backend.runs_scattered(); }

void HostRoutedExecutor::attend_scattered(const Backend& backend, const AttentionCall& packed,
                                          const ScatteredOutput& out) {
  backend.run_scattered(packed, out);
}

bool HostRoutedExecutor::fuses_gather(const Backend& backend) const { return backend.runs_gathered(); }

void HostRoutedExecutor::attend_gathered(const Backend& backend, const AttentionCall& packed, const GatheredInput& in,
                                         const ScatteredOutput& out) {
  backend.run_gathered(packed, in, out);
}

int HostRoutedExecutor::mark() {
  marks_ms_.push_back(std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count());
  return int(marks_ms_.size()) - 1;
}

double HostRoutedExecutor::elapsed_ms(int from, int to) {
  return marks_ms_.at(std::size_t(to)) - marks_ms_.at(std::size_t(from));
}

}  // namespace stsa
