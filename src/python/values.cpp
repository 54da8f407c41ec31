#include "values.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

namespace nb = nanobind;

namespace stsa::python {
namespace {

// A mask as plain values: its kind, the band or frame radius it was sized to, and a description.
void put_mask(nb::dict& d, const MaskSpec& spec) {
  d["mask"] = spec.describe();
  d["band"] = spec.band;
  d["frame_radius"] = spec.frame_radius;
  d["anchor"] = spec.anchor;
}

// "routes" and "heads" of a list of decisions, into `d`.
void put_heads(nb::dict& d, const std::vector<HeadRoute>& decisions) {
  nb::list heads, routes;
  for (const HeadRoute& head : decisions) {
    heads.append(head_dict(head));
    routes.append(std::string(to_string(head.route)));
  }
  d["routes"] = routes;
  d["heads"] = heads;
}

}  // namespace

nb::dict head_dict(const HeadRoute& head) {
  nb::list candidates;
  for (const CandidateError& c : head.candidates) {
    nb::dict candidate;
    candidate["route"] = std::string(to_string(c.route));
    put_mask(candidate, c.spec);
    candidate["mse"] = c.mse;
    candidate["rel_l2"] = c.rel_l2;
    candidates.append(candidate);
  }
  nb::dict d;
  d["route"] = std::string(to_string(head.route));
  put_mask(d, head.spec);
  d["candidates"] = candidates;
  return d;
}

nb::dict result_dict(const RoutedResult& r) {
  nb::dict d;
  put_heads(d, r.heads);
  d["temporal_heads"] = r.temporal;
  d["routing_ms"] = r.routing_ms;
  // Untimed (a call made with timed=False): no times rather than zeros that read as free.
  d["permutation_ms"] = r.timed ? nb::object(nb::float_(r.permutation_ms)) : nb::none();
  d["attention_ms"] = r.timed ? nb::object(nb::float_(r.attention_ms)) : nb::none();
  d["kept_tile_flops"] = r.kept_tile_flops;
  d["kept_flops"] = r.kept_flops;
  d["routing_flops"] = r.routing_flops;
  d["scatter_fused"] = r.scatter_fused;
  d["gather_fused"] = r.gather_fused;
  return d;
}

nb::dict routing_dict(const RoutingReport& report) {
  nb::dict d;
  put_heads(d, report.heads);
  d["sampled_rows"] = report.sampled_rows;
  d["routing_ms"] = report.routing_ms;
  d["routing_device_ms"] = report.routing_device_ms;
  d["flops"] = report.flops;
  d["tile_products"] = report.tile_products;
  if (report.product_units) {
    const std::string_view units = to_string(*report.product_units);
    d["product_units"] = nb::str(units.data(), units.size());
  } else {
    d["product_units"] = nb::none();
  }
  return d;
}

nb::dict decisions_dict(const PolicyDecisions& decisions) {
  nb::dict d;
  put_heads(d, decisions.heads);
  d["routing"] = decisions.routing.heads.empty() ? nb::none() : nb::object(routing_dict(decisions.routing));
  return d;
}

nb::dict plan_dict(const TilePlan& plan) {
  const PlanStats& s = plan.stats();
  nb::dict d;
  put_mask(d, plan.spec());
  d["order"] = std::string(to_string(plan.order()));
  d["tokens"] = plan.tokens();
  d["tile"] = nb::make_tuple(plan.tile().q, plan.tile().k);
  d["q_tiles"] = plan.q_tiles();
  d["k_tiles"] = plan.k_tiles();
  d["tiles_full"] = s.tiles_full;
  d["tiles_partial"] = s.tiles_partial;
  d["tiles_empty"] = s.tiles_empty;
  d["tile_density"] = s.tile_density();
  d["exact_kept_pairs"] = s.exact_kept_pairs;
  d["kept_pairs"] = s.kept_pairs;
  d["kept_fraction"] = s.kept_fraction();
  d["changed_pairs"] = s.changed_pairs;
  d["added_pairs"] = s.added_pairs;
  d["removed_pairs"] = s.removed_pairs;
  d["distinct_masks"] = s.distinct_masks;
  d["plan_bytes"] = s.plan_bytes;
  d["build_ms"] = s.build_ms;
  return d;
}

nb::dict preset_dict(const ModelPreset& p) {
  const RouterOptions& router = p.policy.router;
  nb::dict policy;
  policy["dense_steps"] = p.policy.dense_steps;
  policy["dense_layers"] = p.policy.dense_layers;
  policy["reuse_steps"] = p.policy.reuse_steps;
  policy["samples"] = router.samples;
  policy["spatial_density"] = router.spatial_density;
  policy["temporal_density"] = router.temporal_density;
  policy["frames_density"] = router.frame_window_density;
  policy["try_frames"] = router.try_frame_window;
  policy["max_rel_l2"] = router.max_rel_l2;
  policy["anchor"] = router.anchor;
  policy["seed"] = router.seed;
  nb::dict d;
  d["name"] = p.name;
  d["description"] = p.description;
  d["grid"] = p.grid;
  d["heads"] = p.heads;
  d["kv_heads"] = p.kv_heads == 0 ? p.heads : p.kv_heads;
  d["head_dim"] = p.head_dim;
  d["layers"] = p.layers;
  d["steps"] = p.steps;
  d["policy"] = policy;
  return d;
}

}  // namespace stsa::python
