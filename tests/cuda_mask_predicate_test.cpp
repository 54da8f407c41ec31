// The device form of the mask predicate (src/cuda/mask_predicate.hpp) against
// stsa::allowed_at(), the single source of truth: every pair of many small,
// awkward grids (one frame, one row, text before and after, widths -1, 0, past
// the end and beyond 32 bits), then random pairs of large grids up to the
// 2^31 - 1 token limit. The header is plain C++, so this runs in every build,
// with or without the CUDA toolkit; it is what stands between the routing
// kernels and a silently wrong mask on machines without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/mask_predicate.hpp"
#include "cuda/mask_predicate_host.hpp"
#include "stsa/layout.hpp"
#include "stsa/mask.hpp"

namespace stsa {
namespace {

std::vector<MaskSpec> specs_for(const VideoGrid& g, bool anchor) {
  std::vector<MaskSpec> specs = {MaskSpec::dense()};
  const std::int64_t huge = std::int64_t(1) << 40;  // beyond 32 bits: clamped, keeps every pair
  for (std::int64_t w : {std::int64_t(-1), std::int64_t(0), std::int64_t(1), std::int64_t(2), g.tokens_per_frame(),
                         g.video_tokens() / 3, g.video_tokens() - 1, g.video_tokens(), huge}) {
    specs.push_back(MaskSpec::spatial(w, anchor));
    specs.push_back(MaskSpec::temporal(w, anchor));
  }
  for (std::int64_t r : {std::int64_t(-1), std::int64_t(0), std::int64_t(1), std::int64_t(2), g.frames, huge})
    specs.push_back(MaskSpec::frame_window(r, anchor));
  MaskSpec dense_no_anchor = MaskSpec::dense();
  dense_no_anchor.anchor = false;
  specs.push_back(dense_no_anchor);
  return specs;
}

TEST(CudaMaskPredicate, MatchesAllowedOnEveryPairOfSmallGrids) {
  const std::vector<VideoGrid> grids = {
      {1, 1, 1, 0, TextPlacement::After},  {1, 3, 4, 0, TextPlacement::After},  {1, 2, 3, 5, TextPlacement::Before},
      {2, 1, 1, 0, TextPlacement::After},  {2, 2, 3, 1, TextPlacement::After},  {3, 1, 5, 4, TextPlacement::Before},
      {5, 3, 4, 7, TextPlacement::Before}, {4, 2, 5, 3, TextPlacement::After},  {3, 1, 1, 0, TextPlacement::After},
      {7, 2, 2, 2, TextPlacement::After},  {6, 1, 3, 0, TextPlacement::Before}, {1, 1, 1, 9, TextPlacement::Before}};
  std::int64_t pairs = 0, kept = 0;
  for (const VideoGrid& g : grids)
    for (TokenOrder order : {TokenOrder::FrameMajor, TokenOrder::SpatialMajor})
      for (bool anchor : {true, false})
        for (const MaskSpec& spec : specs_for(g, anchor)) {
          const auto pg = cuda_detail::predicate_grid(g, order);
          const auto pm = cuda_detail::predicate_mask(spec);
          for (std::int64_t i = 0; i < g.tokens(); ++i)
            for (std::int64_t j = 0; j < g.tokens(); ++j) {
              const bool expected = allowed_at(g, spec, order, i, j);
              ASSERT_EQ(cuda_detail::mask_allows_at(pg, pm, std::int32_t(i), std::int32_t(j)), expected)
                  << g.describe() << " " << spec.describe() << " stored " << to_string(order) << " pair " << i
                  << ", " << j;
              ++pairs;
              kept += expected;
            }
        }
  // Both answers must actually occur (a predicate that always says yes would pass nothing above).
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, pairs);
}

// The factored form: a token's code depends on the mask and the token only.
TEST(CudaMaskPredicate, TokenCodesAreThoseOfTheMaskDefinition) {
  const VideoGrid g{4, 3, 5, 6, TextPlacement::Before};
  for (TokenOrder order : {TokenOrder::FrameMajor, TokenOrder::SpatialMajor})
    for (bool anchor : {true, false})
      for (const MaskSpec& spec : {MaskSpec::spatial(3, anchor), MaskSpec::temporal(3, anchor),
                                   MaskSpec::frame_window(1, anchor)}) {
        const auto pg = cuda_detail::predicate_grid(g, order);
        const auto pm = cuda_detail::predicate_mask(spec);
        for (std::int64_t pos = 0; pos < g.tokens(); ++pos) {
          const TokenCoord c = g.coord(pos, order);
          const cuda_detail::MaskToken t = cuda_detail::mask_token(pg, pm, std::int32_t(pos));
          const bool forced = c.is_text || (anchor && c.frame == 0);
          ASSERT_EQ(t.forced, forced) << spec.describe() << " position " << pos;
          if (forced) continue;
          const std::int64_t code = spec.kind == MaskKind::FrameWindow
                                        ? c.frame
                                        : g.video_position(c.frame, c.patch, spec.band_order);
          EXPECT_EQ(t.code, code) << spec.describe() << " position " << pos;
        }
      }
}

// Random pairs, biased towards the band edges, on the 1440p grid with text and on
// grids at the 2^31 - 1 token limit (32-bit arithmetic must not overflow).
TEST(CudaMaskPredicate, MatchesAllowedOnRandomPairsOfLargeGrids) {
  const std::vector<VideoGrid> grids = {{21, 90, 160, 512, TextPlacement::After},
                                        {33, 45, 80, 256, TextPlacement::Before},
                                        {3, 1, 715827882, 0, TextPlacement::After},           // 2^31 - 2 tokens
                                        {2, 1, 1073741823, 1, TextPlacement::Before}};        // 2^31 - 1 tokens
  std::mt19937_64 rng(12345);
  for (const VideoGrid& g : grids)
    for (TokenOrder order : {TokenOrder::FrameMajor, TokenOrder::SpatialMajor})
      for (bool anchor : {true, false}) {
        const std::int64_t n = g.tokens();
        const std::vector<MaskSpec> specs = {
            MaskSpec::spatial(g.video_tokens() / 7, anchor), MaskSpec::temporal(g.video_tokens() / 5, anchor),
            MaskSpec::frame_window(1, anchor), MaskSpec::spatial(g.video_tokens() - 1, anchor),
            MaskSpec::temporal(0, anchor)};
        for (const MaskSpec& spec : specs) {
          const auto pg = cuda_detail::predicate_grid(g, order);
          const auto pm = cuda_detail::predicate_mask(spec);
          for (int trial = 0; trial < 4000; ++trial) {
            const std::int64_t i = std::int64_t(rng() % std::uint64_t(n));
            std::int64_t j = std::int64_t(rng() % std::uint64_t(n));
            if (trial % 2 == 1 && spec.kind == MaskKind::Band) {
              // A key near the band edge of the query, in storage positions.
              const TokenCoord c = g.coord(i, order);
              if (!c.is_text) {
                const std::int64_t p = g.video_position(c.frame, c.patch, spec.band_order) +
                                       (trial % 4 == 1 ? spec.band : -spec.band) + std::int64_t(rng() % 3) - 1;
                if (p >= 0 && p < g.video_tokens()) {
                  TokenCoord k;
                  const std::int64_t f = g.frames, per = g.tokens_per_frame();
                  if (spec.band_order == TokenOrder::FrameMajor || p < per) {
                    k.frame = p / per;
                    k.patch = p % per;
                  } else {
                    k.patch = (p - per) / (f - 1);
                    k.frame = 1 + (p - per) % (f - 1);
                  }
                  j = g.position(k, order);
                }
              }
            }
            ASSERT_EQ(cuda_detail::mask_allows_at(pg, pm, std::int32_t(i), std::int32_t(j)),
                      allowed_at(g, spec, order, i, j))
                << g.describe() << " " << spec.describe() << " stored " << to_string(order) << " pair " << i << ", "
                << j;
          }
        }
      }
}

// The routing kernels test a pair through the row's window of key codes
// (row_window(), window_bit()): the same answer as mask_allows() for every
// pair of forced and unforced tokens, codes at both ends of their range and
// widths from -1 (no pair) to 2^31 - 1, where lo - width and lo + width leave 32 bits.
TEST(CudaMaskPredicate, RowWindowsAgreeWithMaskAllows) {
  constexpr std::int32_t kTop = 2147483646;  // the largest code (codes lie below 2^31 - 1)
  std::vector<std::int32_t> codes = {0, 1, 2, 3, 7, 8, 1000, 1 << 30, (1 << 30) + 1, kTop - 2, kTop - 1, kTop};
  std::mt19937_64 rng(20261130);
  for (int i = 0; i < 24; ++i) codes.push_back(std::int32_t(rng() % std::uint64_t(kTop + 1)));
  std::vector<std::int32_t> widths = {-1, 0, 1, 2, 3, 999, 1 << 30, (1 << 30) + 1, kTop - 1, kTop, kTop + 1};
  // Random widths in [-1, 2^31 - 1], the predicate's whole range.
  for (int i = 0; i < 8; ++i) widths.push_back(std::int32_t(std::int64_t(rng() % (std::uint64_t(kTop) + 3)) - 1));
  std::int64_t checked = 0, allowed = 0;
  for (const std::int32_t width : widths) {
    cuda_detail::PredicateMask m;
    m.kind = cuda_detail::PredicateKind::Band;
    m.width = width;
    for (const bool row_forced : {false, true})
      for (const std::int32_t row_code : codes) {
        const cuda_detail::MaskToken row{row_forced, row_forced ? 0 : row_code};
        const cuda_detail::RowWindow window = cuda_detail::row_window(m, row);
        for (const bool key_forced : {false, true})
          for (const std::int32_t key_code : codes) {
            const cuda_detail::MaskToken key{key_forced, key_forced ? 0 : key_code};
            const bool expected = cuda_detail::mask_allows(m, row, key);
            const std::int32_t stored = key_forced ? -1 : key_code;  // the kernels' code of a forced key
            ASSERT_EQ(cuda_detail::window_allows(window, stored), expected)
                << "width " << width << ", row " << (row_forced ? "forced" : "code ") << row_code << ", key "
                << (key_forced ? "forced" : "code ") << key_code;
            ASSERT_EQ(cuda_detail::window_bit(window, stored, 1u << 13), expected ? 1u << 13 : 0u);
            ++checked;
            allowed += expected;
          }
      }
  }
  // Both answers occur in quantity, so neither side can pass by being constant.
  EXPECT_GT(allowed, checked / 10);
  EXPECT_LT(allowed, checked - checked / 10);
}

}  // namespace
}  // namespace stsa
