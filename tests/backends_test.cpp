// One harness over every registered backend: each is compared with the fp64
// reference on fresh random inputs and awkward shapes. "Not supported" is
// reported apart from "failed"; the cpu backend must support every case here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "stsa/attention.hpp"
#include "stsa/error.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

struct Case {
  VideoGrid grid;
  std::int64_t heads, head_dim;
  DType dtype;
  MemoryLayout memory;
  double density;
};

std::vector<Case> cases() {
  return {
      {{3, 5, 7, 0, TextPlacement::After}, 4, 64, DType::F32, MemoryLayout::BNHD, 0.25},     // 105 tokens
      {{1, 9, 15, 0, TextPlacement::After}, 4, 80, DType::BF16, MemoryLayout::BHND, 0.25},    // one frame
      {{4, 6, 11, 13, TextPlacement::Before}, 4, 128, DType::F32, MemoryLayout::BHND, 0.1},   // text first
      {{5, 4, 7, 9, TextPlacement::After}, 4, 64, DType::BF16, MemoryLayout::BNHD, 0.02},     // text last, tiny
      {{2, 1, 1, 0, TextPlacement::After}, 4, 64, DType::F32, MemoryLayout::BNHD, 0.0},       // 1x1 frames
      {{6, 8, 8, 0, TextPlacement::After}, 4, 128, DType::F32, MemoryLayout::BNHD, 1.0},      // all kept
  };
}

// Four heads of different kinds; temporal heads' tokens are taken as already permuted.
std::vector<HeadMask> mixed_heads(const Case& c, PlanCache& cache) {
  const MaskSpec specs[4] = {mask_for_density(c.grid, SparseKind::Spatial, c.density),
                             mask_for_density(c.grid, SparseKind::Temporal, c.density),
                             mask_for_density(c.grid, SparseKind::FrameWindow, c.density, false),
                             MaskSpec::dense()};
  std::vector<HeadMask> heads;
  for (std::int64_t h = 0; h < c.heads; ++h) {
    const MaskSpec& spec = specs[h % 4];
    heads.push_back({spec, spec.natural_order(), cache.get(c.grid, spec), true});
  }
  return heads;
}

TEST(Backends, EveryBackendMatchesTheReference) {
  for (const Backend* backend : backends()) {
    int supported = 0;
    for (const Case& c : cases()) {
      PlanCache cache;
      const VideoLayout layout{c.grid, 1, c.heads, c.head_dim};
      auto problem = testing::make_problem(layout, c.dtype, mixed_heads(c, cache), testing::fresh_seed(), c.memory);
      const Support support = backend->supports(problem.call());
      if (!support.ok) {
        std::printf("[ not supported ] %s: %s (%s)\n", std::string(backend->name()).c_str(), problem.label.c_str(),
                    support.why.c_str());
        EXPECT_NE(backend->name(), "cpu") << "the cpu backend must support " << problem.label;
        EXPECT_THROW(backend->run(problem.call()), Unsupported);
        continue;
      }
      ++supported;
      backend->run(problem.call());
      const auto result = testing::compare_with_reference(problem, testing::kMatrixRows, testing::fresh_seed());
      EXPECT_TRUE(result.ok()) << backend->name() << ": " << result.failure;
    }
    std::printf("[ backend %s ] %d of %zu cases supported\n", std::string(backend->name()).c_str(), supported,
                cases().size());
  }
}

TEST(Backends, SkippedHeadsAreLeftUntouched) {
  const Case c = cases()[0];
  for (const Backend* backend : backends()) {
    PlanCache cache;
    auto heads = mixed_heads(c, cache);
    heads[1].compute = false;
    auto problem = testing::make_problem({c.grid, 1, c.heads, c.head_dim}, c.dtype, heads, testing::fresh_seed());
    if (!backend->supports(problem.call()).ok) continue;
    backend->run(problem.call());
    for (std::int64_t i = 0; i < c.grid.tokens(); ++i) {
      EXPECT_TRUE(std::isnan(problem.call().o.load(0, i, 1, 0))) << backend->name() << " wrote a skipped head";
      EXPECT_TRUE(std::isnan(problem.call().lse.at(0, 1, i)));
    }
    EXPECT_TRUE(testing::compare_with_reference(problem).ok());
  }
}

