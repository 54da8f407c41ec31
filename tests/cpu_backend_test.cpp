// The CPU backend against the fp64 reference, on every instruction set this
// machine has (AMX tile products for bf16 inputs included), over awkward shapes: ragged tiles, one frame, 1x1 frames,
// text before and after, head dims 64/80/96/128 (and any other up to 128, padded), fp32/bf16/f16 in and
// out, both memory layouts, every mask kind at densities 0, 0.02, 0.25 and 1, anchor on and off, three tile
// shapes and rounded plans.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/isa.hpp"
#include "stsa/cpu.hpp"
#include "stsa/error.hpp"
#include "stsa/mask.hpp"
#include "stsa/plan.hpp"
#include "support/cpu_isas.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

HeadMask head_for(const VideoGrid& grid, const MaskSpec& spec, TileShape tile, Alignment align) {
  return HeadMask{spec, spec.natural_order(), TilePlan::build(grid, spec, tile, align), true};
}

// One head per mask kind, all at `density` (dense ignores it).
std::vector<HeadMask> four_heads(const VideoGrid& grid, double density, bool anchor, TileShape tile, Alignment align) {
  return {head_for(grid, mask_for_density(grid, SparseKind::Spatial, density, anchor), tile, align),
          head_for(grid, mask_for_density(grid, SparseKind::Temporal, density, anchor), tile, align),
          head_for(grid, mask_for_density(grid, SparseKind::FrameWindow, density, anchor), tile, align),
          head_for(grid, MaskSpec::dense(), tile, align)};
}

// What a rounded plan computes, for the reference (heads in tensor order = plan order).
PairPredicate plan_predicate(const std::vector<HeadMask>& heads) {
  return
      [&heads](std::int64_t h, std::int64_t q, std::int64_t k) { return heads[std::size_t(h)].plan->computes(q, k); };
}

struct Case {
  VideoGrid grid;
  std::int64_t batch = 1;
  std::int64_t head_dim = 64;
  DType in = DType::F32;
  DType out = DType::F32;
  MemoryLayout memory = MemoryLayout::BNHD;
  TileShape tile{64, 64};
  Alignment align = Alignment::Exact;
  double density = 0.25;
  bool anchor = true;
};

std::string describe(const Case& c, Isa isa) {
  std::ostringstream s;
  s << "isa " << to_string(isa) << ", density " << c.density << (c.anchor ? " +anchor" : " -anchor") << ", tile "
    << c.tile.q << "x" << c.tile.k << " " << to_string(c.align);
  return s.str();
}

// sample_rows > 0: that many random rows against the reference, else all of them.
void check_case(const Case& c, int sample_rows = testing::kMatrixRows) {
  const VideoLayout layout{c.grid, c.batch, 4, c.head_dim};
  for (Isa isa : testing::isas_of_this_machine()) {
    SCOPED_TRACE(describe(c, isa));
    const auto backend = make_cpu_backend({isa, 2});
    auto problem = testing::make_problem(layout, c.in, four_heads(c.grid, c.density, c.anchor, c.tile, c.align),
                                         testing::fresh_seed(), c.memory, c.out);
    ASSERT_TRUE(backend->supports(problem.call()).ok);
    backend->run(problem.call());
    const PairPredicate computes = c.align == Alignment::Round ? plan_predicate(problem.heads) : PairPredicate{};
    const auto cmp = testing::compare_with_reference(problem, sample_rows, testing::fresh_seed(), computes);
    EXPECT_TRUE(cmp.ok()) << cmp.failure;
    if (c.in == DType::F32 && c.out == DType::F32) {
      EXPECT_LT(cmp.rel_l2_err, 1e-5) << problem.label;
    }
  }
}

// Grids chosen so no token count is a tile multiple, with frames of one token
// and of one row, and text on either side.
std::vector<VideoGrid> awkward_grids() {
  return {
      {3, 5, 7, 0, TextPlacement::After},     // 105 tokens
      {1, 9, 11, 13, TextPlacement::Before},  // one frame, text before
      {7, 1, 1, 5, TextPlacement::After},     // 1x1 frames, text after
      {4, 6, 10, 20, TextPlacement::After},   // 260 tokens
      {2, 12, 16, 7, TextPlacement::Before},  // 391 tokens: several 128-tiles
  };
}

TEST(CpuBackend, MatchesReferenceOnAwkwardShapes) {
  const std::int64_t dims[] = {64, 80, 128, 96};
  const TileShape tiles[] = {{64, 64}, {128, 128}, {48, 64}};
  int index = 0;
  for (const VideoGrid& grid : awkward_grids())
    for (double density : {0.0, 0.02, 0.25, 1.0})
      for (bool anchor : {true, false}) {
        Case c;
        c.grid = grid;
        c.density = density;
        c.anchor = anchor;
        // Cycle the remaining parameters so each value meets every grid.
        c.head_dim = dims[index % 4];
        c.tile = tiles[(index / 2) % 3];
        c.in = index % 3 == 1 ? DType::BF16 : index % 6 == 2 ? DType::F16 : index % 6 == 5 ? DType::F8E4M3 : DType::F32;
        c.out = index % 5 == 2 ? DType::BF16 : index % 5 == 4 ? DType::F16 : DType::F32;
        c.memory = (index / 3) % 2 ? MemoryLayout::BHND : MemoryLayout::BNHD;
        c.align = index % 5 == 1 ? Alignment::Round : Alignment::Exact;
        c.batch = index % 7 == 0 ? 2 : 1;
        ++index;
        check_case(c);
      }
}

// A head dim no kernel is built for runs padded to the next one that is (zeros in
// the channels between): odd ones, a single channel, 127; every input dtype,
// both memory layouts. Above 128: Unsupported, naming the range, nothing written.
TEST(CpuBackend, AnyHeadDimUpTo128RunsPadded) {
  const std::int64_t dims[] = {1, 59, 72, 127};
  const DType ins[] = {DType::F32, DType::BF16, DType::F16, DType::F8E4M3};
  int index = 0;
  for (std::int64_t head_dim : dims)
    for (DType in : ins) {
      SCOPED_TRACE(::testing::Message() << "head dim " << head_dim << ", " << to_string(in) << " in");
      Case c;
      c.grid = awkward_grids()[std::size_t(index % 5)];
      c.head_dim = head_dim;
      c.in = in;
      c.out = index % 3 == 1 ? DType::BF16 : DType::F32;
      c.memory = index % 2 ? MemoryLayout::BHND : MemoryLayout::BNHD;
      c.tile = index % 4 == 3 ? TileShape{128, 128} : TileShape{64, 64};
      c.density = index % 3 == 2 ? 1.0 : 0.25;
      c.batch = index % 5 == 0 ? 2 : 1;
      ++index;
      check_case(c, /*sample_rows=*/48);  // the fp64 reference of every row is most of the time otherwise
    }
  const VideoGrid grid{2, 3, 3, 0, TextPlacement::After};
  auto problem = testing::make_problem({grid, 1, 4, 129}, DType::F32,
                                       four_heads(grid, 0.25, true, {64, 64}, Alignment::Exact), testing::fresh_seed());
  for (Isa isa : testing::isas_of_this_machine()) {
    const auto backend = make_cpu_backend({isa, 2});
    const Support support = backend->supports(problem.call());
    EXPECT_FALSE(support.ok);
    EXPECT_NE(support.why.find("head dims 1 to 128, got 129"), std::string::npos) << support.why;
    EXPECT_THROW(backend->run(problem.call()), Unsupported);
  }
  const TensorView o = problem.o.view();  // poisoned with NaN by make_problem: still all NaN
  for (std::int64_t n = 0; n < o.tokens(); ++n)
    for (std::int64_t h = 0; h < 4; ++h)
      for (std::int64_t d = 0; d < 129; ++d) ASSERT_TRUE(std::isnan(o.load(0, n, h, d))) << n << " " << h << " " << d;
}

