// The library's results as plain Python values (dicts of numbers, strings and
// lists), the form every entry point of the Python package returns.
#pragma once

#include <nanobind/nanobind.h>

#include "stsa/plan.hpp"
#include "stsa/policy.hpp"
#include "stsa/routed.hpp"
#include "stsa/router.hpp"

namespace stsa::python {

// One head's decision: "route", its mask ("mask", "band", "frame_radius",
// "anchor") and "candidates", each with its mask, "mse" and "rel_l2" (empty
// where the decision was given or reused, not measured).
nanobind::dict head_dict(const HeadRoute& head);
// A routed call: "routes" and "heads" (one per head), "temporal_heads", the
// times in ms, "kept_tile_flops", "kept_flops", "routing_flops", "scatter_fused", "gather_fused".
nanobind::dict result_dict(const RoutedResult& result);
// Routing alone: "routes" and "heads" of the routed heads, "sampled_rows",
// "routing_ms" (and "routing_device_ms", the GPU router's kernels), "flops".
nanobind::dict routing_dict(const RoutingReport& report);
// A policy's decisions for every head: "routes", "heads", and "routing" (the
// routing_dict of the heads it routed; None when every decision was given by
// the warm-up or reused).
nanobind::dict decisions_dict(const PolicyDecisions& decisions);
// A plan's statistics, its mask and tile shape.
nanobind::dict plan_dict(const TilePlan& plan);
// A model preset; its "policy" holds every option stsa.Policy() takes, by the same names.
nanobind::dict preset_dict(const ModelPreset& preset);

}  // namespace stsa::python