TEST(Backends, NonFiniteInputsPropagateOnlyToRowsThatTouchThem) {
  const VideoGrid grid{4, 2, 8};  // 64 tokens
  const MaskSpec spec = MaskSpec::spatial(2, false);
  for (const Backend* backend : backends()) {
    PlanCache cache;
    auto problem = testing::make_problem({grid, 1, 2, 64}, DType::F32, uniform_heads({grid, 1, 2, 64}, spec, cache),
                                         testing::fresh_seed());
    if (!backend->supports(problem.call()).ok) continue;
    problem.k.view().store(0, 20, 0, 5, NAN);       // head 0: key 20, seen by rows 18..22
    problem.v.view().store(0, 40, 1, 3, INFINITY);  // head 1: value 40, seen by rows 38..42
    problem.q.view().store(0, 7, 1, 0, NAN);        // head 1: row 7
    problem.o.poison_finite();                      // rows expected NaN must be written NaN, not left so
    problem.lse.poison_finite();
    backend->run(problem.call());
    const auto call = problem.call();
    for (std::int64_t i = 0; i < grid.tokens(); ++i) {
      const bool touched0 = i >= 18 && i <= 22;
      EXPECT_EQ(std::isnan(call.o.load(0, i, 0, 0)), touched0) << backend->name() << " head 0 row " << i;
      const bool touched1 = (i >= 38 && i <= 42) || i == 7;
      EXPECT_EQ(!std::isfinite(call.o.load(0, i, 1, 3)), touched1) << backend->name() << " head 1 row " << i;
    }
    EXPECT_TRUE(testing::compare_with_reference(problem).ok()) << backend->name();
  }
}

TEST(Backends, RepeatedRunsAreBitIdentical) {
  const Case c = cases()[2];
  for (const Backend* backend : backends()) {
    PlanCache cache;
    auto problem = testing::make_problem({c.grid, 1, c.heads, c.head_dim}, c.dtype, mixed_heads(c, cache), 11);
    if (!backend->supports(problem.call()).ok) continue;
    backend->run(problem.call());
    const auto bytes = std::size_t(problem.call().o.numel()) * element_size(problem.call().o.dtype);
    std::vector<std::byte> first(bytes);
    std::memcpy(first.data(), problem.call().o.data, bytes);
    problem.o.poison();
    backend->run(problem.call());
    EXPECT_EQ(std::memcmp(first.data(), problem.call().o.data, bytes), 0) << backend->name();
  }
}

TEST(Backends, RegistryNamesBackendsAndRejectsUnknownOnes) {
  EXPECT_EQ(backend("reference").name(), "reference");
  EXPECT_EQ(backend("cpu").name(), "cpu");
  EXPECT_THROW(backend("tpu"), InvalidArgument);
}

TEST(Backends, TiledBackendsRefusePlansBuiltForAnotherLayout) {
  const VideoGrid grid{3, 4, 4};
  PlanCache cache;
  const MaskSpec temporal = MaskSpec::temporal(5);
  std::vector<HeadMask> heads{{temporal, TokenOrder::FrameMajor, cache.get(grid, temporal), true}};
  auto problem = testing::make_problem({grid, 1, 1, 64}, DType::F32, heads, 1);
  EXPECT_THROW(backend("cpu").run(problem.call()), InvalidArgument) << "temporal plan on frame-major tokens";
  heads[0] = {temporal, TokenOrder::SpatialMajor, cache.get(VideoGrid{3, 4, 5}, temporal), true};
  auto other = testing::make_problem({grid, 1, 1, 64}, DType::F32, heads, 1);
  EXPECT_THROW(backend("cpu").run(other.call()), InvalidArgument) << "plan for another grid";
  heads[0].plan = nullptr;
  auto missing = testing::make_problem({grid, 1, 1, 64}, DType::F32, heads, 1);
  EXPECT_THROW(backend("cpu").run(missing.call()), InvalidArgument) << "no plan";
}

// Two LSE entries at one address (or O elements at one address) would be
// written by two rows: every backend refuses such views before computing.
TEST(Backends, OutputsWhoseElementsShareAnAddressAreInvalid) {
  const VideoLayout layout{{2, 3, 4}, 1, 2, 16};
  auto problem = testing::make_problem(layout, DType::F32, std::vector<HeadMask>(2), 1);
  AttentionCall call = problem.call();
  call.lse.stride[1] = 0;  // both heads' LSE rows in one place
  for (const Backend* b : backends()) EXPECT_THROW(b->run(call), InvalidArgument) << b->name();
  call = problem.call();
  call.o.stride[2] = 8;  // heads 16 wide, 8 apart
  for (const Backend* b : backends()) EXPECT_THROW(b->run(call), InvalidArgument) << b->name();
  try {
    call = problem.call();
    call.lse.stride[2] = 0;
    validate(call, /*require_plans=*/false);
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("lse has overlapping strides"), std::string::npos) << e.what();
  }
}