TEST(CpuBackend, RoundedPlansComputeWhatTheyClaim) {
  for (TileShape tile : {TileShape{64, 64}, TileShape{48, 64}, TileShape{128, 128}}) {
    Case c;
    c.grid = {3, 8, 12, 9, TextPlacement::Before};  // 297 tokens
    c.head_dim = 128;
    c.tile = tile;
    c.align = Alignment::Round;
    c.density = 0.2;
    check_case(c);
  }
}

TEST(CpuBackend, DensityOneEqualsDenseBitForBit) {
  const VideoGrid grid{3, 5, 7, 4, TextPlacement::After};
  const VideoLayout layout{grid, 1, 2, 128};
  for (Isa isa : testing::isas_of_this_machine())
    for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::F8E4M3}) {
      SCOPED_TRACE(std::string(to_string(isa)) + " " + std::string(to_string(dtype)));
      const TileShape tile{64, 64};
      const MaskSpec full = mask_for_density(grid, SparseKind::Spatial, 1.0);
      auto problem = testing::make_problem(
          layout, dtype,
          {head_for(grid, full, tile, Alignment::Exact), head_for(grid, MaskSpec::dense(), tile, Alignment::Exact)},
          testing::fresh_seed());
      // Same inputs for both heads.
      for (std::int64_t n = 0; n < layout.tokens(); ++n)
        for (std::int64_t d = 0; d < 128; ++d)
          for (const TensorView& t : {problem.q.view(), problem.k.view(), problem.v.view()})
            t.store(0, n, 1, d, t.load(0, n, 0, d));
      make_cpu_backend({isa, 2})->run(problem.call());
      const AttentionCall call = problem.call();
      for (std::int64_t n = 0; n < layout.tokens(); ++n) {
        for (std::int64_t d = 0; d < 128; ++d) ASSERT_EQ(call.o.load(0, n, 0, d), call.o.load(0, n, 1, d));
        ASSERT_EQ(call.lse.at(0, 0, n), call.lse.at(0, 1, n));
      }
      EXPECT_TRUE(testing::compare_with_reference(problem).ok());
    }
}

// Tiny values keep their relative error on every kernel: V near and below bf16's
// smallest normal (bf16 products flush results under 2^-126, so the AMX kernel, and
// the AVX-512 one for bf16 in and out, must take their fp32 P V there), and
// probabilities far below a row's largest whose V is huge (exp2 must still give
// them; the AMX split keeps all but 2^-7 of a P under 2^-103, its documented limit;
// a P rounded to bf16, as bf16 outputs take it, keeps all but 2^-9).
TEST(CpuBackend, TinyValuesKeepTheirRelativeError) {
  const VideoGrid grid{2, 4, 8, 0, TextPlacement::After};  // 64 tokens
  const VideoLayout layout{grid, 1, 1, 64};
  const MaskSpec dense = MaskSpec::dense();
  const std::pair<DType, DType> dtypes[] = {{DType::F32, DType::F32}, {DType::BF16, DType::F32},
                                            {DType::BF16, DType::BF16}};
  for (Isa isa : testing::isas_of_this_machine())
    for (const auto& [dtype, out] : dtypes) {
      const std::string label = std::string(to_string(isa)) + " " + std::string(to_string(dtype)) + " in, " +
                                std::string(to_string(out)) + " out";
      // A bf16 output's own rounding is 2^-9 of it, a flushed share of O all of it. Its
      // outputs stay above bf16's smallest normal (subnormal ones keep fewer bits), while
      // at 2^-122 most products of P and V are below it.
      const double bound = out == DType::BF16 ? 4e-3 : 1e-5;
      const std::vector<int> exponents = out == DType::BF16 ? std::vector<int>{-118, -122}
                                                            : std::vector<int>{-118, -126, -130};
      for (int exponent : exponents) {
        SCOPED_TRACE(label + ", V * 2^" + std::to_string(exponent));
        auto problem = testing::make_problem(layout, dtype, {head_for(grid, dense, {64, 64}, Alignment::Exact)},
                                             testing::fresh_seed(), MemoryLayout::BNHD, out);
        const TensorView v = problem.v.view();
        for (std::int64_t n = 0; n < layout.tokens(); ++n)
          for (std::int64_t d = 0; d < 64; ++d) v.store(0, n, 0, d, std::ldexp(v.load(0, n, 0, d), exponent));
        make_cpu_backend({isa, 2})->run(problem.call());
        const auto cmp = testing::compare_with_reference(problem);
        EXPECT_LT(cmp.rel_l2_err, bound);  // (ok()'s absolute bound is loose at these sizes; the relative one is not)
        EXPECT_TRUE(cmp.all_finite_where_expected && cmp.guards_intact) << cmp.failure;  // rel_l2 skips NaN rows
      }
      // Every row: key 0 scores 0 with V = 0; the others score 87 lower (2^-125.5
      // as probabilities) with V = 1e37, so O = 63 * 2^-125.5 * 1e37 ~ 10.4. Then
      // once more with V = +Inf in channel 1 of one key: O[., 1] = +Inf exactly
      // (and the AMX kernel takes its fp32 P V).
      for (bool with_inf : {false, true}) {
        SCOPED_TRACE(label + ", probabilities of 2^-125.5" + (with_inf ? ", an Inf in V" : ""));
        auto problem = testing::make_problem(layout, dtype, {head_for(grid, dense, {64, 64}, Alignment::Exact)}, 1,
                                             MemoryLayout::BNHD, out);
        problem.softmax_scale = 1.0f;
        AttentionCall call = problem.call();
        for (std::int64_t n = 0; n < layout.tokens(); ++n)
          for (std::int64_t d = 0; d < 64; ++d) {
            call.q.store(0, n, 0, d, d == 0 ? 1.0f : 0.0f);
            call.k.store(0, n, 0, d, d == 0 && n > 0 ? -87.0f : 0.0f);
            call.v.store(0, n, 0, d, n == 0 ? 0.0f : with_inf && n == 5 && d == 1 ? INFINITY : 1e37f);
          }
        make_cpu_backend({isa, 2})->run(call);
        std::vector<std::int64_t> rows{0, 33};
        std::vector<double> ref_o, ref_lse;
        reference_rows(call, rows, ref_o, ref_lse);
        const bool tile_split = kernel_isa(isa, call) == Isa::Amx && !with_inf;
        const double tolerance = tile_split ? 0x1p-7 : out == DType::BF16 ? 0x1p-8 : 1e-5;
        for (std::size_t r = 0; r < rows.size(); ++r) {
          if (with_inf) {
            EXPECT_EQ(call.o.load(0, rows[r], 0, 1), INFINITY) << "row " << rows[r];
          }
          const double want = ref_o[r * 64], got = call.o.load(0, rows[r], 0, 0);
          EXPECT_GT(want, 10.0);
          EXPECT_NEAR(got, want, want * tolerance) << "row " << rows[r];
        }
      }
    }
}

// A row's P V over thousands of keys: each key tile's products are summed on their
// own and then added to O, so the rounding errors grow with the keys of one tile
// and the number of tiles, not with all N keys in one chain. Measured (4,096
// tokens, D = 64, dense fp32, AVX2 and AVX-512): rel L2 3.7e-7 to 4.0e-7 against
// fp64; 1.15e-6 to 1.26e-6 with one chain.
TEST(CpuBackend, LongRowsKeepTheirFp32Accuracy) {
  const VideoGrid grid{16, 16, 16, 0, TextPlacement::After};  // 4,096 tokens
  const VideoLayout layout{grid, 1, 1, 64};
  for (Isa isa : testing::isas_of_this_machine()) {
    if (isa == Isa::Scalar) continue;  // the same code with one lane, and slow at this size
    SCOPED_TRACE(to_string(isa));
    auto problem = testing::make_problem(layout, DType::F32, {head_for(grid, MaskSpec::dense(), {128, 128},
                                                                       Alignment::Exact)}, testing::fresh_seed());
    make_cpu_backend({isa, 2})->run(problem.call());
    const auto cmp = testing::compare_with_reference(problem, 64, 1);
    EXPECT_TRUE(cmp.ok()) << cmp.failure;
    EXPECT_LT(cmp.rel_l2_err, 7e-7);
  }
}

