// The reference is the oracle, so it is checked against facts that hold by construction.
#include <gtest/gtest.h>

#include <cmath>

#include "stsa/error.hpp"
#include "stsa/reference.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

std::vector<HeadMask> heads_of(std::int64_t count, const MaskSpec& spec) {
  return std::vector<HeadMask>(std::size_t(count), HeadMask{spec, spec.natural_order(), nullptr, true});
}

TEST(Reference, ConstantQueryAveragesTheAllowedValues) {
  // q = 0 makes every allowed score equal, so O is the mean of the allowed V rows.
  const VideoLayout layout{{3, 2, 2, 1, TextPlacement::After}, 1, 2, 8};
  const MaskSpec spec = MaskSpec::spatial(2);
  auto p = testing::make_problem(layout, DType::F32, heads_of(2, spec), testing::fresh_seed());
  Tensor zeros(DType::F32, 1, layout.tokens(), 2, 8);
  AttentionCall call = p.call();
  call.q = zeros.view();
  make_reference_backend()->run(call);
  const std::int64_t n = layout.tokens();
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t count = 0;
      std::vector<double> mean(8, 0.0);
      for (std::int64_t j = 0; j < n; ++j) {
        if (!allowed_at(layout.grid, spec, TokenOrder::FrameMajor, i, j)) continue;
        ++count;
        for (int d = 0; d < 8; ++d) mean[std::size_t(d)] += call.v.load(0, j, h, d);
      }
      for (int d = 0; d < 8; ++d) EXPECT_NEAR(call.o.load(0, i, h, d), mean[std::size_t(d)] / double(count), 1e-6);
      EXPECT_NEAR(call.lse.at(0, h, i), std::log(double(count)), 1e-6);
    }
}

TEST(Reference, EmptyRowsGiveZeroAndMinusInfinity) {
  const VideoLayout layout{{2, 2, 2}, 1, 1, 4};
  auto p = testing::make_problem(layout, DType::F32, heads_of(1, MaskSpec::spatial(-1, false)), 7);
  make_reference_backend()->run(p.call());
  for (std::int64_t i = 0; i < layout.tokens(); ++i) {
    EXPECT_EQ(p.call().lse.at(0, 0, i), -INFINITY);
    for (int d = 0; d < 4; ++d) EXPECT_EQ(p.call().o.load(0, i, 0, d), 0.f);
  }
}

TEST(Reference, NanPropagatesOnlyToRowsThatTouchIt) {
  const VideoLayout layout{{4, 1, 4}, 1, 1, 4};  // 16 tokens
  const MaskSpec spec = MaskSpec::spatial(1, false);
  auto p = testing::make_problem(layout, DType::F32, heads_of(1, spec), 3);
  p.k.view().store(0, 9, 0, 2, NAN);  // key 9 is seen by rows 8, 9, 10
  p.o.poison_finite();                 // rows expected NaN must be written NaN, not left so
  make_reference_backend()->run(p.call());
  for (std::int64_t i = 0; i < layout.tokens(); ++i)
    EXPECT_EQ(std::isnan(p.call().o.load(0, i, 0, 0)), i >= 8 && i <= 10) << "row " << i;
}

