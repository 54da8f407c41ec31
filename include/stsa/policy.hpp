// When to route and with what: dense warm-up, kept densities, decision reuse,
// and documented presets for the models stsa targets.
//
// Counts are explicit (not fractions of the schedule): the first `dense_steps`
// denoising steps and the first `dense_layers` layers of every step run dense.
// Elsewhere each head is routed; with reuse_steps = R a head's decision, made
// at step s, is reused for steps s .. s + R - 1 of the same layer and video grid.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "stsa/layout.hpp"
#include "stsa/router.hpp"

namespace stsa {

struct PolicyOptions {
  std::int64_t dense_steps = 0;   // K: steps 0 .. K-1 run dense
  std::int64_t dense_layers = 0;  // L: layers 0 .. L-1 run dense at every step
  std::int64_t reuse_steps = 1;   // R >= 1: a decision holds for R steps (1: route every step)
  RouterOptions router;           // samples, kept density per mask kind, dense threshold
  void validate() const;          // throws InvalidArgument naming the field and its range
};

// What a policy decided for one call: every head's decision, and the routing
// report of the heads that had to be routed (empty when none was).
struct PolicyDecisions {
  std::vector<HeadRoute> heads;
  RoutingReport routing;
};

// Each member is safe to call from several threads at once (one mutex), so layers may run
// on different threads with one Policy. decide() is not one step: two callers deciding the
// same (step, layer) at once may both route its heads, and the later remember() wins.
class Policy {
 public:
  explicit Policy(PolicyOptions options = {});
  const PolicyOptions& options() const { return options_; }

  // True when (step, layer) is in the dense warm-up. Throws InvalidArgument for negative values.
  bool dense(std::int64_t step, std::int64_t layer) const;

  // The decision to reuse for (step, layer, head) on `grid`, if one was made at a step s with
  // s <= step < s + reuse_steps on the same video grid. A step below the stored one (a new
  // generation) or another video grid misses; the same video with another number of text tokens
  // (a prompt of another length) gets the stored route with its mask sized to `grid`.
  std::optional<HeadRoute> cached(std::int64_t step, std::int64_t layer, std::int64_t head,
                                  const VideoGrid& grid) const;
  void remember(std::int64_t step, std::int64_t layer, std::int64_t head, const VideoGrid& grid,
                const HeadRoute& decision);

  // Every head's decision at (step, layer): dense in the warm-up; elsewhere the
  // reusable decisions, and for the other heads what `route` returns for them
  // (called once, with their indices in order, only if there are any), which
  // is remembered. policy_attention() and its GPU twin (cuda_routing.hpp) are
  // this plus their own router and runner.
  using RouteHeads = std::function<RoutingReport(std::span<const std::int64_t> heads)>;
  PolicyDecisions decide(std::int64_t step, std::int64_t layer, const VideoLayout& layout, const RouteHeads& route);
  std::size_t cached_count() const;
  void clear();

 private:
  struct Entry {
    std::int64_t step = 0;
    VideoGrid grid;
    HeadRoute decision;
  };
  PolicyOptions options_;
  mutable std::mutex mutex_;
  std::map<std::pair<std::int64_t, std::int64_t>, Entry> decisions_;  // keyed by (layer, head)
};

// A model's self-attention shape and a starting policy for it.
struct ModelPreset {
  std::string name;         // e.g. "wan2.1-480p"
  std::string description;  // the model, resolution and where the shape comes from
  VideoGrid grid;           // latent frames x token rows x token columns, text tokens and placement
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t layers = 0;  // transformer blocks with self-attention
  std::int64_t steps = 0;   // default denoising steps
  PolicyOptions policy;
  std::int64_t kv_heads = 0;  // K and V's heads: 0 for `heads`, fewer for grouped-query attention

  VideoLayout layout(std::int64_t batch = 1) const { return {grid, batch, heads, head_dim}; }
};

const std::vector<ModelPreset>& model_presets();
const ModelPreset& model_preset(std::string_view name);  // throws InvalidArgument listing the names

}  // namespace stsa