TEST(CpuBackend, RowsWithNothingAllowedGiveZeroAndMinusInfinity) {
  const VideoGrid grid{3, 5, 7, 0, TextPlacement::After};
  const VideoLayout layout{grid, 1, 1, 64};
  for (Isa isa : testing::isas_of_this_machine()) {
    const MaskSpec none = mask_for_density(grid, SparseKind::Spatial, 0.0, /*anchor=*/false);
    auto problem = testing::make_problem(layout, DType::F32, {head_for(grid, none, {64, 64}, Alignment::Exact)},
                                         testing::fresh_seed());
    make_cpu_backend({isa, 2})->run(problem.call());
    const AttentionCall call = problem.call();
    for (std::int64_t n = 0; n < layout.tokens(); ++n) {
      if (call.heads[0].plan->computes(n, n)) continue;  // a band of width 0 still keeps the diagonal
      bool any = false;
      for (std::int64_t k = 0; k < layout.tokens(); ++k) any = any || call.heads[0].plan->computes(n, k);
      if (any) continue;
      EXPECT_EQ(call.lse.at(0, 0, n), -std::numeric_limits<float>::infinity()) << "row " << n;
      for (std::int64_t d = 0; d < 64; ++d) EXPECT_EQ(call.o.load(0, n, 0, d), 0.0f);
    }
    EXPECT_TRUE(testing::compare_with_reference(problem).ok());
  }
}

// A band of width 0: every row sees its own key only, so O = V exactly (P = 1),
// and every kept tile is a partial one on the diagonal, whose blocks of rows the
// kernels cut to the columns they allow: a span one column short, or one that
// starts a word late, changes O. Ragged tiles (231 tokens), two tile shapes.
TEST(CpuBackend, OwnKeyOnlyGivesVExactly) {
  const VideoGrid grid{3, 7, 11, 0, TextPlacement::After};
  const VideoLayout layout{grid, 1, 2, 64};
  const MaskSpec own_key = MaskSpec::spatial(0, /*anchor=*/false);
  for (Isa isa : testing::isas_of_this_machine())
    for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::F8E4M3})
      for (const TileShape tile : {TileShape{64, 64}, TileShape{128, 128}}) {
        SCOPED_TRACE(std::string(to_string(isa)) + " " + std::string(to_string(dtype)) + " tile " +
                     std::to_string(tile.q));
        // fp8 is no output type; its values are exact in bf16.
        const DType out = dtype == DType::F8E4M3 ? DType::BF16 : dtype;
        auto problem = testing::make_problem(layout, dtype, {head_for(grid, own_key, tile, Alignment::Exact),
                                                             head_for(grid, own_key, tile, Alignment::Exact)},
                                             testing::fresh_seed(), MemoryLayout::BNHD, out);
        make_cpu_backend({isa, 2})->run(problem.call());
        const AttentionCall call = problem.call();
        for (std::int64_t n = 0; n < layout.tokens(); ++n)
          for (std::int64_t h = 0; h < 2; ++h)
            for (std::int64_t d = 0; d < 64; ++d)
              ASSERT_EQ(call.o.load(0, n, h, d), call.v.load(0, n, h, d)) << "token " << n << " head " << h;
      }
}

TEST(CpuBackend, EmptyMaskGivesEmptyRowsEverywhere) {
  const VideoGrid grid{2, 3, 5, 0, TextPlacement::After};
  const VideoLayout layout{grid, 1, 1, 80};
  for (Isa isa : testing::isas_of_this_machine()) {
    const MaskSpec none = MaskSpec::spatial(-1, /*anchor=*/false);
    auto problem = testing::make_problem(layout, DType::F32, {head_for(grid, none, {64, 64}, Alignment::Exact)},
                                         testing::fresh_seed());
    make_cpu_backend({isa, 1})->run(problem.call());
    const AttentionCall call = problem.call();
    for (std::int64_t n = 0; n < layout.tokens(); ++n) {
      EXPECT_EQ(call.lse.at(0, 0, n), -std::numeric_limits<float>::infinity());
      for (std::int64_t d = 0; d < 80; ++d) EXPECT_EQ(call.o.load(0, n, 0, d), 0.0f);
    }
  }
}

TEST(CpuBackend, NonFiniteInputsReachOnlyRowsThatSeeThem) {
  // A band of 1: key 40 is allowed for rows 39..41 only, and sits inside a partial tile for others.
  const VideoGrid grid{4, 4, 5, 0, TextPlacement::After};  // 80 tokens
  const VideoLayout layout{grid, 1, 1, 64};
  // (bf16 or fp8 in, bf16 out: the AVX-512 kernel's P V from bf16 pairs, which such a head must not take.)
  const std::pair<DType, DType> dtypes[] = {{DType::F32, DType::F32},    {DType::BF16, DType::F32},
                                            {DType::BF16, DType::BF16},   {DType::F16, DType::F32},
                                            {DType::F8E4M3, DType::F32}, {DType::F8E4M3, DType::BF16}};
  for (Isa isa : testing::isas_of_this_machine())
    for (const auto& [dtype, out] : dtypes)
      for (int which : {1, 2}) {  // NaN in K, then Inf in V (NaN in fp8, which has no Inf)
        SCOPED_TRACE(std::string(to_string(isa)) + " " + std::string(to_string(dtype)) + " in, " +
                     std::string(to_string(out)) + " out" + (which == 1 ? ", NaN in K" : ", Inf in V"));
        const MaskSpec spec = MaskSpec::spatial(1, /*anchor=*/false);
        auto problem = testing::make_problem(layout, dtype, {head_for(grid, spec, {64, 64}, Alignment::Exact)},
                                             testing::fresh_seed(), MemoryLayout::BNHD, out);
        (which == 1 ? problem.k : problem.v).view().store(0, 40, 0, 3, which == 1 ? NAN : INFINITY);
        problem.o.poison_finite();  // rows expected NaN must be written NaN, not left so
        problem.lse.poison_finite();
        make_cpu_backend({isa, 2})->run(problem.call());
        const AttentionCall call = problem.call();
        for (std::int64_t n = 0; n < layout.tokens(); ++n) {
          const bool touches = n >= 39 && n <= 41;
          EXPECT_EQ(std::isfinite(call.o.load(0, n, 0, 3)), !touches) << "row " << n;
        }
        const auto cmp = testing::compare_with_reference(problem);
        EXPECT_TRUE(cmp.ok()) << cmp.failure;
      }
}

