// Synthetic structured heads: shapes, determinism, ground truth, and that the
// heads really attend the way their kind says.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "stsa/error.hpp"
#include "stsa/synth.hpp"

namespace stsa {
namespace {

synth::Options small(std::uint64_t seed) {
  const synth::Options o{.grid = {9, 8, 10, 5, TextPlacement::After}, .heads = 6, .head_dim = 64, .seed = seed};
  return o;
}

// Softmax weights of one query row against all keys (fp64).
std::vector<double> attention_row(const synth::Data& d, std::int64_t h, std::int64_t row) {
  const TensorView q = d.q.view(), k = d.k.view();
  const std::int64_t n = d.layout.tokens(), dim = d.layout.head_dim;
  std::vector<double> w(static_cast<std::size_t>(n));
  double m = -INFINITY;
  for (std::int64_t j = 0; j < n; ++j) {
    double s = 0;
    for (std::int64_t c = 0; c < dim; ++c) s += double(q.load(0, row, h, c)) * double(k.load(0, j, h, c));
    w[std::size_t(j)] = s / std::sqrt(double(dim));
    m = std::max(m, w[std::size_t(j)]);
  }
  double z = 0;
  for (double& x : w) z += (x = std::exp(x - m));
  for (double& x : w) x /= z;
  return w;
}

TEST(Synth, ShapesTruthAndDeterminism) {
  const synth::Data a = synth::make_video_tokens(small(3)), b = synth::make_video_tokens(small(3));
  const synth::Data c = synth::make_video_tokens(small(4));
  EXPECT_EQ(a.layout.tokens(), 9 * 8 * 10 + 5);
  EXPECT_EQ(a.q.view().shape, (std::array<std::int64_t, 4>{1, a.layout.tokens(), 6, 64}));
  ASSERT_EQ(a.truth.size(), 6u);
  EXPECT_EQ(std::count(a.truth.begin(), a.truth.end(), Route::Temporal), 3);
  EXPECT_EQ(std::memcmp(a.q.view().data, b.q.view().data, a.q.bytes()), 0);
  EXPECT_EQ(std::memcmp(a.v.view().data, b.v.view().data, a.v.bytes()), 0);
  EXPECT_NE(std::memcmp(a.k.view().data, c.k.view().data, a.k.bytes()), 0);
  synth::Options all_temporal = small(1);
  all_temporal.temporal_fraction = 1.0;
  const synth::Data t = synth::make_video_tokens(all_temporal);
  EXPECT_EQ(std::count(t.truth.begin(), t.truth.end(), Route::Temporal), 6);
  synth::Options bf16 = small(1);
  bf16.dtype = DType::BF16;
  bf16.memory = MemoryLayout::BHND;
  EXPECT_EQ(synth::make_video_tokens(bf16).q.dtype(), DType::BF16);
}

TEST(Synth, HeadsAttendTheWayTheirKindSays) {
  const synth::Data d = synth::make_video_tokens(small(2));
  const VideoGrid& g = d.layout.grid;
  for (std::int64_t h = 0; h < d.layout.heads; ++h) {
    // A query in the middle of the clip.
    const std::int64_t frame = 4, patch = 3 * g.width + 5;
    const std::int64_t row = g.video_position(frame, patch, TokenOrder::FrameMajor);
    const std::vector<double> w = attention_row(d, h, row);
    double same_frame = 0, same_patch_other_frames = 0, anchor = 0;
    for (std::int64_t j = 0; j < g.tokens(); ++j) {
      const TokenCoord c = g.coord(j, TokenOrder::FrameMajor);
      if (c.is_text) continue;
      if (c.frame == 0) anchor += w[std::size_t(j)];
      else if (c.frame == frame) same_frame += w[std::size_t(j)];
      else if (c.patch == patch) same_patch_other_frames += w[std::size_t(j)];
    }
    SCOPED_TRACE("head " + std::to_string(h) + " " + std::string(to_string(d.truth[std::size_t(h)])));
    if (d.truth[std::size_t(h)] == Route::Spatial) {
      EXPECT_GT(same_frame, 0.5);
      EXPECT_LT(same_patch_other_frames, 0.1);
    } else {
      EXPECT_GT(same_patch_other_frames, 0.5);
      EXPECT_LT(same_frame - w[std::size_t(row)], 0.1);  // apart from itself, little in its own frame
    }
    EXPECT_GT(anchor, 0.01);  // frame 0 is a sink for every head
  }
}

TEST(Synth, RejectsBadOptions) {
  auto bad = [](auto edit) {
    synth::Options o = small(1);
    edit(o);
    return o;
  };
  EXPECT_THROW(synth::make_video_tokens(bad([](auto& o) { o.head_dim = 63; })), InvalidArgument);
  EXPECT_THROW(synth::make_video_tokens(bad([](auto& o) { o.head_dim = 2; })), InvalidArgument);
  EXPECT_THROW(synth::make_video_tokens(bad([](auto& o) { o.heads = 0; })), InvalidArgument);
  EXPECT_THROW(synth::make_video_tokens(bad([](auto& o) { o.batch = 0; })), InvalidArgument);
  EXPECT_THROW(synth::make_video_tokens(bad([](auto& o) { o.temporal_fraction = -0.1; })), InvalidArgument);
  EXPECT_THROW(synth::make_video_tokens(bad([](auto& o) { o.peak_logit = NAN; })), InvalidArgument);
  EXPECT_THROW(synth::make_video_tokens(bad([](auto& o) { o.grid.frames = 0; })), InvalidArgument);
  EXPECT_THROW(synth::make_video_tokens(bad([](auto& o) { o.grid.height = 1 << 20, o.grid.width = 1 << 20; })),
               InvalidArgument);
}

// "share of temporal heads (rounded)" (synth.hpp): round(H x fraction) heads, halves away from zero.
TEST(Synth, TemporalHeadsAreTheRoundedShare) {
  // Of 6 heads: 1.8, 1.5, 0.3 and 3.6 round to 2, 2, 0 and 4.
  const std::pair<double, std::int64_t> cases[] = {{0.3, 2}, {0.25, 2}, {0.05, 0}, {0.6, 4}};
  for (const auto& [fraction, temporal] : cases) {
    synth::Options o = small(1);
    o.temporal_fraction = fraction;
    const synth::Data d = synth::make_video_tokens(o);
    EXPECT_EQ(std::count(d.truth.begin(), d.truth.end(), Route::Temporal), temporal) << fraction;
  }
}

}  // namespace
}  // namespace stsa