// The reference reads each key once for a block of rows; every row must come
// out as it does alone, bit for bit, whatever rows share its block: unsorted,
// repeated, more than one block, rows whose allowed keys differ, a NaN key that
// only some rows see, two batch entries, head-major bf16 memory.
TEST(Reference, RowsInABlockComeOutAsTheyDoAlone) {
  const VideoLayout layout{{4, 3, 5, 6, TextPlacement::Before}, 2, 2, 40};  // 66 tokens
  const MaskSpec spec = MaskSpec::spatial(7);
  auto p = testing::make_problem(layout, DType::BF16, heads_of(2, spec), testing::fresh_seed(), MemoryLayout::BHND);
  p.k.view().store(1, 30, 1, 3, NAN);
  const AttentionCall call = p.call();
  std::vector<std::int64_t> rows;
  // Each block of 16 starts with a row of the band (36, 38, 40 in frame 2), not one that sees every key.
  for (std::int64_t i = 0; i < 40; ++i) rows.push_back((i * 37 + 40) % layout.tokens());
  rows.push_back(rows[3]);
  std::vector<double> o, lse;
  reference_rows(call, rows, o, lse);
  const std::int64_t count = std::int64_t(rows.size()), dim = layout.head_dim;
  int nan_rows = 0;
  for (std::int64_t r = 0; r < count; ++r) {
    std::vector<double> o1, lse1;
    reference_rows(call, {rows[std::size_t(r)]}, o1, lse1);
    for (std::int64_t b = 0; b < layout.batch; ++b)
      for (std::int64_t h = 0; h < layout.heads; ++h) {
        const double lse_block = lse[std::size_t((b * layout.heads + h) * count + r)];
        const double lse_alone = lse1[std::size_t(b * layout.heads + h)];
        nan_rows += std::isnan(lse_alone);
        EXPECT_EQ(std::isnan(lse_block), std::isnan(lse_alone)) << "row " << rows[std::size_t(r)];
        if (!std::isnan(lse_alone)) {
          EXPECT_EQ(lse_block, lse_alone) << "row " << rows[std::size_t(r)];
        }
        for (std::int64_t d = 0; d < dim; ++d) {
          const double x = o[std::size_t(((b * count + r) * layout.heads + h) * dim + d)];
          const double y = o1[std::size_t((b * layout.heads + h) * dim + d)];
          if (std::isnan(y)) {
            EXPECT_TRUE(std::isnan(x)) << "row " << rows[std::size_t(r)] << " d " << d;
          } else {
            EXPECT_EQ(x, y) << "row " << rows[std::size_t(r)] << " d " << d;
          }
        }
      }
  }
  EXPECT_GT(nan_rows, 0);      // the NaN key (batch 1, head 1) reaches some rows...
  EXPECT_LT(nan_rows, count);  // ...and not all
}

TEST(Reference, RejectsMismatchedShapesAndAliasing) {
  const VideoLayout layout{{2, 2, 2}, 1, 2, 4};
  auto p = testing::make_problem(layout, DType::F32, heads_of(2, MaskSpec::dense()), 1);
  AttentionCall call = p.call();
  call.o = call.q;
  EXPECT_THROW(make_reference_backend()->run(call), InvalidArgument);
  call = p.call();
  call.heads.pop_back();
  EXPECT_THROW(make_reference_backend()->run(call), InvalidArgument);
  call = p.call();
  call.k.shape[1] = 7;
  EXPECT_THROW(make_reference_backend()->run(call), InvalidArgument);
  call = p.call();
  call.v.stride = {0, 0, 0, 0};
  EXPECT_THROW(make_reference_backend()->run(call), InvalidArgument);
}

// reference_rows' layouts (reference.hpp): O [B, rows, H, D], LSE [B, H, rows];
// checked against the same rows of a whole reference run (batch and heads > 1,
// so a transposed index shows), and rows outside [0, tokens) refused.
TEST(Reference, SelectedRowsUseTheDocumentedLayouts) {
  const VideoLayout layout{{2, 3, 4, 5, TextPlacement::Before}, 2, 3, 64};  // 29 tokens
  std::vector<HeadMask> heads;
  for (std::int64_t h = 0; h < 3; ++h)
    heads.push_back(HeadMask{h == 1 ? mask_for_density(layout.grid, SparseKind::Spatial, 0.4) : MaskSpec::dense(),
                             TokenOrder::FrameMajor, nullptr, true});
  testing::Problem p = testing::make_problem(layout, DType::F32, heads, testing::fresh_seed());
  const AttentionCall call = p.call();
  make_reference_backend()->run(call);
  const std::int64_t n = layout.tokens();
  const std::vector<std::int64_t> rows{0, 11, n - 1};
  std::vector<double> o, lse;
  reference_rows(call, rows, o, lse);
  const auto count = std::int64_t(rows.size());
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t r = 0; r < count; ++r)
      for (std::int64_t h = 0; h < 3; ++h) {
        EXPECT_FLOAT_EQ(float(lse[std::size_t((b * 3 + h) * count + r)]), call.lse.at(b, h, rows[std::size_t(r)]))
            << b << " " << r << " " << h;
        for (std::int64_t d = 0; d < 64; d += 21)
          EXPECT_FLOAT_EQ(float(o[std::size_t(((b * count + r) * 3 + h) * 64 + d)]),
                          call.o.load(b, rows[std::size_t(r)], h, d));
      }
  EXPECT_THROW(reference_rows(call, {n}, o, lse), InvalidArgument);
  EXPECT_THROW(reference_rows(call, {-1}, o, lse), InvalidArgument);
}

}  // namespace
}  // namespace stsa