// attention.hpp's rules for infinite scores, with the values worked out here: a
// row whose allowed keys all score -inf is a row without keys (O = 0, LSE =
// -inf); one -inf key among finite ones has weight 0; a +inf score, or inf x 0,
// makes the row NaN. Dense mask, channel 0 of q and k decides every score.
TEST(CpuBackend, InfiniteScoresFollowTheirRules) {
  const VideoGrid grid{3, 4, 5, 2, TextPlacement::After};  // 62 tokens
  const VideoLayout layout{grid, 1, 1, 64};
  const std::int64_t n = layout.tokens();
  for (Isa isa : testing::isas_of_this_machine())
    for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(std::string(to_string(isa)) + " " + std::string(to_string(dtype)));
      auto problem = testing::make_problem(
          layout, dtype, {head_for(grid, MaskSpec::dense(), {64, 64}, Alignment::Exact)}, testing::fresh_seed());
      AttentionCall call = problem.call();
      // Every key's k0 = -inf. Row 0: q0 = 1, every score -inf. Row 1: q0 = -1, every score +inf.
      // Rows 2..: q0 = 0, every score 0 x -inf = NaN.
      for (std::int64_t j = 0; j < n; ++j) call.k.store(0, j, 0, 0, -INFINITY);
      call.q.store(0, 0, 0, 0, 1.0f);
      call.q.store(0, 1, 0, 0, -1.0f);
      for (std::int64_t i = 2; i < n; ++i) call.q.store(0, i, 0, 0, 0.0f);
      problem.o.poison_finite();  // rows expected NaN must be written NaN, not left so
      problem.lse.poison_finite();
      make_cpu_backend({isa, 2})->run(call);
      EXPECT_EQ(call.lse.at(0, 0, 0), -INFINITY);
      for (std::int64_t d = 0; d < 64; ++d) EXPECT_EQ(call.o.load(0, 0, 0, d), 0.0f) << "channel " << d;
      for (std::int64_t i = 1; i < n; ++i) {
        EXPECT_TRUE(std::isnan(call.lse.at(0, 0, i))) << "row " << i;
        EXPECT_TRUE(std::isnan(call.o.load(0, i, 0, 5))) << "row " << i;
      }
      EXPECT_TRUE(testing::compare_with_reference(problem).ok());

      // One key (9) scoring -inf among finite ones: the rows equal the same call with that key masked out.
      auto one = testing::make_problem(
          layout, dtype, {head_for(grid, MaskSpec::dense(), {64, 64}, Alignment::Exact)}, testing::fresh_seed());
      AttentionCall one_call = one.call();
      for (std::int64_t i = 0; i < n; ++i) one_call.q.store(0, i, 0, 0, 0.5f + std::abs(one_call.q.load(0, i, 0, 0)));
      one_call.k.store(0, 9, 0, 0, -INFINITY);
      make_cpu_backend({isa, 2})->run(one_call);
      std::vector<double> ref_o, ref_lse;
      const std::vector<std::int64_t> rows{0, 9, 40, n - 1};
      reference_rows(one_call, rows, ref_o, ref_lse, [](std::int64_t, std::int64_t, std::int64_t k) { return k != 9; });
      for (std::size_t r = 0; r < rows.size(); ++r) {
        EXPECT_NEAR(one_call.lse.at(0, 0, rows[r]), ref_lse[r], 1e-5 * (1 + std::abs(ref_lse[r]))) << "row " << rows[r];
        for (std::int64_t d = 0; d < 64; ++d) {
          const double want = ref_o[r * 64 + std::size_t(d)];
          const double rounding = dtype == DType::F32 ? 0.0 : unit_roundoff(dtype);
          EXPECT_NEAR(one_call.o.load(0, rows[r], 0, d), want, 1e-5 + rounding * std::abs(want))
              << "row " << rows[r] << " channel " << d;
        }
      }
      EXPECT_TRUE(testing::compare_with_reference(one).ok());

      // A row whose q0 = +inf against k0 = -1 for every key: every score -inf, a
      // row without keys. (Split into bf16 parts, fp16's +inf x the 0 low part of
      // -1 would be NaN: the AMX kernel must sum such scores from whole values.)
      auto inf_q = testing::make_problem(
          layout, dtype, {head_for(grid, MaskSpec::dense(), {64, 64}, Alignment::Exact)}, testing::fresh_seed());
      AttentionCall inf_q_call = inf_q.call();
      for (std::int64_t j = 0; j < n; ++j) inf_q_call.k.store(0, j, 0, 0, -1.0f);
      inf_q_call.q.store(0, 7, 0, 0, INFINITY);
      make_cpu_backend({isa, 2})->run(inf_q_call);
      EXPECT_EQ(inf_q_call.lse.at(0, 0, 7), -INFINITY);
      for (std::int64_t d = 0; d < 64; ++d) EXPECT_EQ(inf_q_call.o.load(0, 7, 0, d), 0.0f) << "channel " << d;
      EXPECT_TRUE(testing::compare_with_reference(inf_q).ok());
    }
}

// Scores of +-(2.6-3.1)e38 with a softmax scale of 1 (testing::plant_scores_at_the_float_limit):
// finite after the scale, infinite once times log2 e, so a probability must come from (s - max)
// first. Each planted row's O is the mean of V over its highest-scoring keys (exact ties), its LSE
// finite. The four mask kinds give partial tiles, ragged tiles and masked keys.
TEST(CpuBackend, ScoresAtTheFloatLimitKeepFiniteRows) {
  const VideoGrid grid{3, 5, 7, 11, TextPlacement::After};  // 116 tokens
  const VideoLayout layout{grid, 1, 4, 64};
  for (Isa isa : testing::isas_of_this_machine())
    for (DType dtype : {DType::F32, DType::BF16}) {
      auto problem = testing::make_problem(layout, dtype, four_heads(grid, 0.3, true, {64, 64}, Alignment::Exact),
                                           testing::fresh_seed());
      testing::plant_scores_at_the_float_limit(problem, testing::fresh_seed());
      SCOPED_TRACE(problem.label + " isa " + std::string(to_string(isa)));
      make_cpu_backend({isa, 2})->run(problem.call());
      const auto cmp = testing::compare_with_reference(problem);
      EXPECT_TRUE(cmp.ok()) << cmp.failure;
      const testing::FloatLimitErrors planted = testing::float_limit_errors(problem);
      EXPECT_LT(planted.o_max_abs, 1e-5) << planted.rows << " planted rows";
      EXPECT_LT(planted.lse_max_rel, 1e-6) << planted.rows << " planted rows";
      // The regime: row 1's max score (its LSE, give or take a log of ties) x log2 e is past FLT_MAX.
      EXPECT_GT(std::abs(double(problem.call().lse.at(0, 0, 1))) * std::log2(std::exp(1.0)),
                double(std::numeric_limits<float>::max()));
    }
}

TEST(CpuBackend, SkippedHeadsAreLeftUntouched) {
  const VideoGrid grid{2, 4, 4, 3, TextPlacement::Before};
  const VideoLayout layout{grid, 1, 2, 64};
  auto heads = std::vector<HeadMask>{head_for(grid, MaskSpec::spatial(5), {64, 64}, Alignment::Exact),
                                     head_for(grid, MaskSpec::dense(), {64, 64}, Alignment::Exact)};
  heads[1].compute = false;
  auto problem = testing::make_problem(layout, DType::F32, heads, testing::fresh_seed());
  make_cpu_backend()->run(problem.call());
  const AttentionCall call = problem.call();
  for (std::int64_t n = 0; n < layout.tokens(); ++n) {
    EXPECT_TRUE(std::isnan(call.o.load(0, n, 1, 0)));
    EXPECT_TRUE(std::isnan(call.lse.at(0, 1, n)));
    EXPECT_FALSE(std::isnan(call.o.load(0, n, 0, 0)));
  }
  EXPECT_TRUE(testing::compare_with_reference(problem).ok());
}

TEST(CpuBackend, LseIsOptionalAndScaleIsHonoured) {
  const VideoGrid grid{3, 4, 6, 0, TextPlacement::After};
  const VideoLayout layout{grid, 1, 1, 96};
  for (float scale : {0.3f, -0.2f}) {
    auto problem =
        testing::make_problem(layout, DType::BF16, {head_for(grid, MaskSpec::spatial(20), {64, 64}, Alignment::Exact)},
                              testing::fresh_seed(), MemoryLayout::BHND, DType::F32);
    AttentionCall call = problem.call();
    call.softmax_scale = scale;
    make_cpu_backend()->run(call);
    std::vector<double> ref_o, ref_lse;
    std::vector<std::int64_t> rows;
    for (std::int64_t n = 0; n < layout.tokens(); ++n) rows.push_back(n);
    reference_rows(call, rows, ref_o, ref_lse);
    for (std::int64_t n = 0; n < layout.tokens(); ++n) {
      EXPECT_NEAR(call.lse.at(0, 0, n), ref_lse[std::size_t(n)],
                  1e-5 * std::max(1.0, std::abs(ref_lse[std::size_t(n)])));
      for (std::int64_t d = 0; d < 96; ++d)
        EXPECT_NEAR(call.o.load(0, n, 0, d), ref_o[std::size_t(n * 96 + d)], 1e-5) << n << "," << d;
    }
    // Without LSE the output is the same.
    std::vector<float> with_lse;
    for (std::int64_t n = 0; n < layout.tokens(); ++n) with_lse.push_back(call.o.load(0, n, 0, 5));
    call.lse = {};
    problem.o.poison();
    make_cpu_backend()->run(call);
    for (std::int64_t n = 0; n < layout.tokens(); ++n) EXPECT_EQ(call.o.load(0, n, 0, 5), with_lse[std::size_t(n)]);
  }
}

