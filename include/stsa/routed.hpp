// Routed attention: one call that routes every head (or takes given decisions),
// runs dense, spatial and frame-window heads on the tensors as they are and
// temporal heads gathered into spatial-major order, on any backend.
//
//   1. route (Router) or take decisions;
//   2. plans from a PlanCache (one per distinct mask; each in its natural order);
//   3. backend call A: heads in frame-major order, temporal heads skipped;
//   4. gather the temporal heads' Q, K, V into packed spatial-major buffers (one pass);
//   5. backend call B on the packed heads;
//   6. scatter their O and LSE back (one pass).
// Tensors come and go in frame-major token order.
#pragma once

#include <cstdint>
#include <vector>

#include "stsa/attention.hpp"
#include "stsa/plan.hpp"
#include "stsa/policy.hpp"
#include "stsa/router.hpp"

namespace stsa {

// The tensors of one attention call, without masks: q, k, v, o logical [B, N, H, D]
// in frame-major token order; lse [B, H, N] optional.
struct RoutedCall {
  VideoLayout layout;
  TensorView q, k, v, o;
  LseView lse;
  float softmax_scale = 0.f;  // 0: 1 / sqrt(D)

  // The same tensors as a backend call, without head masks yet.
  AttentionCall attention_call() const {
    AttentionCall a;
    a.layout = layout;
    a.q = q;
    a.k = k;
    a.v = v;
    a.o = o;
    a.lse = lse;
    a.softmax_scale = softmax_scale;
    return a;
  }
};

struct RoutedOptions {
  TileShape tile;
  Alignment alignment = Alignment::Exact;
  int permute_threads = 0;  // 0: chosen from the copy size
};

struct RoutedResult {
  std::vector<HeadRoute> heads;       // the decision each head ran with
  std::vector<std::int64_t> temporal; // heads run in spatial-major order
  double routing_ms = 0;              // 0 when decisions were given
  double routing_flops = 0;
  double permutation_ms = 0;          // gather + scatter
  double permutation_bytes = 0;       // read + written
  double attention_ms = 0;            // both backend calls
  double kept_tile_flops = 0;         // what the backend's tiles compute (all heads, all batch entries)

  double permutation_gbps() const { return permutation_ms > 0 ? permutation_bytes / permutation_ms / 1e6 : 0.0; }
};

// Routes with `router`, then runs (see above).
RoutedResult routed_attention(const Backend& backend, PlanCache& plans, const RoutedCall& call, const Router& router,
                              const RoutedOptions& options = {});

// Runs with given decisions (one per head; only route and spec are used).
RoutedResult run_routed(const Backend& backend, PlanCache& plans, const RoutedCall& call,
                        std::vector<HeadRoute> decisions, const RoutedOptions& options = {});

// Under a policy: dense during the warm-up (step < dense_steps or layer < dense_layers);
// otherwise heads with a reusable decision keep it and only the others are routed
// (the router uses policy.options().router), and new decisions are remembered.
RoutedResult policy_attention(const Backend& backend, PlanCache& plans, Policy& policy, const RoutedCall& call,
                              std::int64_t step, std::int64_t layer, const RoutedOptions& options = {});

}  // namespace stsa
