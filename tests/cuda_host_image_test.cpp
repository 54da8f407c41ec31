// The host-side arithmetic of the CUDA backend that needs no GPU, so it runs in
// CI: the image a DevicePlan uploads (checked against the plan it comes from)
// and the TMA descriptor shapes of the sm90 kernel.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda/device_plan_image.hpp"
#include "cuda/sm90_tile_layout.hpp"
#include "cuda/tensor_map_shape.hpp"
#include "stsa/error.hpp"
#include "stsa/mask.hpp"
#include "stsa/plan.hpp"

namespace stsa::cuda_detail {
namespace {

template <class T>
std::vector<T> array_at(const DevicePlanImage& image, std::size_t offset, std::size_t count) {
  std::vector<T> values(count);
  EXPECT_LE(offset + count * sizeof(T), image.bytes.size());
  if (count) std::memcpy(values.data(), image.bytes.data() + offset, count * sizeof(T));
  return values;
}

void check_image(const TilePlan& plan) {
  const DevicePlanImage image = make_device_plan_image(plan);
  const auto q_tiles = std::size_t(plan.q_tiles());
  ASSERT_EQ(image.q_tiles, plan.q_tiles());
  for (const std::size_t offset : {image.row_begin, image.partial_begin, image.key_tiles, image.mask_ids,
                                   image.q_tile_order, image.masks})
    EXPECT_EQ(offset % 256, 0u) << "every array starts 256-byte aligned";

  const auto row_begin = array_at<std::int32_t>(image, image.row_begin, q_tiles + 1);
  const auto partial_begin = array_at<std::int32_t>(image, image.partial_begin, q_tiles);
  const auto key_tiles = array_at<std::int32_t>(image, image.key_tiles, std::size_t(image.kept_tiles));
  const auto mask_ids = array_at<std::int32_t>(image, image.mask_ids, std::size_t(image.kept_tiles));
  const auto order = array_at<std::int32_t>(image, image.q_tile_order, q_tiles);
  ASSERT_EQ(image.rank_costs.size(), q_tiles);
  for (std::size_t rank = 0; rank < q_tiles; ++rank)
    EXPECT_EQ(image.rank_costs[rank], row_begin[std::size_t(order[rank]) + 1] - row_begin[std::size_t(order[rank])])
        << "rank " << rank << ": the host keeps each rank's kept-tile count for the work-order model";
  ASSERT_EQ(row_begin.front(), 0);
  ASSERT_EQ(row_begin.back(), image.kept_tiles);
  for (std::size_t qt = 0; qt < q_tiles; ++qt) {
    const auto full = plan.full_tiles(std::int64_t(qt));
    const auto partial = plan.partial_tiles(std::int64_t(qt));
    const auto ids = plan.partial_mask_ids(std::int64_t(qt));
    ASSERT_EQ(std::size_t(partial_begin[qt] - row_begin[qt]), full.size()) << "query tile " << qt;
    ASSERT_EQ(std::size_t(row_begin[qt + 1] - partial_begin[qt]), partial.size()) << "query tile " << qt;
    for (std::size_t i = 0; i < full.size(); ++i) {
      EXPECT_EQ(key_tiles[std::size_t(row_begin[qt]) + i], full[i]);
      EXPECT_EQ(mask_ids[std::size_t(row_begin[qt]) + i], -1) << "full tiles carry no mask";
      EXPECT_EQ(plan.classify(std::int64_t(qt), full[i]), TileClass::Full);
    }
    for (std::size_t i = 0; i < partial.size(); ++i) {
      EXPECT_EQ(key_tiles[std::size_t(partial_begin[qt]) + i], partial[i]);
      EXPECT_EQ(mask_ids[std::size_t(partial_begin[qt]) + i], ids[i]);
    }
  }
  // A permutation of the query tiles, heaviest first, ties in tile order.
  std::vector<int> seen(q_tiles, 0);
  for (std::size_t i = 0; i < q_tiles; ++i) {
    ASSERT_GE(order[i], 0);
    ASSERT_LT(std::size_t(order[i]), q_tiles);
    ++seen[std::size_t(order[i])];
    if (i > 0) {
      const auto cost = [&](std::int32_t t) { return row_begin[std::size_t(t) + 1] - row_begin[std::size_t(t)]; };
      ASSERT_TRUE(cost(order[i - 1]) > cost(order[i]) || (cost(order[i - 1]) == cost(order[i]) && order[i - 1] < order[i]))
          << "position " << i;
    }
  }
  for (const int count : seen) ASSERT_EQ(count, 1);
  // The bitmasks, byte for byte.
  const std::size_t words = std::size_t(plan.tile().q) * std::size_t(plan.mask_words_per_row());
  for (std::int64_t id = 0; id < image.distinct_masks; ++id)
    EXPECT_EQ(std::memcmp(image.bytes.data() + image.masks + std::size_t(id) * words * 8, plan.mask(std::int32_t(id)),
                          words * 8),
              0)
        << "mask " << id;
}

TEST(DevicePlanImage, MirrorsThePlanOnAwkwardGrids) {
  const VideoGrid grids[] = {{3, 7, 9, 77, TextPlacement::After}, {1, 9, 11}, {21, 8, 12, 40, TextPlacement::Before},
                             {2, 8, 16}};
  for (const VideoGrid& g : grids)
    for (const MaskSpec& spec : {mask_for_density(g, SparseKind::Spatial, 0.2),
                                 mask_for_density(g, SparseKind::Temporal, 0.3), MaskSpec::frame_window(1),
                                 MaskSpec::dense(), MaskSpec::spatial(-1, /*anchor=*/false)}) {
      SCOPED_TRACE(g.describe());
      check_image(*TilePlan::build(g, spec));
    }
}

TEST(TensorMapShape, ListsDimensionsInnermostFirstWithByteStrides) {
  // BNHD, 2 x 300 x 12 x 128: token stride H * D, head stride D, batch stride N * H * D.
  const std::int64_t bnhd[3] = {300 * 12 * 128, 12 * 128, 128};
  const RowTensorMapShape s = row_tensor_map_shape(2, 300, 12, 128, bnhd, 128);
  EXPECT_EQ(s.dims[0], 128u);
  EXPECT_EQ(s.dims[1], 300u);
  EXPECT_EQ(s.dims[2], 12u);
  EXPECT_EQ(s.dims[3], 2u);
  EXPECT_EQ(s.strides_bytes[0], 12u * 128 * 2);        // token
  EXPECT_EQ(s.strides_bytes[1], 128u * 2);             // head
  EXPECT_EQ(s.strides_bytes[2], 300u * 12 * 128 * 2);  // batch
  EXPECT_EQ(s.box[0], 64u);
  EXPECT_EQ(s.box[1], 128u);
  EXPECT_EQ(s.box[2], 1u);
  EXPECT_EQ(s.box[3], 1u);
  // BHND: the token stride is D, the head stride N * D.
  const std::int64_t bhnd[3] = {12 * 300 * 64, 64, 300 * 64};
  const RowTensorMapShape h = row_tensor_map_shape(2, 300, 12, 64, bhnd, 128);
  EXPECT_EQ(h.strides_bytes[0], 64u * 2);
  EXPECT_EQ(h.strides_bytes[1], 300u * 64 * 2);
}

// The sm90 producer expects tile_bytes(D) on a full barrier per tile and loads
// it as D / 64 boxes: if the boxes added up to anything else, the barrier's
// phase would never complete (a hang) or complete before the data landed.
// TMA counts a box's full size even where rows past the sequence are zero-filled.
TEST(TensorMapShape, TheBoxesOfOneTileAddUpToTheBytesItsBarrierExpects) {
  for (int head_dim : {64, 128}) {
    const std::int64_t bnhd[3] = {std::int64_t(300) * 12 * head_dim, std::int64_t(12) * head_dim, head_dim};
    const RowTensorMapShape s = row_tensor_map_shape(2, 300, 12, head_dim, bnhd, 128);
    const std::uint64_t box_bytes = std::uint64_t(s.box[0]) * s.box[1] * s.box[2] * s.box[3] * 2;
    EXPECT_EQ(box_bytes, sm90_layout::column_block_bytes(128)) << "D = " << head_dim;
    EXPECT_EQ(box_bytes * std::uint64_t(head_dim / 64), sm90_layout::tile_bytes(head_dim)) << "D = " << head_dim;
  }
}

TEST(TensorMapShape, ExtentOneTakesAnyStrideAndBadStridesAreUnsupported) {
  const std::int64_t odd_batch_stride[3] = {3, 4 * 64, 64};  // batch 1: its stride is never used
  EXPECT_EQ(row_tensor_map_shape(1, 100, 4, 64, odd_batch_stride, 128).strides_bytes[2], 16u);
  const std::int64_t misaligned[3] = {100 * 4 * 64, 4 * 64 + 4, 64};  // token stride 520 bytes
  EXPECT_THROW(row_tensor_map_shape(2, 100, 4, 64, misaligned, 128), Unsupported);
  const std::int64_t huge[3] = {std::int64_t(1) << 40, 4 * 64, 64};
  EXPECT_THROW(row_tensor_map_shape(2, 100, 4, 64, huge, 128), Unsupported);
}

}  // namespace
}  // namespace stsa::cuda_detail