TEST(CpuBackend, AnyStridesGiveTheSameBits) {
  // Channels two apart and padded token rows, for inputs and output: the packed
  // panels are the same, so the output must be too.
  const VideoGrid grid{3, 4, 5, 6, TextPlacement::After};
  const VideoLayout layout{grid, 2, 2, 64};
  const MaskSpec spec = mask_for_density(grid, SparseKind::Spatial, 0.3);
  auto problem = testing::make_problem(
      layout, DType::BF16,
      {head_for(grid, spec, {64, 64}, Alignment::Exact), head_for(grid, spec, {64, 64}, Alignment::Exact)},
      testing::fresh_seed());
  const auto backend = make_cpu_backend({Isa::Auto, 2});
  backend->run(problem.call());

  const std::int64_t n = layout.tokens(), h = layout.heads, d = layout.head_dim;
  const std::array<std::int64_t, 4> stride{n * (h * d * 2 + 8), h * d * 2 + 8, d * 2, 2};
  auto strided = [&](DType dtype, std::vector<std::byte>& storage) {
    storage.assign(std::size_t(stride[0] * layout.batch) * element_size(dtype), std::byte{0});
    TensorView t;
    t.data = storage.data();
    t.dtype = dtype;
    t.shape = {layout.batch, n, h, d};
    t.stride = stride;
    return t;
  };
  std::vector<std::byte> qs, ks, vs, os;
  AttentionCall call = problem.call();
  call.q = strided(DType::BF16, qs);
  call.k = strided(DType::BF16, ks);
  call.v = strided(DType::BF16, vs);
  call.o = strided(DType::F32, os);
  LseBuffer lse(layout.batch, h, n);
  call.lse = lse.view();
  const AttentionCall contiguous = problem.call();
  for (std::int64_t b = 0; b < layout.batch; ++b)
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < h; ++j)
        for (std::int64_t c = 0; c < d; ++c) {
          call.q.store(b, i, j, c, contiguous.q.load(b, i, j, c));
          call.k.store(b, i, j, c, contiguous.k.load(b, i, j, c));
          call.v.store(b, i, j, c, contiguous.v.load(b, i, j, c));
        }
  backend->run(call);
  for (std::int64_t b = 0; b < layout.batch; ++b)
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < h; ++j) {
        ASSERT_EQ(call.lse.at(b, j, i), contiguous.lse.at(b, j, i));
        for (std::int64_t c = 0; c < d; ++c) ASSERT_EQ(call.o.load(b, i, j, c), contiguous.o.load(b, i, j, c));
      }
}

TEST(CpuBackend, RejectsWhatItCannotRun) {
  const VideoGrid grid{2, 3, 3, 0, TextPlacement::After};
  for (std::int64_t dims : {129, 256}) {  // up to 128 runs, padded where no kernel is built for it
    const VideoLayout layout{grid, 1, 1, dims};
    auto problem =
        testing::make_problem(layout, DType::F32, {head_for(grid, MaskSpec::dense(), {64, 64}, Alignment::Exact)}, 1);
    const auto backend = make_cpu_backend();
    const Support s = backend->supports(problem.call());
    EXPECT_FALSE(s.ok);
    EXPECT_NE(s.why.find("head dim"), std::string::npos) << s.why;
    EXPECT_THROW(backend->run(problem.call()), Unsupported);
  }
  // A plan built for the other token order is a caller error.
  const VideoLayout layout{grid, 1, 1, 64};
  const MaskSpec temporal = MaskSpec::temporal(3);
  HeadMask wrong{temporal, TokenOrder::FrameMajor, TilePlan::build(grid, temporal, {64, 64}), true};
  auto problem = testing::make_problem(layout, DType::F32, {wrong}, 1);
  EXPECT_THROW(make_cpu_backend()->run(problem.call()), InvalidArgument);
  // No plan at all.
  problem.heads[0] = HeadMask{MaskSpec::dense(), TokenOrder::FrameMajor, nullptr, true};
  EXPECT_THROW(make_cpu_backend()->run(problem.call()), InvalidArgument);
  EXPECT_THROW(make_cpu_backend({Isa::Auto, -1}), InvalidArgument);
}

TEST(CpuBackend, InstructionSetChoice) {
  EXPECT_EQ(parse_isa("avx2"), Isa::Avx2);
  EXPECT_EQ(parse_isa("auto"), Isa::Auto);
  EXPECT_THROW(parse_isa("sse"), InvalidArgument);
  EXPECT_EQ(to_string(Isa::Avx512), "avx512");
  EXPECT_EQ(parse_isa("amx"), Isa::Amx);
  EXPECT_EQ(to_string(Isa::Amx), "amx");
  const char* saved = std::getenv("STSA_ISA");
  const std::string saved_value = saved ? saved : "";
  ::setenv("STSA_ISA", "scalar", 1);
  EXPECT_EQ(best_isa(), Isa::Scalar);
  ::setenv("STSA_ISA", "avx512", 1);
  EXPECT_EQ(best_isa(), std::min(Isa::Avx512, cpu::machine_best_isa()));  // a cap, never above the machine
  ::setenv("STSA_ISA", "amx", 1);
  EXPECT_EQ(best_isa(), cpu::machine_best_isa());
  if (!cpu::machine_supports(Isa::Avx512)) {
    const VideoGrid grid{1, 2, 2, 0, TextPlacement::After};
    auto problem = testing::make_problem({grid, 1, 1, 64}, DType::F32,
                                         {head_for(grid, MaskSpec::dense(), {64, 64}, Alignment::Exact)}, 1);
    EXPECT_THROW(make_cpu_backend()->run(problem.call()), Unsupported);
    EXPECT_THROW(make_cpu_backend({Isa::Avx512, 1})->run(problem.call()), Unsupported);
  }
  ::setenv("STSA_ISA", "bogus", 1);
  EXPECT_THROW(best_isa(), InvalidArgument);
  if (saved)
    ::setenv("STSA_ISA", saved_value.c_str(), 1);
  else
    ::unsetenv("STSA_ISA");
}

// A peak measurement where its units exist: positive, and the thread count and time checked
// ([0, 4096] threads as every other entry point: INT_MAX once ended in bad_alloc).
void expect_peak_measured(double (*measure)(int threads, double seconds)) {
  EXPECT_GT(measure(1, 0.02), 0.1);
  EXPECT_THROW(measure(-1, 0.1), InvalidArgument);
  EXPECT_THROW(measure(1, 0.0), InvalidArgument);
  for (const int threads : {4097, std::numeric_limits<int>::max()})
    EXPECT_THROW(measure(threads, 0.02), InvalidArgument) << threads;
}

TEST(CpuBackend, FmaPeakIsPositive) { expect_peak_measured(measure_fma_peak_gflops); }

TEST(CpuBackend, Bf16DotPeakIsPositiveWhereThereIsAvx512Bf16) {
  if (!cpu::machine_supports(Isa::Avx512)) {
    EXPECT_THROW(measure_bf16_dot_peak_gflops(1, 0.02), Unsupported);
    GTEST_SKIP() << "no AVX-512 with BF16 here";
  }
  expect_peak_measured(measure_bf16_dot_peak_gflops);
}

TEST(CpuBackend, AmxPeakIsPositiveWhereThereIsAmx) {
  if (!cpu::machine_supports(Isa::Amx)) {
    EXPECT_THROW(measure_amx_peak_gflops(1, 0.02), Unsupported);
    GTEST_SKIP() << "no AMX here";
  }
  expect_peak_measured(measure_amx_peak_gflops);
}

