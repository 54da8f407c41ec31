#include "plan_arrays.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "stsa/permute.hpp"

namespace nb = nanobind;

namespace stsa::python {
namespace {

// A NumPy array that takes over `values` (freed with the array; no copy).
template <class T>
nb::object numpy_array(std::vector<T> values, std::initializer_list<std::size_t> shape) {
  auto* owned = new std::vector<T>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(owned->data(), shape, owner).cast();
}

}  // namespace

nb::dict tile_lists(const TilePlan& plan) {
  const std::size_t q_tiles = std::size_t(plan.q_tiles()), k_tiles = std::size_t(plan.k_tiles());
  std::vector<std::int32_t> partial_count(q_tiles), full_count(q_tiles);
  std::vector<std::int32_t> partial_index(q_tiles * k_tiles), full_index(q_tiles * k_tiles);
  std::vector<std::int32_t> mask_ids(q_tiles * k_tiles, -1);
  for (std::size_t row = 0; row < q_tiles; ++row) {
    const auto full = plan.full_tiles(std::int64_t(row));
    const auto partial = plan.partial_tiles(std::int64_t(row));
    const auto ids = plan.partial_mask_ids(std::int64_t(row));
    full_count[row] = std::int32_t(full.size());
    partial_count[row] = std::int32_t(partial.size());
    std::copy(full.begin(), full.end(), full_index.begin() + std::ptrdiff_t(row * k_tiles));
    std::copy(partial.begin(), partial.end(), partial_index.begin() + std::ptrdiff_t(row * k_tiles));
    for (std::size_t i = 0; i < partial.size(); ++i) mask_ids[row * k_tiles + std::size_t(partial[i])] = ids[i];
  }
  // The bitmasks unpacked: bit c % 64 of word c / 64 of row r says whether query q0 + r sees key k0 + c.
  const std::size_t rows = std::size_t(plan.tile().q), cols = std::size_t(plan.tile().k);
  const std::size_t words = std::size_t(plan.mask_words_per_row());
  const std::int64_t mask_count = plan.stats().distinct_masks;
  std::vector<std::uint8_t> masks(std::size_t(mask_count) * rows * cols);  // 0 / 1 (Python views it as bool)
  for (std::int32_t id = 0; id < std::int32_t(mask_count); ++id) {
    const std::uint64_t* bits = plan.mask(id);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c)
        masks[(std::size_t(id) * rows + r) * cols + c] = (bits[r * words + c / 64] >> (c % 64)) & 1u;
  }
  nb::dict d;
  d["kv_num_blocks"] = numpy_array(std::move(partial_count), {q_tiles});
  d["kv_indices"] = numpy_array(std::move(partial_index), {q_tiles, k_tiles});
  d["full_kv_num_blocks"] = numpy_array(std::move(full_count), {q_tiles});
  d["full_kv_indices"] = numpy_array(std::move(full_index), {q_tiles, k_tiles});
  d["mask_ids"] = numpy_array(std::move(mask_ids), {q_tiles, k_tiles});
  d["masks"] = numpy_array(std::move(masks), {std::size_t(mask_count), rows, cols});
  d["tile"] = nb::make_tuple(plan.tile().q, plan.tile().k);
  d["order"] = std::string(to_string(plan.order()));
  return d;
}

nb::object token_order(const VideoGrid& grid, TokenOrder order) {
  std::vector<std::int64_t> map = permutation_map(grid, TokenOrder::FrameMajor, order);
  const std::size_t tokens = map.size();
  return numpy_array(std::move(map), {tokens});
}

}  // namespace stsa::python
