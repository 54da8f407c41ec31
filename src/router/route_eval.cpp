#include "stsa/route_eval.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>

#include "router/parallel.hpp"
#include "stsa/attention.hpp"
#include "stsa/error.hpp"
#include "stsa/first_block_anchor.hpp"
#include "stsa/reference.hpp"
#include "stsa/routed.hpp"

namespace stsa {

double RouteEvaluation::rel_l2(const std::vector<double>& squared_error, const std::vector<HeadRoute>& heads,
                               const std::vector<Route>& routes) const {
  STSA_CHECK(squared_error.size() == reference_squared.size() && heads.size() == reference_squared.size(),
             InvalidArgument, "route evaluation: ", squared_error.size(), " errors and ", heads.size(),
             " routes for its ", reference_squared.size(), " heads");
  double error = 0, reference = 0;
  for (std::size_t h = 0; h < squared_error.size(); ++h) {
    if (!routes.empty() && std::find(routes.begin(), routes.end(), heads[h].route) == routes.end()) continue;
    error += squared_error[h];
    reference += reference_squared[h];
  }
  return relative_l2(error, reference);
}

RouteEvaluation evaluate_routes(const VideoLayout& layout, const TensorView& q, const TensorView& k,
                                const TensorView& v, const TensorView& routed_o, const std::vector<HeadRoute>& heads,
                                std::int64_t eval_rows, std::uint64_t seed, float softmax_scale, int threads) {
  layout.validate();
  STSA_CHECK(eval_rows >= 0, InvalidArgument, "evaluation rows must be >= 0 (0: all), got ", eval_rows);
  STSA_CHECK(std::int64_t(heads.size()) == layout.heads, InvalidArgument, "evaluation: ", heads.size(),
             " decisions for ", layout.heads, " heads");
  const std::int64_t n = layout.tokens();
  RouteEvaluation eval;
  if (eval_rows == 0 || eval_rows >= n) {
    for (std::int64_t r = 0; r < n; ++r) eval.rows.push_back(r);
  } else {
    std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
    for (std::int64_t i = 0; i < eval_rows; ++i) {
      const std::int64_t lo = n * i / eval_rows, hi = n * (i + 1) / eval_rows;
      eval.rows.push_back(lo + std::int64_t(rng() % std::uint64_t(hi - lo)));
    }
  }
  const auto hcount = std::size_t(layout.heads);
  eval.routed_squared_error.assign(hcount, 0.0);
  eval.first_block_squared_error.assign(hcount, 0.0);
  eval.reference_squared.assign(hcount, 0.0);
  const PairPredicate first_block = first_block_predicate(layout.grid, heads, TokenOrder::FrameMajor);

  // The views checked whole first (shapes, strides, memory): each task then reads one head of them.
  const AttentionCall whole = RoutedCall{layout, q, k, v, routed_o, {}, softmax_scale}.unrouted_call();
  validate(whole, /*require_plans=*/false);

  // One head per task, as a call of that head alone: its reference rows are [B, rows, 1, D]
  // (a call of every head sized them for all, per task: ~0.9 GiB each at 720p with every row).
  if (threads <= 0) threads = resolve_threads(0);
  router_detail::parallel_for(layout.heads, threads, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t h = begin; h < end; ++h) {
      const auto head_of = [](TensorView t, std::int64_t head) {
        t.data = static_cast<std::byte*>(t.data) + head * t.stride[2] * std::int64_t(element_size(t.dtype));
        t.shape[2] = 1;
        return t;
      };
      AttentionCall call = whole;
      call.layout.heads = 1;
      call.q = head_of(q, h);
      call.k = head_of(k, grouped_kv_head(h, q, k));  // grouped-query attention: the K/V head h reads
      call.v = head_of(v, grouped_kv_head(h, q, k));
      call.o = head_of(routed_o, h);  // validated for shape only; reference_rows writes its own buffers
      call.heads.assign(1, HeadMask{MaskSpec::dense(), TokenOrder::FrameMajor, nullptr, true});
      const PairPredicate head_first_block = [&first_block, h](std::int64_t, std::int64_t i, std::int64_t j) {
        return first_block(h, i, j);
      };
      std::vector<double> dense_o, dense_lse, fb_o, fb_lse;
      reference_rows(call, eval.rows, dense_o, dense_lse);
      reference_rows(call, eval.rows, fb_o, fb_lse, head_first_block);
      const auto count = std::int64_t(eval.rows.size());
      double routed = 0, fb = 0, ref = 0;
      for (std::int64_t b = 0; b < layout.batch; ++b)
        for (std::int64_t r = 0; r < count; ++r)
          for (std::int64_t d = 0; d < layout.head_dim; ++d) {
            const std::size_t i = std::size_t((b * count + r) * layout.head_dim + d);
            const double x = routed_o.load(b, eval.rows[std::size_t(r)], h, d);
            routed += (x - dense_o[i]) * (x - dense_o[i]);
            fb += (fb_o[i] - dense_o[i]) * (fb_o[i] - dense_o[i]);
            ref += dense_o[i] * dense_o[i];
          }
      eval.routed_squared_error[std::size_t(h)] = routed;
      eval.first_block_squared_error[std::size_t(h)] = fb;
      eval.reference_squared[std::size_t(h)] = ref;
    }
  });
  return eval;
}

}  // namespace stsa