// Which calls the tile products take: Q, K and V all bf16 or all fp16, any head
// dim up to 128 (64, 96 and 128 as they are, the others padded to the next of
// them), and only under Amx; the others run the AVX-512 kernel.
TEST(CpuBackend, AmxRunsBf16AndF16CallsWithHeadDimsUpTo128) {
  const VideoGrid grid{1, 2, 2, 0, TextPlacement::After};
  auto call_of = [&](std::int64_t head_dim, DType q, DType k, DType v) {
    AttentionCall call;
    call.layout = {grid, 1, 1, head_dim};
    call.q.dtype = q;
    call.k.dtype = k;
    call.v.dtype = v;
    return call;
  };
  const DType bf16 = DType::BF16;
  for (std::int64_t d : {1, 32, 59, 64, 72, 80, 96, 127, 128})
    EXPECT_EQ(kernel_isa(Isa::Amx, call_of(d, bf16, bf16, bf16)), Isa::Amx) << d;
  EXPECT_EQ(kernel_isa(Isa::Amx, call_of(129, bf16, bf16, bf16)), Isa::Avx512);  // which refuses it
  const DType f16 = DType::F16;
  for (std::int64_t d : {1, 64, 80, 96, 128}) EXPECT_EQ(kernel_isa(Isa::Amx, call_of(d, f16, f16, f16)), Isa::Amx) << d;
  EXPECT_EQ(kernel_isa(Isa::Amx, call_of(128, f16, bf16, bf16)), Isa::Avx512);  // one split for all three
  EXPECT_EQ(kernel_isa(Isa::Amx, call_of(128, bf16, bf16, f16)), Isa::Avx512);
  EXPECT_EQ(kernel_isa(Isa::Amx, call_of(128, f16, f16, DType::F32)), Isa::Avx512);
  EXPECT_EQ(kernel_isa(Isa::Amx, call_of(128, bf16, bf16, DType::F32)), Isa::Avx512);  // V must be exact in bf16
  EXPECT_EQ(kernel_isa(Isa::Amx, call_of(128, DType::F32, bf16, bf16)), Isa::Avx512);
  EXPECT_EQ(kernel_isa(Isa::Avx512, call_of(128, bf16, bf16, bf16)), Isa::Avx512);
}

// The units whose peak bounds a call (what `stsa bench` reports a share of): VDPBF16PS where
// the AVX-512 kernel takes both products from bf16 pairs (bf16 or fp8 in, bf16 out), the
// tile unit where the AMX kernel runs, else FMAs (bf16 in, fp32 out: P V in fp32).
TEST(CpuBackend, KernelProductUnitsNameTheUnitsBothProductsRunOn) {
  auto call_of = [](DType in, DType out) {
    AttentionCall call;
    call.layout = {{1, 2, 2, 0, TextPlacement::After}, 1, 1, 128};
    call.q.dtype = call.k.dtype = call.v.dtype = in;
    call.o.dtype = out;
    return call;
  };
  const DType bf16 = DType::BF16, fp8 = DType::F8E4M3, f16 = DType::F16, f32 = DType::F32;
  EXPECT_EQ(kernel_product_units(Isa::Avx512, call_of(bf16, bf16)), ProductUnits::Bf16Dot);
  EXPECT_EQ(kernel_product_units(Isa::Avx512, call_of(fp8, bf16)), ProductUnits::Bf16Dot);
  EXPECT_EQ(kernel_product_units(Isa::Avx512, call_of(bf16, f32)), ProductUnits::Fma);
  EXPECT_EQ(kernel_product_units(Isa::Avx512, call_of(bf16, f16)), ProductUnits::Fma);
  EXPECT_EQ(kernel_product_units(Isa::Avx512, call_of(f16, f16)), ProductUnits::Fma);
  EXPECT_EQ(kernel_product_units(Isa::Avx512, call_of(f32, f32)), ProductUnits::Fma);
  EXPECT_EQ(kernel_product_units(Isa::Avx2, call_of(bf16, bf16)), ProductUnits::Fma);
  EXPECT_EQ(kernel_product_units(Isa::Scalar, call_of(bf16, bf16)), ProductUnits::Fma);
  EXPECT_EQ(kernel_product_units(Isa::Amx, call_of(bf16, bf16)), ProductUnits::AmxTiles);
  EXPECT_EQ(kernel_product_units(Isa::Amx, call_of(fp8, f32)), ProductUnits::AmxTiles);
  EXPECT_EQ(kernel_product_units(Isa::Amx, call_of(f32, f32)), ProductUnits::Fma);  // the AVX-512 kernel's
  AttentionCall mixed = call_of(bf16, bf16);
  mixed.v.dtype = f32;  // not AMX's; the AVX-512 kernel's P V in fp32
  EXPECT_EQ(kernel_product_units(Isa::Amx, mixed), ProductUnits::Fma);
  EXPECT_THROW(kernel_product_units(Isa::Auto, call_of(bf16, bf16)), InvalidArgument);
  EXPECT_EQ(to_string(ProductUnits::Fma), "fma");
  EXPECT_EQ(to_string(ProductUnits::Bf16Dot), "bf16_dot");
  EXPECT_EQ(to_string(ProductUnits::AmxTiles), "amx");
}