// validate() on an ordinary (not scattered) call: each refusal by itself, on an
// otherwise valid call, and a size-1 dimension's stride, which addresses nothing,
// accepted whatever it is (as PyTorch leaves it after unsqueeze or expand).
TEST(Backends, ValidateRefusesEachBrokenCallAndAcceptsAnyStrideOfASizeOneDim) {
  const VideoLayout layout{{2, 3, 4}, 1, 2, 16};
  auto problem = testing::make_problem(layout, DType::F32, std::vector<HeadMask>(2), 1);
  const auto expect_refused = [](const AttentionCall& call, const std::string& fragment) {
    try {
      validate(call, /*require_plans=*/false);
      ADD_FAILURE() << "accepted; expected '" << fragment << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  ASSERT_NO_THROW(validate(problem.call(), false));
  AttentionCall call = problem.call();
  call.o = call.v;  // O over an input
  expect_refused(call, "o overlaps an input");
  Tensor v_bf16(DType::BF16, 1, layout.tokens(), 2, 16);
  call = problem.call();
  call.v = v_bf16.view();  // q and k fp32, v bf16
  expect_refused(call, "share a dtype");
  Tensor o_fp8(DType::F8E4M3, 1, layout.tokens(), 2, 16);
  call = problem.call();
  call.o = o_fp8.view();  // fp8 is an input type only
  expect_refused(call, "o must be fp32, bf16 or fp16, got fp8_e4m3");
  std::vector<float> lse_in_o(std::size_t(layout.tokens() * 2 * 16));
  call = problem.call();
  call.o = TensorView::contiguous(lse_in_o.data(), DType::F32, 1, layout.tokens(), 2, 16, MemoryLayout::BNHD);
  call.lse = LseView::contiguous(lse_in_o.data(), 1, 2, layout.tokens());
  expect_refused(call, "lse overlaps o");
  call = problem.call();
  call.lse = LseView::contiguous(static_cast<float*>(call.k.data), 1, 2, layout.tokens());
  expect_refused(call, "lse overlaps an input");
  call = problem.call();
  call.q.data = static_cast<std::byte*>(call.q.data) + 2;  // not on a float boundary
  expect_refused(call, "aligned");
  call = problem.call();
  call.softmax_scale = INFINITY;
  expect_refused(call, "softmax scale");
  call = problem.call();
  call.o.stride[2] = 15;  // heads 16 wide, 15 apart: the last channel of a head is the next head's first
  expect_refused(call, "o has overlapping strides");
  call = problem.call();
  call.heads.pop_back();
  expect_refused(call, "one mask per head");
  // Batch 1: the batch stride never multiplies a non-zero index.
  for (const std::int64_t stride : {std::int64_t(0), std::int64_t(1), std::int64_t(7)}) {
    call = problem.call();
    call.q.stride[0] = stride;
    call.lse.stride[0] = stride;
    EXPECT_NO_THROW(validate(call, false)) << "batch stride " << stride;
  }
}

// check_outputs_apart on views whose byte ranges interleave: apart exactly where
// they are disjoint slices of one view with one element size and the same strides.
TEST(Aliasing, InterleavedSlicesAreApartOnlyWhereDisjoint) {
  Tensor x(DType::F32, 2, 10, 4, 8);  // [B, N, H, D]: heads 0-1 and 2-3 of it interleave
  const auto heads = [&](std::int64_t first, std::int64_t count) {
    TensorView v = x.view();
    v.data = static_cast<std::byte*>(v.data) + first * v.stride[2] * 4;
    v.shape[2] = count;
    return v;
  };
  const auto apart = [](const NamedExtent& a, const NamedExtent& b) {
    const NamedExtent outputs[] = {a, b};
    try {
      check_outputs_apart("", outputs, {});
      return true;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("b overlaps a"), std::string::npos) << e.what();
      return false;
    }
  };
  EXPECT_TRUE(apart(NamedExtent::of("a", heads(0, 2)), NamedExtent::of("b", heads(2, 2))));
  EXPECT_TRUE(apart(NamedExtent::of("a", heads(2, 2)), NamedExtent::of("b", heads(0, 2))));
  EXPECT_FALSE(apart(NamedExtent::of("a", heads(0, 2)), NamedExtent::of("b", heads(1, 2))));  // head 1 in both
  // As bytes alone (the same views), or as other element sizes, nothing shows them apart.
  EXPECT_FALSE(apart({"a", heads(0, 2).byte_extent()}, {"b", heads(2, 2).byte_extent()}));
  TensorView half = heads(2, 2);
  half.dtype = DType::BF16;
  half.stride = {640, 64, 16, 1};  // the same bytes as bf16 values
  half.shape[3] = 16;
  EXPECT_FALSE(apart(NamedExtent::of("a", heads(0, 2)), NamedExtent::of("b", half)));
  // The same shapes under other strides (channels of one head, tokens of another) are not slices of one view.
  TensorView other = heads(2, 2);
  other.stride[1] = 8;
  other.stride[2] = 80;
  EXPECT_FALSE(apart(NamedExtent::of("a", heads(0, 2)), NamedExtent::of("b", other)));
  // Channels 8 apart in rows 16 apart: the second view sits in the first one's gaps.
  std::vector<float> rows(64);
  LseView lse = LseView::contiguous(rows.data(), 1, 4, 8);
  lse.stride = {64, 16, 1};
  LseView gaps = lse;
  gaps.data += 8;
  EXPECT_TRUE(apart(NamedExtent::of("a", lse), NamedExtent::of("b", gaps)));
  gaps.data -= 1;
  EXPECT_FALSE(apart(NamedExtent::of("a", lse), NamedExtent::of("b", gaps)));
}

}  // namespace
}  // namespace stsa
