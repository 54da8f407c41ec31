#include <gtest/gtest.h>

#include <limits>
#include <set>
#include <string>

#include "stsa/error.hpp"
#include "stsa/layout.hpp"

namespace stsa {
namespace {

std::vector<VideoGrid> awkward_grids() {
  return {{1, 1, 1, 0, TextPlacement::After},  {1, 3, 5, 0, TextPlacement::After},
          {4, 3, 5, 7, TextPlacement::Before}, {5, 2, 3, 4, TextPlacement::After},
          {2, 1, 1, 0, TextPlacement::After},  {7, 4, 4, 1, TextPlacement::Before}};
}

TEST(Layout, CoordAndPositionAreInverseInBothOrders) {
  for (const VideoGrid& g : awkward_grids())
    for (TokenOrder order : {TokenOrder::FrameMajor, TokenOrder::SpatialMajor}) {
      std::set<std::pair<std::int64_t, std::int64_t>> seen;
      std::int64_t text = 0;
      for (std::int64_t pos = 0; pos < g.tokens(); ++pos) {
        const TokenCoord c = g.coord(pos, order);
        EXPECT_EQ(g.position(c, order), pos) << g.describe() << " " << to_string(order);
        if (c.is_text) {
          ++text;
          continue;
        }
        EXPECT_TRUE(c.frame >= 0 && c.frame < g.frames && c.patch >= 0 && c.patch < g.tokens_per_frame());
        EXPECT_TRUE(seen.insert({c.frame, c.patch}).second) << "token visited twice";
      }
      EXPECT_EQ(text, g.text_tokens);
      EXPECT_EQ(std::int64_t(seen.size()), g.video_tokens());
    }
}

TEST(Layout, SpatialMajorKeepsFrameZeroInFrontAndInterleavesTheRest) {
  const VideoGrid g{4, 2, 3, 2, TextPlacement::Before};  // P = 6, F = 4
  for (std::int64_t p = 0; p < 6; ++p) EXPECT_EQ(g.video_position(0, p, TokenOrder::SpatialMajor), p);
  // Token (f, p), f >= 1, sits at P + p * (F - 1) + (f - 1).
  EXPECT_EQ(g.video_position(1, 0, TokenOrder::SpatialMajor), 6);
  EXPECT_EQ(g.video_position(3, 0, TokenOrder::SpatialMajor), 8);
  EXPECT_EQ(g.video_position(1, 1, TokenOrder::SpatialMajor), 9);
  EXPECT_EQ(g.video_position(2, 5, TokenOrder::FrameMajor), 17);
  // Text keeps its place: first two positions are text in both orders.
  EXPECT_TRUE(g.coord(0, TokenOrder::SpatialMajor).is_text);
  EXPECT_TRUE(g.coord(1, TokenOrder::FrameMajor).is_text);
  EXPECT_EQ(g.coord(2, TokenOrder::SpatialMajor).frame, 0);
}

TEST(Layout, RejectsBadSizes) {
  EXPECT_THROW((VideoGrid{0, 1, 1}.validate()), InvalidArgument);
  EXPECT_THROW((VideoGrid{1, -2, 1}.validate()), InvalidArgument);
  EXPECT_THROW((VideoGrid{1, 1, 0}.validate()), InvalidArgument);
  EXPECT_THROW((VideoGrid{1, 1, 1, -1}.validate()), InvalidArgument);
  EXPECT_THROW((VideoGrid{1 << 20, 1 << 20, 1 << 20}.validate()), InvalidArgument);
  EXPECT_THROW((VideoGrid{1, 1, 1}.coord(1, TokenOrder::FrameMajor)), InvalidArgument);
  VideoLayout layout{{21, 90, 160}, 1, 40, 128};
  EXPECT_NO_THROW(layout.validate());
  layout.head_dim = 0;
  EXPECT_THROW(layout.validate(), InvalidArgument);
  layout.head_dim = 128;
  layout.batch = std::int64_t(1) << 40;
  EXPECT_THROW(layout.validate(), ResourceError);
}

// The limits of validate() at their edges: text tokens count toward the
// 2^31 - 1 tokens (plans index tokens with 32-bit columns), and the head dim is
// at most 512.
TEST(Layout, LimitsHoldAtTheirEdges) {
  constexpr std::int64_t kMax = (std::int64_t(1) << 31) - 1;
  EXPECT_NO_THROW((VideoGrid{1, 1, kMax, 0}.validate()));
  EXPECT_NO_THROW((VideoGrid{1, 1, kMax - 10, 10}.validate()));
  EXPECT_THROW((VideoGrid{1, 1, kMax - 10, 11}.validate()), InvalidArgument);
  EXPECT_THROW((VideoGrid{1, 1, kMax - 10, 11, TextPlacement::Before}.validate()), InvalidArgument);
  VideoLayout layout{{2, 3, 4}, 1, 2, 512};
  EXPECT_NO_THROW(layout.validate());
  layout.head_dim = 513;
  EXPECT_THROW(layout.validate(), InvalidArgument);
}

// A text count near INT64_MAX must not overflow video + text (it once wrapped
// negative, passed, and reached the B x N x H x D check as a negative N).
TEST(Layout, HugeTextCountIsRefusedWithoutOverflow) {
  constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
  for (std::int64_t text : {kI64Max, kI64Max - 5, std::int64_t(1) << 62}) {
    try {
      VideoGrid{2, 3, 4, text}.validate();
      ADD_FAILURE() << "text " << text << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("exceeds the supported maximum"), std::string::npos) << e.what();
    }
    EXPECT_THROW((VideoLayout{{2, 3, 4, text}, 1, 40, 128}.validate()), InvalidArgument);
  }
}

// A cast integer is no placement: it once passed, and a mismatch message then
// printed two grids that read the same ("... text after").
TEST(Layout, TextPlacementOutsideTheEnumIsRefused) {
  for (const std::int64_t text : {0, 3}) {
    try {
      VideoGrid{2, 3, 4, text, TextPlacement(2)}.validate();
      ADD_FAILURE() << "placement 2 was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("text placement must be before or after, got 2"), std::string::npos)
          << e.what();
    }
    EXPECT_THROW((VideoLayout{{2, 3, 4, text, TextPlacement(7)}, 1, 2, 64}.validate()), InvalidArgument);
  }
  EXPECT_NO_THROW((VideoGrid{2, 3, 4, 3, TextPlacement::Before}.validate()));
}

}  // namespace
}  // namespace stsa
