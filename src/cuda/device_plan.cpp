// Uploading a tile plan: the CSR lists (as int32), the partial bitmasks and the
// longest-first order of query tiles, in one allocation and one copy.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <numeric>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/device_plan_arrays.hpp"
#include "stsa/cuda.hpp"
#include "stsa/error.hpp"

namespace stsa {
namespace {

constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Byte offsets of the arrays inside the one device allocation, each 256-byte aligned.
struct Layout {
  std::size_t total = 0;
  std::size_t place(std::size_t size) {
    const std::size_t offset = total;
    total += aligned(std::max<std::size_t>(size, 1));
    return offset;
  }
};

}  // namespace

DevicePlan::DevicePlan() : arrays_(std::make_unique<Arrays>()) {}

DevicePlan::~DevicePlan() {
  if (arrays_ && arrays_->storage) cudaFree(arrays_->storage);  // errors ignored: may run at shutdown
}

int DevicePlan::device() const { return arrays_->device; }
TileShape DevicePlan::tile() const { return arrays_->tile; }
std::int64_t DevicePlan::q_tiles() const { return arrays_->q_tiles; }
std::int64_t DevicePlan::kept_tiles() const { return arrays_->kept_tiles; }
std::int64_t DevicePlan::device_bytes() const { return std::int64_t(arrays_->bytes); }

std::shared_ptr<const DevicePlan> DevicePlan::upload(const TilePlan& plan) {
  const int device = cuda_detail::current_device();
  const std::int64_t q_tiles = plan.q_tiles();
  const std::int64_t kept = plan.stats().tiles_full + plan.stats().tiles_partial;
  const std::int64_t distinct = plan.stats().distinct_masks;
  STSA_CHECK(kept <= INT_MAX && q_tiles < INT_MAX, ResourceError, "plan with ", kept,
             " kept tiles is too large for the CUDA backend's 32-bit tile lists");

  std::vector<std::int32_t> row_begin(static_cast<std::size_t>(q_tiles) + 1);
  std::vector<std::int32_t> partial_begin(static_cast<std::size_t>(q_tiles));
  std::vector<std::int32_t> key_tiles, mask_ids;
  key_tiles.reserve(std::size_t(kept));
  mask_ids.reserve(std::size_t(kept));
  for (std::int64_t qt = 0; qt < q_tiles; ++qt) {
    row_begin[std::size_t(qt)] = std::int32_t(key_tiles.size());
    for (const std::int32_t kt : plan.full_tiles(qt)) {
      key_tiles.push_back(kt);
      mask_ids.push_back(-1);
    }
    partial_begin[std::size_t(qt)] = std::int32_t(key_tiles.size());
    const auto partial = plan.partial_tiles(qt);
    const auto ids = plan.partial_mask_ids(qt);
    for (std::size_t i = 0; i < partial.size(); ++i) {
      key_tiles.push_back(partial[i]);
      mask_ids.push_back(ids[i]);
    }
  }
  row_begin[std::size_t(q_tiles)] = std::int32_t(key_tiles.size());
  STSA_CHECK(std::int64_t(key_tiles.size()) == kept, Error, "plan lists ", key_tiles.size(),
             " kept tiles but its statistics count ", kept);

  std::vector<std::int32_t> order(static_cast<std::size_t>(q_tiles));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return row_begin[std::size_t(a) + 1] - row_begin[std::size_t(a)] >
           row_begin[std::size_t(b) + 1] - row_begin[std::size_t(b)];
  });

  const std::size_t words_per_mask = std::size_t(plan.tile().q) * std::size_t(plan.mask_words_per_row());
  const std::size_t mask_bytes = std::size_t(distinct) * words_per_mask * 8;
  Layout layout;
  const std::size_t at_row_begin = layout.place(row_begin.size() * 4);
  const std::size_t at_partial_begin = layout.place(partial_begin.size() * 4);
  const std::size_t at_key_tiles = layout.place(key_tiles.size() * 4);
  const std::size_t at_mask_ids = layout.place(mask_ids.size() * 4);
  const std::size_t at_order = layout.place(order.size() * 4);
  const std::size_t at_masks = layout.place(mask_bytes);
  std::vector<std::byte> staging(layout.total);
  auto put = [&](std::size_t offset, const void* data, std::size_t size) {
    if (size) std::memcpy(staging.data() + offset, data, size);
  };
  put(at_row_begin, row_begin.data(), row_begin.size() * 4);
  put(at_partial_begin, partial_begin.data(), partial_begin.size() * 4);
  put(at_key_tiles, key_tiles.data(), key_tiles.size() * 4);
  put(at_mask_ids, mask_ids.data(), mask_ids.size() * 4);
  put(at_order, order.data(), order.size() * 4);
  for (std::int64_t id = 0; id < distinct; ++id)
    put(at_masks + std::size_t(id) * words_per_mask * 8, plan.mask(std::int32_t(id)), words_per_mask * 8);

  std::shared_ptr<DevicePlan> result(new DevicePlan());
  Arrays& a = *result->arrays_;
  a.device = device;
  a.tile = plan.tile();
  a.q_tiles = q_tiles;
  a.kept_tiles = kept;
  a.distinct_masks = distinct;
  STSA_CUDA_CHECK(cudaMalloc(&a.storage, staging.size()));
  a.bytes = staging.size();
  STSA_CUDA_CHECK(cudaMemcpy(a.storage, staging.data(), a.bytes, cudaMemcpyHostToDevice));
  auto* base = static_cast<std::byte*>(a.storage);
  a.row_begin = reinterpret_cast<const std::int32_t*>(base + at_row_begin);
  a.partial_begin = reinterpret_cast<const std::int32_t*>(base + at_partial_begin);
  a.key_tiles = reinterpret_cast<const std::int32_t*>(base + at_key_tiles);
  a.mask_ids = reinterpret_cast<const std::int32_t*>(base + at_mask_ids);
  a.q_tile_order = reinterpret_cast<const std::int32_t*>(base + at_order);
  a.masks = reinterpret_cast<const std::uint64_t*>(base + at_masks);
  return result;
}

}  // namespace stsa
