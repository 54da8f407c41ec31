// How a block of a persistent launch walks its items when no list was
// uploaded (block_schedule.hpp): by arithmetic on its index, the same on the
// host (which builds the model's lists from it) and in the kernel.
//   round-robin: block b takes items b, b + G, b + 2G, ... (G blocks);
//   snake: round r of G items goes to blocks 0 .. G-1 when r is even and to
//     blocks G-1 .. 0 when it is odd, so block b takes rG + b, then
//     (r + 1)G + G - 1 - b, ...; the last round may be short either way.
#pragma once

#include "cuda/host_device.hpp"

namespace stsa::cuda_detail {

struct BlockWalk {
  // The k-th item is k * stride + (first in even rounds, mirror in odd ones).
  // Kept in registers, not recomputed from the block index in the kernel:
  // rereading blockIdx / gridDim made ptxas spill in the sm90 consumers.
  int first = 0, mirror = 0, stride = 1, count = 0;
  STSA_HOST_DEVICE int at(int k) const { return k * stride + ((k & 1) != 0 ? mirror : first); }
};

// Block `block` of `blocks` (0 <= block < blocks, blocks <= items) over
// `items` <= INT_MAX items; at(k) is exact for k < count (not past it).
STSA_HOST_DEVICE BlockWalk block_walk(int items, int block, int blocks, bool snake) {
  const int rounds = items / blocks, last = items - rounds * blocks;  // full rounds, items of the short one
  const int mirror = snake ? blocks - 1 - block : block;
  // The short round is round `rounds`, handed out backwards when odd.
  const int in_last = (rounds & 1) != 0 && snake ? (mirror < last ? 1 : 0) : (block < last ? 1 : 0);
  return {block, mirror, blocks, rounds + in_last};
}

}  // namespace stsa::cuda_detail
