// The device token-order arithmetic (src/cuda/video_order.hpp), shared by the
// GPU permutation and the device mask predicate, against VideoGrid's own
// coord() / video_position() in both orders: plain C++, runs in every build.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/scattered_output_order.hpp"
#include "cuda/video_order.hpp"
#include "stsa/layout.hpp"
#include "stsa/permute.hpp"
#include "stsa/tensor.hpp"

namespace stsa {
namespace {

TEST(CudaVideoOrder, MatchesTheGridInBothOrdersAndBothWidths) {
  const VideoGrid grids[] = {{1, 3, 5}, {2, 1, 1}, {7, 3, 4, 5, TextPlacement::Before}, {21, 6, 9}};
  for (const VideoGrid& g : grids)
    for (const TokenOrder order : {TokenOrder::FrameMajor, TokenOrder::SpatialMajor}) {
      const bool spatial = order == TokenOrder::SpatialMajor;
      const std::int64_t per_frame = g.tokens_per_frame();
      for (std::int64_t v = 0; v < g.video_tokens(); ++v) {
        const TokenCoord c = g.coord(g.video_begin() + v, order);
        const auto at64 = cuda_detail::video_coordinates<std::int64_t>(v, g.frames, per_frame, spatial);
        const auto at32 = cuda_detail::video_coordinates<std::int32_t>(std::int32_t(v), std::int32_t(g.frames),
                                                                        std::int32_t(per_frame), spatial);
        ASSERT_EQ(at64.frame, c.frame) << g.describe() << " v " << v;
        ASSERT_EQ(at64.patch, c.patch) << g.describe() << " v " << v;
        ASSERT_EQ(at32.frame, c.frame);
        ASSERT_EQ(at32.patch, c.patch);
        for (const TokenOrder to : {TokenOrder::FrameMajor, TokenOrder::SpatialMajor})
          ASSERT_EQ(cuda_detail::video_position<std::int64_t>(c.frame, c.patch, g.frames, per_frame,
                                                              to == TokenOrder::SpatialMajor),
                    g.video_position(c.frame, c.patch, to));
      }
    }
}

// The permutation's row map: destination position (order `to`) -> source
// position (order `from`), text tokens included, in the three widths it may use.
TEST(CudaVideoOrder, ReorderedPositionsFollowTheGridAndTextKeepsItsPlace) {
  const VideoGrid grids[] = {{1, 3, 5, 4, TextPlacement::After},
                             {2, 1, 1},
                             {7, 3, 4, 5, TextPlacement::Before},
                             {21, 6, 9, 3, TextPlacement::After}};
  for (const VideoGrid& g : grids)
    for (const TokenOrder to : {TokenOrder::FrameMajor, TokenOrder::SpatialMajor})
      for (const TokenOrder from : {TokenOrder::FrameMajor, TokenOrder::SpatialMajor}) {
        const bool to_spatial = to == TokenOrder::SpatialMajor, from_spatial = from == TokenOrder::SpatialMajor;
        for (std::int64_t position = 0; position < g.tokens(); ++position) {
          const std::int64_t expected = g.position(g.coord(position, to), from);
          ASSERT_EQ(cuda_detail::reordered_position<std::int64_t>(position, g.video_begin(), g.frames,
                                                                  g.tokens_per_frame(), to_spatial, from_spatial),
                    expected)
              << g.describe() << " position " << position;
          ASSERT_EQ(cuda_detail::reordered_position<std::int32_t>(
                        std::int32_t(position), std::int32_t(g.video_begin()), std::int32_t(g.frames),
                        std::int32_t(g.tokens_per_frame()), to_spatial, from_spatial),
                    expected);
          ASSERT_EQ(cuda_detail::reordered_position<std::uint32_t>(
                        std::uint32_t(position), std::uint32_t(g.video_begin()), std::uint32_t(g.frames),
                        std::uint32_t(g.tokens_per_frame()), to_spatial, from_spatial),
                    std::uint32_t(expected));
        }
      }
}

// The epilogue's stores (output_order.hpp, and the head map CudaBackend sets
// beside it) against the CPU scatter they replace: every packed row is stored
// where scatter_heads moves it, for ScatteredOutput's `from` / `to` both ways
// (text tokens, one frame), into a subset of the heads in scrambled order.
TEST(CudaVideoOrder, OutputRowsGoWhereScatterHeadsPutsThem) {
  const VideoGrid grids[] = {{1, 3, 5, 4, TextPlacement::After},
                             {2, 1, 1},
                             {7, 3, 4, 5, TextPlacement::Before},
                             {21, 6, 9, 3, TextPlacement::After}};
  const std::vector<std::int64_t> heads = {2, 0};  // packed head j -> head heads[j] of 3
  for (const VideoGrid& g : grids)
    for (const TokenOrder from : {TokenOrder::FrameMajor, TokenOrder::SpatialMajor})
      for (const TokenOrder to : {TokenOrder::FrameMajor, TokenOrder::SpatialMajor}) {
        const std::int64_t n = g.tokens();
        // Each packed row's LSE names it; O rides along (scatter_heads moves both).
        LseBuffer packed_lse(1, 2, n), lse(1, 3, n);
        for (std::int64_t j = 0; j < 2; ++j)
          for (std::int64_t p = 0; p < n; ++p) packed_lse.view().at(0, j, p) = float(j * 100000 + p);
        Tensor packed_o(DType::F32, 1, n, 2, 1), o(DType::F32, 1, n, 3, 1);
        const TensorView packed[] = {packed_o.view()}, dests[] = {o.view()};
        scatter_heads(g, from, to, heads, packed, dests, packed_lse.view(), lse.view(), 1);

        const cuda_detail::OutputOrder order = cuda_detail::output_order(g, from, to);
        for (std::int64_t j = 0; j < 2; ++j)
          for (std::int64_t p = 0; p < n; ++p)
            ASSERT_EQ(lse.view().at(0, heads[std::size_t(j)], cuda_detail::output_token(order, int(p))),
                      float(j * 100000 + p))
                << g.describe() << " packed head " << j << " row " << p << (from == to ? " (same order)" : "");
      }
}

}  // namespace
}  // namespace stsa
