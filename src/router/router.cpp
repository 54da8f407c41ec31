#include "stsa/router.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "router/candidate_mask.hpp"
#include "router/parallel.hpp"
#include "router/sampled_attention.hpp"
#include "router/sampled_weights.hpp"
#include "stsa/attention.hpp"
#include "stsa/error.hpp"
#include "stsa/route_eval.hpp"

namespace stsa {
namespace {

void check_input(const char* name, const TensorView& t, const VideoLayout& layout) {
  STSA_CHECK(t.data != nullptr, InvalidArgument, "router: ", name, " is null");
  const std::array<std::int64_t, 4> expected{layout.batch, layout.tokens(), layout.heads, layout.head_dim};
  STSA_CHECK(t.shape == expected, InvalidArgument, "router: ", name, " has shape [", t.shape[0], ", ", t.shape[1],
             ", ", t.shape[2], ", ", t.shape[3], "] but the layout ", layout.grid.describe(), " needs [", expected[0],
             ", ", expected[1], ", ", expected[2], ", ", expected[3], "]");
  // validate()'s memory rules, before any element is read: strides within the
  // address space (an offset past it would overflow), non-negative, no two elements
  // at one address, aligned to the element.
  validate_view_memory(detail::concat("router: ", name).c_str(), t);
}

}  // namespace

const CandidateError* HeadRoute::best() const {
  const CandidateError* best = nullptr;
  for (const auto& c : candidates)
    if (std::isfinite(c.mse) && (best == nullptr || c.mse < best->mse)) best = &c;
  return best;
}

Router::Router(RouterOptions options) : options_(options) { options_.validate(); }

void Router::sample_rows(const VideoLayout& layout, TokenOrder order, std::vector<std::int64_t>& rows,
                         std::vector<std::int64_t>& batch) const {
  layout.validate();
  check_token_order("router: ", order);
  const VideoGrid& grid = layout.grid;
  // A call with fewer tokens than samples (a small debug video) samples every
  // position once: its routing is exact rather than refused.
  const std::int64_t samples = std::min<std::int64_t>(options_.samples, grid.tokens());
  // Population, most informative first: video rows outside the anchor (anchor and
  // text rows attend densely under every mask, so they never tell masks apart),
  // then all video rows, then all rows. Indices run in frame-major video order,
  // so equal strata spread the samples over all frames.
  const std::int64_t per_frame = grid.tokens_per_frame();
  const std::int64_t anchor_rows = options_.anchor ? per_frame : 0;
  std::int64_t first = anchor_rows, count = grid.video_tokens() - anchor_rows;
  if (count < samples) first = 0, count = grid.video_tokens();
  const bool video_only = count >= samples;
  if (!video_only) count = grid.tokens();

  std::mt19937_64 rng(options_.seed);
  rows.clear();
  batch.clear();
  for (std::int64_t i = 0; i < samples; ++i) {
    const std::int64_t lo = count * i / samples, hi = count * (i + 1) / samples;  // hi > lo since count >= samples
    const std::int64_t u = lo + std::int64_t(rng() % std::uint64_t(hi - lo));
    std::int64_t position;
    if (video_only) {
      TokenCoord c;
      c.frame = (first + u) / per_frame;
      c.patch = (first + u) % per_frame;
      position = grid.position(c, order);
    } else {
      position = u;
    }
    rows.push_back(position);
    batch.push_back(i % layout.batch);
  }
}

RoutingReport Router::route(const VideoLayout& layout, const TensorView& q, const TensorView& k, const TensorView& v,
                            TokenOrder order, float softmax_scale, std::span<const std::int64_t> heads,
                            const Descales& descales) const {
  const auto start = std::chrono::steady_clock::now();
  layout.validate();
  check_input("q", q, layout);
  check_kv_head_counts("router: ", k.heads(), v.heads(), layout.heads);  // grouped-query attention
  VideoLayout kv_layout = layout;
  kv_layout.heads = k.heads();
  check_input("k", k, kv_layout);
  check_input("v", v, kv_layout);
  STSA_CHECK(std::isfinite(softmax_scale), InvalidArgument, "router: softmax scale must be finite");
  validate_descales(descales, layout.batch, layout.heads);
  std::vector<std::int64_t> which(heads.begin(), heads.end());
  if (which.empty())
    for (std::int64_t h = 0; h < layout.heads; ++h) which.push_back(h);
  for (std::int64_t h : which)
    STSA_CHECK(h >= 0 && h < layout.heads, InvalidArgument, "router: head ", h, " out of range [0, ", layout.heads,
               ")");

  RoutingReport report;
  sample_rows(layout, order, report.sampled_rows, report.sampled_batch);

  std::vector<Route> routes{Route::Spatial, Route::Temporal};
  if (options_.try_frame_window) routes.push_back(Route::FrameWindow);
  std::vector<router_detail::CandidateMask> masks;
  for (Route r : routes) masks.push_back(router_detail::make_candidate_mask(layout.grid, route_spec(layout.grid, r, options_), order));

  const float scale = softmax_scale != 0.f ? softmax_scale : float(1.0 / std::sqrt(double(layout.head_dim)));
  // Each (batch, head)'s scale with its q and k descales: [b * H + h].
  std::vector<float> scales(std::size_t(layout.batch * layout.heads));
  for (std::int64_t b = 0; b < layout.batch; ++b)
    for (std::int64_t h = 0; h < layout.heads; ++h)
      scales[std::size_t(b * layout.heads + h)] = float(double(scale) * descales.score(b, h, layout.heads));
  const auto batch_scales = [&](std::int64_t b) {
    return std::span<const float>(scales).subspan(std::size_t(b * layout.heads), std::size_t(layout.heads));
  };
  std::vector<router_detail::RowSet> row_sets;  // per batch entry with samples, in batch order
  for (std::int64_t b = 0; b < layout.batch; ++b) {
    router_detail::RowSet set{b, {}};
    for (std::size_t i = 0; i < report.sampled_rows.size(); ++i)
      if (report.sampled_batch[i] == b) set.positions.push_back(report.sampled_rows[i]);
    if (!set.positions.empty()) row_sets.push_back(std::move(set));
  }

  // Work items: (group of heads, row set, key chunk), over all threads. Each item
  // writes its own partial sums per head and a head's are merged in chunk order,
  // so the errors are bit-identical for any thread count (grouping only changes
  // which thread computes a head's chunk, not how). Groups shrink until every
  // thread has a couple of items.
  const ProductUnits units = router_detail::pair_units(resolve_isa(options_.isa), q, k, v);
  report.product_units = units;
  report.tile_products = units == ProductUnits::AmxTiles;
  const int threads = resolve_threads(options_.threads);
  const std::int64_t chunks = router_detail::key_chunks(layout.tokens());
  const auto sets = std::int64_t(row_sets.size()), heads_n = std::int64_t(which.size());
  const std::int64_t group = std::clamp<std::int64_t>(heads_n * sets * chunks / (2 * std::int64_t(threads)), 1, 8);
  const std::int64_t groups = (heads_n + group - 1) / group;
  std::vector<router_detail::SampledErrors> errors(which.size());
  for (auto& e : errors) e.squared_error.assign(masks.size(), 0.0);
  // Every (head, row set, key chunk) keeps its partial sums until they are merged: a sample count
  // near the token count of a long video needs more than memory (12 heads at 720p, all 75,600 rows:
  // ~35 GiB), refused here rather than met by the OOM killer partway through.
  const auto outputs = std::uint64_t(masks.size() + 1);  // the dense output and each candidate's
  check_host_allocation(std::uint64_t(report.sampled_rows.size()) * std::uint64_t(heads_n * chunks) * outputs *
                            std::uint64_t(router_detail::partial_dim(layout.head_dim)) * sizeof(float),
                        "the router's partial sums (sampled rows x heads x key chunks)");
  std::vector<router_detail::ChunkScratch> scratch(static_cast<std::size_t>(threads));
  // partials[(head index * sets + set) * chunks + chunk]
  std::vector<router_detail::ChunkPartial> partials(std::size_t(heads_n * sets * chunks));
  router_detail::parallel_items(groups * sets * chunks, threads, [&](std::int64_t item, int worker) {
    const std::int64_t first = item / (sets * chunks) * group, last = std::min(heads_n, first + group);
    const std::int64_t set = item / chunks % sets, chunk = item % chunks;
    std::vector<router_detail::ChunkPartial> out(std::size_t(last - first));
    const auto group_heads = std::span(which).subspan(std::size_t(first), std::size_t(last - first));
    const router_detail::RowSet& row_set = row_sets[std::size_t(set)];
    router_detail::ChunkScratch& buffers = scratch[std::size_t(worker)];
    const auto set_scales = batch_scales(row_set.batch);
    if (units != ProductUnits::AmxTiles) {
      router_detail::sampled_chunk(units, q, k, v, group_heads, set_scales, row_set, masks, chunk, buffers, out);
    } else if (!router_detail::sampled_chunk_tiles(q, k, v, group_heads, set_scales, row_set, masks, chunk, buffers,
                                                   out)) {
      // A V value below 2^-64 in this chunk, in some head's keys, or a bf16 head's score scale
      // past 2^91 (sampled_attention.hpp): that head alone takes the fp32 path, the others the
      // tile path, as in any other group (the two differ in their last bits, and groups change
      // with the thread count and the heads routed).
      for (std::size_t i = 0; i < group_heads.size(); ++i) {
        const auto head = group_heads.subspan(i, 1);
        const auto head_out = std::span(out).subspan(i, 1);
        if (!router_detail::sampled_chunk_tiles(q, k, v, head, set_scales, row_set, masks, chunk, buffers, head_out))
          router_detail::sampled_chunk(ProductUnits::Fma, q, k, v, head, set_scales, row_set, masks, chunk, buffers,
                                       head_out);
      }
    }
    for (std::int64_t i = first; i < last; ++i)
      partials[std::size_t((i * sets + set) * chunks + chunk)] = std::move(out[std::size_t(i - first)]);
  });
  for (std::int64_t i = 0; i < heads_n; ++i)
    for (std::int64_t set = 0; set < sets; ++set) {
      const std::int64_t head = which[std::size_t(i)], b = row_sets[std::size_t(set)].batch;
      router_detail::combine_chunks(q, k, v, head, batch_scales(b)[std::size_t(head)],
                                    descales.out(b, head, layout.heads), row_sets[std::size_t(set)], masks,
                                    std::span(partials).subspan(std::size_t((i * sets + set) * chunks),
                                                                std::size_t(chunks)),
                                    errors[std::size_t(i)]);
    }

  const double values = double(report.sampled_rows.size()) * double(layout.head_dim);
  for (const auto& e : errors) {
    HeadRoute head;
    for (std::size_t c = 0; c < routes.size(); ++c) {
      CandidateError ce;
      ce.route = routes[c];
      ce.spec = masks[c].spec;
      ce.mse = e.squared_error[c] / values;
      ce.rel_l2 = relative_l2(e.squared_error[c], e.squared_reference);
      head.candidates.push_back(ce);
    }
    const CandidateError* best = head.best();
    if (best != nullptr && std::isfinite(best->rel_l2) && best->rel_l2 <= options_.max_rel_l2) {
      head.route = best->route;
      head.spec = best->spec;
    } else {
      head.route = Route::Dense;
      head.spec = MaskSpec::dense();
    }
    report.flops += e.flops;
    report.heads.push_back(std::move(head));
  }
  report.routing_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace stsa
