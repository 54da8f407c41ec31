// The host image of a device plan (device_plan_image.hpp).
#include "cuda/device_plan_image.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <numeric>

#include "stsa/error.hpp"

namespace stsa::cuda_detail {
namespace {

constexpr std::size_t kAlign = 256;

// Byte offsets of consecutive arrays, each 256-byte aligned (and never empty).
struct Placer {
  std::size_t total = 0;
  std::size_t place(std::size_t size) {
    const std::size_t offset = total;
    total += (std::max<std::size_t>(size, 1) + kAlign - 1) / kAlign * kAlign;
    return offset;
  }
};

}  // namespace

DevicePlanImage make_device_plan_image(const TilePlan& plan) {
  DevicePlanImage image;
  image.q_tiles = plan.q_tiles();
  image.kept_tiles = plan.stats().tiles_full + plan.stats().tiles_partial;
  image.distinct_masks = plan.stats().distinct_masks;
  STSA_CHECK(image.kept_tiles <= INT_MAX && image.q_tiles < INT_MAX, ResourceError, "plan with ", image.kept_tiles,
             " kept tiles is too large for the CUDA backend's 32-bit tile lists");

  const auto q_tiles = std::size_t(image.q_tiles);
  std::vector<std::int32_t> row_begin(q_tiles + 1), partial_begin(q_tiles), key_tiles, mask_ids;
  key_tiles.reserve(std::size_t(image.kept_tiles));
  mask_ids.reserve(std::size_t(image.kept_tiles));
  for (std::size_t qt = 0; qt < q_tiles; ++qt) {
    row_begin[qt] = std::int32_t(key_tiles.size());
    for (const std::int32_t kt : plan.full_tiles(std::int64_t(qt))) {
      key_tiles.push_back(kt);
      mask_ids.push_back(-1);
    }
    partial_begin[qt] = std::int32_t(key_tiles.size());
    const auto partial = plan.partial_tiles(std::int64_t(qt));
    const auto ids = plan.partial_mask_ids(std::int64_t(qt));
    for (std::size_t i = 0; i < partial.size(); ++i) {
      key_tiles.push_back(partial[i]);
      mask_ids.push_back(ids[i]);
    }
  }
  row_begin[q_tiles] = std::int32_t(key_tiles.size());
  STSA_CHECK(std::int64_t(key_tiles.size()) == image.kept_tiles, Error, "plan lists ", key_tiles.size(),
             " kept tiles but its statistics count ", image.kept_tiles);

  // Heaviest query tiles first (stable: ties keep tile order), so schedulers that
  // hand out work in this order start the long rows first.
  std::vector<std::int32_t> order(q_tiles);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return row_begin[std::size_t(a) + 1] - row_begin[std::size_t(a)] >
           row_begin[std::size_t(b) + 1] - row_begin[std::size_t(b)];
  });

  image.rank_costs.resize(q_tiles);
  for (std::size_t rank = 0; rank < q_tiles; ++rank)
    image.rank_costs[rank] = row_begin[std::size_t(order[rank]) + 1] - row_begin[std::size_t(order[rank])];

  const std::size_t words_per_mask = std::size_t(plan.tile().q) * std::size_t(plan.mask_words_per_row());
  const std::size_t mask_bytes = std::size_t(image.distinct_masks) * words_per_mask * 8;
  Placer placer;
  image.row_begin = placer.place(row_begin.size() * 4);
  image.partial_begin = placer.place(partial_begin.size() * 4);
  image.key_tiles = placer.place(key_tiles.size() * 4);
  image.mask_ids = placer.place(mask_ids.size() * 4);
  image.q_tile_order = placer.place(order.size() * 4);
  image.masks = placer.place(mask_bytes);
  image.bytes.assign(placer.total, std::byte{0});
  const auto put = [&](std::size_t offset, const void* data, std::size_t size) {
    if (size) std::memcpy(image.bytes.data() + offset, data, size);
  };
  put(image.row_begin, row_begin.data(), row_begin.size() * 4);
  put(image.partial_begin, partial_begin.data(), partial_begin.size() * 4);
  put(image.key_tiles, key_tiles.data(), key_tiles.size() * 4);
  put(image.mask_ids, mask_ids.data(), mask_ids.size() * 4);
  put(image.q_tile_order, order.data(), order.size() * 4);
  for (std::int64_t id = 0; id < image.distinct_masks; ++id)
    put(image.masks + std::size_t(id) * words_per_mask * 8, plan.mask(std::int32_t(id)), words_per_mask * 8);
  return image;
}

}  // namespace stsa::cuda_detail
