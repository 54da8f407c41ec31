// How the GPU router divides the keys among blocks (cuda_routing.cpp), as host
// arithmetic a CPU test checks (tests/cuda_routing_splits_test.cpp).
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/routing_launch.hpp"

namespace stsa::cuda_detail {

constexpr std::int64_t kMaxRoutingSplits = 1024;  // bounds the combine kernel's shared memory

struct RoutingSplits {
  std::int64_t splits = 1;           // key splits per (head, row block)
  std::int64_t tiles_per_split = 1;  // key tiles of each split (the last may hold fewer)
};

// About four blocks per SM over all `pairs` (head, row block) pairs (one
// resident per SM, four waves, so a ragged last wave costs little), each split
// at least four tiles long, and no split empty.
inline RoutingSplits routing_splits(std::int64_t tokens, std::int64_t multiprocessors, std::int64_t pairs) {
  const std::int64_t tiles = (tokens + kRoutingKeys - 1) / kRoutingKeys;
  const std::int64_t wanted = (4 * multiprocessors + pairs - 1) / pairs;
  RoutingSplits s;
  s.splits = std::clamp<std::int64_t>(wanted, 1, std::clamp<std::int64_t>(tiles / 4, 1, kMaxRoutingSplits));
  s.tiles_per_split = (tiles + s.splits - 1) / s.splits;
  s.splits = (tiles + s.tiles_per_split - 1) / s.tiles_per_split;
  return s;
}

}  // namespace stsa::cuda_detail
