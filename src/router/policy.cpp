#include "stsa/policy.hpp"

#include "stsa/error.hpp"

namespace stsa {

void PolicyOptions::validate() const {
  STSA_CHECK(dense_steps >= 0, InvalidArgument, "dense steps must be >= 0, got ", dense_steps);
  STSA_CHECK(dense_layers >= 0, InvalidArgument, "dense layers must be >= 0, got ", dense_layers);
  STSA_CHECK(reuse_steps >= 1, InvalidArgument, "reuse steps must be >= 1 (1: route every step), got ", reuse_steps);
  router.validate();
}

Policy::Policy(PolicyOptions options) : options_(std::move(options)) { options_.validate(); }

bool Policy::dense(std::int64_t step, std::int64_t layer) const {
  STSA_CHECK(step >= 0, InvalidArgument, "step must be >= 0, got ", step);
  STSA_CHECK(layer >= 0, InvalidArgument, "layer must be >= 0, got ", layer);
  return step < options_.dense_steps || layer < options_.dense_layers;
}

std::optional<HeadRoute> Policy::cached(std::int64_t step, std::int64_t layer, std::int64_t head,
                                        const VideoGrid& grid) const {
  STSA_CHECK(step >= 0 && layer >= 0 && head >= 0, InvalidArgument, "step, layer and head must be >= 0, got ", step,
             ", ", layer, ", ", head);
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = decisions_.find({layer, head});
  if (it == decisions_.end()) return std::nullopt;
  const Entry& e = it->second;
  // Written so that step - e.step cannot overflow: both are >= 0.
  if (step < e.step || step - e.step >= options_.reuse_steps) return std::nullopt;
  if (e.grid == grid) return e.decision;
  // The same video with a prompt of another length (classifier-free guidance's two passes
  // through a joint-attention model): the route holds, its mask sized to this grid.
  if (e.grid.frames != grid.frames || e.grid.height != grid.height || e.grid.width != grid.width) return std::nullopt;
  HeadRoute resized = e.decision;
  resized.spec = route_spec(grid, resized.route, options_.router);
  return resized;
}

void Policy::remember(std::int64_t step, std::int64_t layer, std::int64_t head, const VideoGrid& grid,
                      const HeadRoute& decision) {
  STSA_CHECK(step >= 0 && layer >= 0 && head >= 0, InvalidArgument, "step, layer and head must be >= 0, got ", step,
             ", ", layer, ", ", head);
  decision.spec.validate(grid);
  std::lock_guard<std::mutex> lock(mutex_);
  decisions_[{layer, head}] = Entry{step, grid, decision};
}

PolicyDecisions Policy::decide(std::int64_t step, std::int64_t layer, const VideoLayout& layout,
                               const RouteHeads& route) {
  layout.validate();
  PolicyDecisions d;
  d.heads.resize(std::size_t(layout.heads));  // default: dense
  if (dense(step, layer)) return d;
  std::vector<std::int64_t> stale;
  for (std::int64_t h = 0; h < layout.heads; ++h) {
    if (auto hit = cached(step, layer, h, layout.grid)) d.heads[std::size_t(h)] = *hit;
    else stale.push_back(h);
  }
  if (stale.empty()) return d;
  d.routing = route(stale);
  STSA_CHECK(d.routing.heads.size() == stale.size(), InvalidArgument, "the router returned ", d.routing.heads.size(),
             " decisions for ", stale.size(), " heads");
  for (std::size_t i = 0; i < stale.size(); ++i) {
    d.heads[std::size_t(stale[i])] = d.routing.heads[i];
    remember(step, layer, stale[i], layout.grid, d.routing.heads[i]);
  }
  return d;
}

std::size_t Policy::cached_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return decisions_.size();
}

void Policy::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  decisions_.clear();
}

}  // namespace stsa