// kernel_isa and kernel_head_dim answer for a resolved instruction set (Auto once
// came back as Auto, and the head dim as the scalar kernel's).
TEST(CpuBackend, KernelQueriesRefuseAnUnresolvedIsa) {
  AttentionCall call;
  call.layout = {{1, 2, 2, 0, TextPlacement::After}, 1, 1, 72};
  call.q.dtype = call.k.dtype = call.v.dtype = DType::BF16;
  for (const Isa isa : {Isa::Auto, Isa(9)}) {
    EXPECT_THROW(kernel_isa(isa, call), InvalidArgument) << int(isa);
    EXPECT_THROW(kernel_head_dim(isa, call), InvalidArgument) << int(isa);
  }
  try {
    kernel_isa(Isa::Auto, call);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("must be resolved (resolve_isa), got auto"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kernel_isa(Isa::Avx2, call), Isa::Avx2);
  EXPECT_EQ(kernel_head_dim(resolve_isa(Isa::Auto), call) > 0, true);
}

// The head dim each kernel computes a call at: its own where a kernel is built
// for it, else the next one (AMX: 64, 96, 128; the SIMD kernels: 64, 80, 96, 128).
TEST(CpuBackend, KernelHeadDimIsTheNextTheKernelIsBuiltFor) {
  const VideoGrid grid{1, 2, 2, 0, TextPlacement::After};
  auto call_of = [&](std::int64_t head_dim, DType dtype) {
    AttentionCall call;
    call.layout = {grid, 1, 1, head_dim};
    call.q.dtype = call.k.dtype = call.v.dtype = dtype;
    return call;
  };
  struct Expected {
    Isa isa;
    DType dtype;
    std::int64_t head_dim, kernel_dim;
  };
  for (const Expected e : {Expected{Isa::Amx, DType::BF16, 1, 64}, Expected{Isa::Amx, DType::BF16, 72, 96},
                           Expected{Isa::Amx, DType::F16, 80, 96}, Expected{Isa::Amx, DType::F8E4M3, 96, 96},
                           Expected{Isa::Amx, DType::BF16, 128, 128}, Expected{Isa::Amx, DType::F32, 72, 80},
                           Expected{Isa::Avx512, DType::BF16, 72, 80}, Expected{Isa::Avx512, DType::F32, 59, 64},
                           Expected{Isa::Avx2, DType::F32, 81, 96}, Expected{Isa::Scalar, DType::F16, 127, 128},
                           Expected{Isa::Avx512, DType::F32, 129, 0}, Expected{Isa::Amx, DType::BF16, 129, 0}})
    EXPECT_EQ(kernel_head_dim(e.isa, call_of(e.head_dim, e.dtype)), e.kernel_dim)
        << to_string(e.isa) << " " << to_string(e.dtype) << " D=" << e.head_dim;
}

// The tile kernel on its own: bf16 and fp16 in (fp16 as two bf16 parts), every
// head dim it takes, row counts that are not multiples of its 16-row tiles or
// 32-row blocks (query tiles of 1, 17, 40, 48 and 100 rows, ragged last tiles: the
// padded rows must fit the buffers), one and two batch entries, negative scales,
// fp32 out so the bound is the fp32 kernel's, and 16-bit out.
TEST(CpuBackend, AmxTileKernelMatchesReferenceOnBf16AndF16Inputs) {
  if (!cpu::machine_supports(Isa::Amx)) GTEST_SKIP() << "no AMX here";
  const TileShape tiles[] = {{64, 64}, {128, 128}, {48, 64}, {128, 64}, {17, 64}, {40, 128}, {100, 64}, {1, 64}};
  int index = 0;
  for (const DType in : {DType::BF16, DType::F16})
    for (const VideoGrid& grid : awkward_grids())
      for (std::int64_t head_dim : {64, 96, 128})
        for (double density : {0.02, 0.25, 1.0}) {
          Case c;
          c.grid = grid;
          c.head_dim = head_dim;
          c.density = density;
          c.in = in;
          c.out = index % 3 == 2 ? (index % 2 ? DType::BF16 : DType::F16) : DType::F32;
          c.tile = tiles[index % 8];
          c.anchor = index % 2 == 0;
          c.align = index % 5 == 3 ? Alignment::Round : Alignment::Exact;
          c.memory = index % 2 ? MemoryLayout::BHND : MemoryLayout::BNHD;
          c.batch = index % 5 == 1 ? 2 : 1;
          const float scale = index % 7 == 3 ? -0.07f : 0.f;
          ++index;
          const VideoLayout layout{c.grid, c.batch, 4, c.head_dim};
          SCOPED_TRACE(describe(c, Isa::Amx));
          auto problem = testing::make_problem(layout, c.in, four_heads(c.grid, c.density, c.anchor, c.tile, c.align),
                                               testing::fresh_seed(), c.memory, c.out);
          problem.softmax_scale = scale;
          ASSERT_EQ(kernel_isa(Isa::Amx, problem.call()), Isa::Amx);
          make_cpu_backend({Isa::Amx, 2})->run(problem.call());
          const PairPredicate computes = c.align == Alignment::Round ? plan_predicate(problem.heads) : PairPredicate{};
          const auto cmp = testing::compare_with_reference(problem, testing::kMatrixRows, testing::fresh_seed(),
                                                           computes);
          EXPECT_TRUE(cmp.ok()) << cmp.failure;
          if (c.out == DType::F32) {
            EXPECT_LT(cmp.rel_l2_err, 1e-5) << problem.label;
          }
        }
}

// The packed K/V panels are kept across calls, so the padding slots of a shorter
// call's last key tile are where an earlier call's keys were. The AMX kernel
// multiplies every slot (with P = 0 past the sequence end), so a stale NaN left
// in one would reach the output as 0 x NaN: the packing must zero the padding.
// First call: two full 128-key tiles of NaN K and V; second: 200 finite tokens,
// 56 padding slots in its last tile, on the same backend.
TEST(CpuBackend, AmxPaddingSlotsHoldNothingFromAnEarlierCall) {
  if (!cpu::machine_supports(Isa::Amx)) GTEST_SKIP() << "no AMX here";
  for (const DType dtype : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(to_string(dtype));
    const auto backend = make_cpu_backend({Isa::Amx, 2});
    const TileShape tile{128, 128};
    const VideoGrid poisoned_grid{2, 8, 16, 0, TextPlacement::After};  // 256 tokens
    const VideoGrid grid{1, 10, 20, 0, TextPlacement::After};           // 200 tokens
    auto poisoned = testing::make_problem({poisoned_grid, 1, 1, 128}, dtype,
                                          {head_for(poisoned_grid, MaskSpec::dense(), tile, Alignment::Exact)},
                                          testing::fresh_seed());
    for (std::int64_t n = 0; n < poisoned_grid.tokens(); ++n)
      for (std::int64_t d = 0; d < 128; ++d) {
        poisoned.k.view().store(0, n, 0, d, NAN);
        poisoned.v.view().store(0, n, 0, d, NAN);
      }
    backend->run(poisoned.call());
    for (const bool sparse : {false, true}) {
      const MaskSpec spec = sparse ? mask_for_density(grid, SparseKind::Spatial, 0.5, true) : MaskSpec::dense();
      auto problem = testing::make_problem({grid, 1, 1, 128}, dtype, {head_for(grid, spec, tile, Alignment::Exact)},
                                           testing::fresh_seed());
      SCOPED_TRACE(problem.label);
      ASSERT_EQ(kernel_isa(Isa::Amx, problem.call()), Isa::Amx);
      backend->run(problem.call());
      const auto cmp = testing::compare_with_reference(problem, 0, 1);
      EXPECT_TRUE(cmp.ok()) << cmp.failure;
      EXPECT_LT(cmp.rel_l2_err, 1e-5);
    }
  }
}

// One call run twice, on a kernel under test and on one that takes P V in fp32,
// and the head's scale each tested element is held to: one unit in the last place
// of the head's largest fp32-P output (no element's unit is larger; a bound of
// 2^-8 x largest was below it, and failed on CI). The AVX-512 kernel takes P in
// fp32 but for bf16 or fp8 in and bf16 out (there it rounds P too): AVX2's is the fp32-P one then.
struct AgainstFp32P {
  testing::Problem tested, fp32p;
  std::vector<double> last_place;  // per head
};
AgainstFp32P run_against_fp32p(Isa isa, const VideoLayout& layout, DType in, DType out,
                               const std::vector<HeadMask>& heads) {
  const std::uint64_t seed = testing::fresh_seed();
  AgainstFp32P runs{testing::make_problem(layout, in, heads, seed, MemoryLayout::BNHD, out),
                    testing::make_problem(layout, in, heads, seed, MemoryLayout::BNHD, out),
                    {}};
  EXPECT_EQ(kernel_isa(isa, runs.tested.call()), isa);
  make_cpu_backend({isa, 2})->run(runs.tested.call());
  const bool avx512_rounds_p = (in == DType::BF16 || in == DType::F8E4M3) && out == DType::BF16;
  make_cpu_backend({avx512_rounds_p ? Isa::Avx2 : Isa::Avx512, 2})->run(runs.fp32p.call());
  const int stored_fraction_bits = out == DType::BF16 ? 7 : 10;
  for (std::int64_t h = 0; h < layout.heads; ++h) {
    double largest = 0;
    for (std::int64_t n = 0; n < layout.tokens(); ++n)
      for (std::int64_t d = 0; d < layout.head_dim; ++d)
        largest = std::max(largest, std::abs(double(runs.fp32p.o.view().load(0, n, h, d))));
    runs.last_place.push_back(std::ldexp(1.0, std::ilogb(largest) - stored_fraction_bits));
  }
  return runs;
}

// With an fp16 output, or fp16 inputs and a bf16 output, the AMX kernel splits P
// in two parts, within 2^-16 of P: 32x (128x) below the output's own rounding,
// so its output is the fp32-P kernel's (AVX-512, P V in fp32) but for the few
// elements within that much of a rounding boundary. fp16 inputs add the product
// of P's and V's low parts left out (below 2^-16 of a term). Measured on an AMX
// host (260 tokens, D = 64 and 128): bf16 in, fp16 out: 2.4% of the elements
// differ (38% with P in one part, which this test is there to keep out); fp16 in:
// 0.6% (bf16 out), 3.2% (fp16 out). (bf16 in and out, when it had two parts:
// 0.4%; with three, 0.02%: the sums' order alone.)
TEST(CpuBackend, AmxSixteenBitOutputIsTheFp32PKernelsButForFewRoundings) {
  if (!cpu::machine_supports(Isa::Amx)) GTEST_SKIP() << "no AMX here";
  const VideoGrid grid{4, 6, 10, 20, TextPlacement::After};  // 260 tokens
  for (const DType in : {DType::BF16, DType::F16})
    for (const DType out : {DType::BF16, DType::F16})
      for (std::int64_t head_dim : {64, 128}) {
        if (in == DType::BF16 && out == DType::BF16) continue;  // P in one part: the next test
        // fp16's units are 8x finer, so more values lie within 2^-16 of a boundary.
        const double share = out == DType::BF16 ? 0.02 : 0.08;
        const VideoLayout layout{grid, 1, 4, head_dim};
        const auto runs = run_against_fp32p(Isa::Amx, layout, in, out, four_heads(grid, 0.25, true, {128, 128}, Alignment::Exact));
        SCOPED_TRACE(runs.tested.label);
        std::int64_t differ = 0, total = 0;
        for (std::int64_t h = 0; h < layout.heads; ++h)
          for (std::int64_t n = 0; n < grid.tokens(); ++n)
            for (std::int64_t d = 0; d < head_dim; ++d) {
              const float got = runs.tested.o.view().load(0, n, h, d), want = runs.fp32p.o.view().load(0, n, h, d);
              differ += got != want;
              ++total;
              // Never more than one unit of the output's precision at the head's scale apart.
              ASSERT_LE(std::abs(double(got) - double(want)), runs.last_place[std::size_t(h)])
                  << "head " << h << ", token " << n << ", channel " << d;
            }
        EXPECT_LT(double(differ), share * double(total)) << differ << " of " << total << " elements differ";
      }
}

// bf16 in and out: P rounded to nearest bf16 (the AMX kernel's one part; the
// AVX-512 kernel's pairs of keys for VDPBF16PS), as bf16 FlashAttention kernels and
// PyTorch's CPU attention do. Against an fp32-P kernel: no element more than two
// units apart at the head's scale, the differences unbiased (a truncated P would
// shrink every output by ~2^-10 of itself), and the error against the fp64
// reference no more than rounding P makes it. Measured on the AMX kernel (500
// tokens, D = 64 and 128): the outputs lean by under 3e-5 of themselves, and the
// error is 1.31x the fp32-P kernel's (rel L2 2.17e-3 against 1.66e-3, which is
// bf16's rounding of the output alone); with P truncated instead: -2.0e-3 and 1.96x.
void expect_p_rounded_unbiased(Isa isa, DType in, std::initializer_list<std::int64_t> head_dims) {
  const VideoGrid grid{5, 8, 12, 20, TextPlacement::After};  // 500 tokens
  for (std::int64_t head_dim : head_dims) {
    const VideoLayout layout{grid, 1, 4, head_dim};
    const auto runs = run_against_fp32p(isa, layout, in, DType::BF16,
                                        four_heads(grid, 0.5, true, {128, 128}, Alignment::Exact));
    SCOPED_TRACE(runs.tested.label);
    EXPECT_EQ(kernel_product_units(isa, runs.tested.call()),
              isa == Isa::Amx ? ProductUnits::AmxTiles : ProductUnits::Bf16Dot);
    double along = 0, norm = 0;
    std::int64_t differ = 0, total = 0;
    for (std::int64_t h = 0; h < layout.heads; ++h)
      for (std::int64_t n = 0; n < grid.tokens(); ++n)
        for (std::int64_t d = 0; d < head_dim; ++d) {
          const double got = runs.tested.o.view().load(0, n, h, d), want = runs.fp32p.o.view().load(0, n, h, d);
          // (Measured: one unit at most in 60 runs; two leave room for a rare row.)
          ASSERT_LE(std::abs(got - want), 2 * runs.last_place[std::size_t(h)])
              << "head " << h << ", token " << n << ", channel " << d;
          along += (got - want) * want;
          norm += want * want;
          differ += got != want;
          ++total;
        }
    const auto tested_error = testing::compare_with_reference(runs.tested, 0, 1);
    const auto fp32p_error = testing::compare_with_reference(runs.fp32p, 0, 1);
    EXPECT_TRUE(tested_error.ok()) << tested_error.failure;
    EXPECT_LT(std::abs(along / norm), 2e-4) << "the output leans off the fp32-P kernel's by this share of it";
    EXPECT_LT(tested_error.rel_l2_err, 1.5 * fp32p_error.rel_l2_err);
    // Rounded P moves ~38% of the elements by a unit (measured, AVX-512); the sums' order alone, 0.01%.
    EXPECT_GT(double(differ), 0.1 * double(total)) << "P was not rounded: the bf16 P V path did not run";
  }
}

TEST(CpuBackend, AmxBf16OutputRoundsPToBf16Unbiased) {
  if (!cpu::machine_supports(Isa::Amx)) GTEST_SKIP() << "no AMX here";
  expect_p_rounded_unbiased(Isa::Amx, DType::BF16, {64, 128});
}

TEST(CpuBackend, Avx512Bf16OutputRoundsPToBf16Unbiased) {
  if (!cpu::machine_supports(Isa::Avx512)) GTEST_SKIP() << "no AVX-512 (with BF16) here";
  // (Three calls, not six: each one runs the fp64 reference on every row twice, 15 s under ASan.)
  expect_p_rounded_unbiased(Isa::Avx512, DType::BF16, {64, 128});
  expect_p_rounded_unbiased(Isa::Avx512, DType::F8E4M3, {80});  // fp8 values enter as their bf16 bits
}

// Channels with a stride other than 1 (every other element of a wider buffer,
// as a view of an interleaved tensor gives): the loads of Q, K and V and the
// stores of O take the strided paths, for each input and output dtype.
TEST(CpuBackend, StridedChannelsMatchTheReference) {
  const VideoGrid grid{2, 5, 7, 3, TextPlacement::After};
  for (const DType in : {DType::F32, DType::BF16, DType::F16})
    for (const DType out : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(to_string(in)) + " in, " + std::string(to_string(out)) + " out");
      const VideoLayout layout{grid, 2, 4, 64};
      auto problem = testing::make_problem(layout, in, four_heads(grid, 0.25, true, {64, 64}, Alignment::Exact),
                                           testing::fresh_seed(), MemoryLayout::BNHD, out);
      const std::int64_t n = layout.tokens();
      const auto wide = [&](DType dtype, const TensorView* from, std::vector<std::byte>& storage) {
        storage.assign(std::size_t(2 * 2 * n * 4 * 64) * element_size(dtype), std::byte{0x7f});  // NaN-ish filler
        TensorView v = TensorView::contiguous(storage.data(), dtype, 2, n, 4, 128, MemoryLayout::BNHD);
        v.shape[3] = 64;
        v.stride[3] = 2;
        if (from != nullptr)
          for (std::int64_t b = 0; b < 2; ++b)
            for (std::int64_t t = 0; t < n; ++t)
              for (std::int64_t h = 0; h < 4; ++h)
                for (std::int64_t d = 0; d < 64; ++d) v.store(b, t, h, d, from->load(b, t, h, d));
        return v;
      };
      std::vector<std::byte> qs, ks, vs, os;
      AttentionCall call = problem.call();
      call.q = wide(in, &call.q, qs);
      call.k = wide(in, &call.k, ks);
      call.v = wide(in, &call.v, vs);
      call.o = wide(out, nullptr, os);
      for (Isa isa : testing::isas_of_this_machine()) {
        SCOPED_TRACE(std::string(to_string(isa)));
        std::fill(os.begin(), os.end(), std::byte{0x7f});  // not the last ISA's output: each writes its own
        problem.lse.poison();
        make_cpu_backend({isa, 2})->run(call);
        const AttentionCall dense = problem.call();
        for (std::int64_t b = 0; b < 2; ++b)
          for (std::int64_t t = 0; t < n; ++t)
            for (std::int64_t h = 0; h < 4; ++h)
              for (std::int64_t d = 0; d < 64; ++d) dense.o.store(b, t, h, d, call.o.load(b, t, h, d));
        const auto cmp = testing::compare_with_reference(problem);
        EXPECT_TRUE(cmp.ok()) << cmp.failure;
        // The elements between the channels belong to no tensor: never written.
        for (std::size_t i = 0; i < os.size(); i += 2 * element_size(out))
          for (std::size_t j = element_size(out); j < 2 * element_size(out); ++j)
            ASSERT_EQ(os[i + j], std::byte{0x7f}) << "byte " << i + j;
      }
    }
}

}  // namespace
}  // namespace stsa
