// Distributed pieces that need no second process: sharding, byte accounting,
// the single-device path against the fp64 reference, and the Ulysses call over
// the one-rank LocalCommunicator.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "dist_testing.hpp"
#include "stsa/permute.hpp"

namespace stsa::dist {
namespace {

using namespace stsa::dist_testing;  // the shared problem, shards and comparisons of these tests
using stsa::testing::compare_with_reference;
using stsa::testing::fresh_seed;
using stsa::testing::make_problem;

TEST(SequenceShard, CoversEveryTokenOnceInOrder) {
  for (std::int64_t tokens : {0, 1, 3, 7, 10, 105, 576}) {
    for (int ranks : {1, 2, 3, 4, 7}) {
      std::int64_t next = 0, longest = 0, shortest = tokens;
      for (int r = 0; r < ranks; ++r) {
        const Shard s = sequence_shard(tokens, ranks, r);
        EXPECT_EQ(s.begin, next) << tokens << " tokens, " << ranks << " ranks, rank " << r;
        next = s.end();
        longest = std::max(longest, s.count);
        shortest = std::min(shortest, s.count);
        // The first V % P ranks carry the extra token.
        EXPECT_EQ(s.count, tokens / ranks + (r < tokens % ranks ? 1 : 0));
      }
      EXPECT_EQ(next, tokens);
      EXPECT_LE(longest - shortest, 1);
    }
  }
  EXPECT_EQ(sequence_shard(10, 4, 0), (Shard{0, 3}));
  EXPECT_EQ(sequence_shard(10, 4, 1), (Shard{3, 3}));
  EXPECT_EQ(sequence_shard(10, 4, 2), (Shard{6, 2}));
  EXPECT_EQ(sequence_shard(10, 4, 3), (Shard{8, 2}));
}

TEST(SequenceShard, RejectsBadRankArguments) {
  EXPECT_THROW(sequence_shard(10, 0, 0), InvalidArgument);
  EXPECT_THROW(sequence_shard(10, 4, 4), InvalidArgument);
  EXPECT_THROW(sequence_shard(10, 4, -1), InvalidArgument);
  EXPECT_THROW(sequence_shard(-1, 4, 0), InvalidArgument);
}

TEST(HeadsPerRank, SaysWhichRankCountsWork) {
  EXPECT_EQ(heads_per_rank(8, 1), 8);
  EXPECT_EQ(heads_per_rank(8, 4), 2);
  EXPECT_EQ(heads_per_rank(40, 8), 5);
  try {
    heads_per_rank(12, 5);
    FAIL() << "12 heads over 5 ranks must be rejected";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("1, 2, 3, 4, 6, 12"), std::string::npos) << e.what();
  }
}

TEST(LocalCommunicator, ExchangesAreLocalCopiesAndCostNoTraffic) {
  auto comm = make_local_communicator();
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->name(), "local");
  std::vector<std::byte> send(64), recv(80, std::byte{0});
  std::iota(reinterpret_cast<unsigned char*>(send.data()), reinterpret_cast<unsigned char*>(send.data()) + 64, 0);
  const std::int64_t counts[] = {40}, send_offsets[] = {8}, recv_offsets[] = {16};
  comm->alltoallv(send.data(), counts, send_offsets, recv.data(), counts, recv_offsets);
  EXPECT_EQ(std::memcmp(recv.data() + 16, send.data() + 8, 40), 0);
  const std::int64_t wrong[] = {8};
  EXPECT_THROW(comm->alltoallv(send.data(), counts, send_offsets, recv.data(), wrong, recv_offsets), DistError);
  const std::int64_t two[] = {1, 1};
  EXPECT_THROW(comm->alltoallv(send.data(), two, two, recv.data(), two, two), InvalidArgument);
  double values[] = {3.0, -1.0};
  comm->allreduce(values, ReduceOp::Max);
  EXPECT_EQ(values[0], 3.0);
  std::int64_t mine = 42, all = 0;
  comm->allgather(&mine, sizeof mine, &all);
  EXPECT_EQ(all, 42);
  comm->barrier();
  const Traffic t = comm->traffic();
  EXPECT_EQ(t.bytes_sent, 0);  // a rank's block to itself is never traffic
  EXPECT_EQ(t.bytes_received, 0);
  EXPECT_EQ(t.control_bytes_sent, 0);
  EXPECT_EQ(t.exchanges, 1);
  EXPECT_GE(t.collectives, 4);
  EXPECT_THROW(comm->set_timeout(std::chrono::milliseconds(0)), InvalidArgument);
}

TEST(UlyssesVolume, EvenShardsMatchTheTextbookFormula) {
  const VideoLayout l = make_layout(VideoGrid{9, 8, 8}, 8, 64);  // 576 tokens
  for (int ranks : {1, 2, 4, 8}) {
    for (bool lse : {false, true}) {
      const double formula = ulysses_formula_bytes(l, DType::F32, DType::F32, lse, ranks);
      for (int r = 0; r < ranks; ++r) {
        const UlyssesVolume v = ulysses_volume(l, DType::F32, DType::F32, lse, ranks, r);
        EXPECT_EQ(double(v.sent()), formula) << ranks << " ranks, rank " << r;
        EXPECT_EQ(v.sent(), v.received());
      }
    }
  }
  // By hand: P = 2, fp32: 4 x 1 x 288 x 8 x 64 x 1/2 elements x 4 bytes, plus 288 x 8 x 1/2 LSE floats.
  EXPECT_EQ(ulysses_formula_bytes(l, DType::F32, DType::F32, true, 2), 4.0 * 288 * 8 * 64 / 2 * 4 + 288.0 * 8 / 2 * 4);
  EXPECT_EQ(ulysses_volume(l, DType::F32, DType::F32, false, 1, 0).sent(), 0);
}

// Grouped-query attention: K and V carry Hkv heads, Q and O H; by hand and against the formula.
TEST(UlyssesVolume, GroupedKvHeadsCarryTheirOwnCount) {
  const VideoLayout l = make_layout(VideoGrid{9, 8, 8}, 8, 64);  // 576 tokens
  for (int ranks : {1, 2})
    for (int r = 0; r < ranks; ++r)
      EXPECT_EQ(double(ulysses_volume(l, DType::F32, DType::F32, true, ranks, r, 2).sent()),
                ulysses_formula_bytes(l, DType::F32, DType::F32, true, ranks, 2));
  // P = 2, fp32: (8 + 2 x 2 + 8) heads x 288 tokens x 64 x 1/2 elements x 4 bytes, plus 288 x 8 x 1/2 LSE floats.
  EXPECT_EQ(ulysses_formula_bytes(l, DType::F32, DType::F32, true, 2, 2),
            (8.0 + 4 + 8) * 288 * 64 / 2 * 4 + 288.0 * 8 / 2 * 4);
  EXPECT_EQ(ulysses_volume(l, DType::F32, DType::F32, true, 2, 0, 8).sent(),
            ulysses_volume(l, DType::F32, DType::F32, true, 2, 0).sent());  // Hkv = H: no grouping
  for (const std::int64_t bad : {3, -2, 16}) {
    EXPECT_THROW(ulysses_volume(l, DType::F32, DType::F32, true, 2, 0, bad), InvalidArgument) << bad;
    EXPECT_THROW(ulysses_formula_bytes(l, DType::F32, DType::F32, true, 2, bad), InvalidArgument) << bad;
  }
}

TEST(UlyssesVolume, UnevenShardsAndTextBalanceAcrossRanks) {
  VideoGrid g{3, 5, 7, 11, TextPlacement::Before};  // 105 video tokens
  const VideoLayout l = make_layout(g, 4, 80, 2);
  for (int ranks : {2, 4}) {
    std::int64_t sent = 0, received = 0;
    for (int r = 0; r < ranks; ++r) {
      const UlyssesVolume v = ulysses_volume(l, DType::BF16, DType::F32, true, ranks, r);
      sent += v.sent();
      received += v.received();
    }
    EXPECT_EQ(sent, received);
  }
  EXPECT_THROW(ulysses_volume(l, DType::F32, DType::F32, true, 3, 0), InvalidArgument);  // 3 does not divide 4 heads
}

// Brute force over the permutation map: count tokens whose two positions fall in different shards.
std::int64_t brute_force_permutation_bytes(const VideoLayout& l, std::int64_t temporal_heads, int ranks, int rank,
                                           std::int64_t in_elem, std::int64_t out_row) {
  const VideoGrid& g = l.grid;
  const auto to_spatial = permutation_map(g, TokenOrder::FrameMajor, TokenOrder::SpatialMajor);  // [spatial] = frame
  const Shard s = sequence_shard(g.video_tokens(), ranks, rank);
  const auto inside = [&](std::int64_t video_pos) { return video_pos >= s.begin && video_pos < s.end(); };
  std::int64_t leaving = 0, returning = 0;
  for (std::int64_t spatial = 0; spatial < g.tokens(); ++spatial) {
    const std::int64_t frame = to_spatial[std::size_t(spatial)];
    const std::int64_t vs = spatial - g.video_begin(), vf = frame - g.video_begin();
    if (vs < 0 || vs >= g.video_tokens()) continue;  // text
    if (inside(vf) && !inside(vs)) ++leaving;
    if (inside(vs) && !inside(vf)) ++returning;
  }
  return l.batch * temporal_heads * (3 * leaving * l.head_dim * in_elem + returning * out_row);
}

TEST(ShardedPermutationBytes, MatchesBruteForceAndIsZeroWithoutTemporalHeads) {
  VideoGrid g{5, 4, 6, 9, TextPlacement::After};
  const VideoLayout l = make_layout(g, 4, 64);
  const auto masks = mixed_masks(g, 4, 0.3);  // one temporal head of four
  for (int ranks : {1, 2, 3, 4}) {
    for (int r = 0; r < ranks; ++r) {
      const std::int64_t computed = sharded_permutation_bytes(l, masks, DType::BF16, DType::F32, true, ranks, r);
      EXPECT_EQ(computed, brute_force_permutation_bytes(l, 1, ranks, r, 2, 64 * 4 + 4)) << ranks << " ranks, rank " << r;
      if (ranks > 1) {
        EXPECT_GT(computed, 0);
      }
    }
  }
  const std::vector<MaskSpec> spatial{mask_for_density(g, SparseKind::Spatial, 0.3)};
  EXPECT_EQ(sharded_permutation_bytes(l, spatial, DType::F32, DType::F32, true, 4, 1), 0);
  EXPECT_THROW(sharded_permutation_bytes(l, std::vector<MaskSpec>(3), DType::F32, DType::F32, true, 2, 0),
               InvalidArgument);
}

TEST(RoutesForMasks, NamesTheRouteOfEachMask) {
  const VideoGrid g{4, 6, 6};
  const auto masks = mixed_masks(g, 4, 0.25);
  const auto routes = routes_for_masks(masks, 4);
  ASSERT_EQ(routes.size(), 4u);
  EXPECT_EQ(routes[0].route, Route::Spatial);
  EXPECT_EQ(routes[1].route, Route::Temporal);
  EXPECT_EQ(routes[2].route, Route::FrameWindow);
  EXPECT_EQ(routes[3].route, Route::Dense);
  for (std::size_t h = 0; h < 4; ++h) EXPECT_EQ(routes[h].spec, masks[h]);
  EXPECT_EQ(routes_for_masks(std::vector<MaskSpec>{masks[1]}, 3).size(), 3u);
  EXPECT_THROW(routes_for_masks(masks, 3), InvalidArgument);
}

struct Case {
  VideoGrid grid;
  std::int64_t heads, dim;
  DType dtype;
  const char* backend;
};

// A readable, stable name for a case, used for its CTest name and the value gtest prints (by
// default its bytes, a pointer among them).
std::string describe(const Case& c) {
  std::string name = std::to_string(c.grid.frames) + "x" + std::to_string(c.grid.height) + "x" +
                     std::to_string(c.grid.width) + "_text" + std::to_string(c.grid.text_tokens) +
                     (c.grid.text_placement == TextPlacement::Before ? "first" : "last") + "_d" +
                     std::to_string(c.dim) + "_" + std::string(to_string(c.dtype)) + "_" + c.backend;
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';  // gtest names take [A-Za-z0-9_] only
  }
  return name;
}
void PrintTo(const Case& c, std::ostream* os) { *os << describe(c); }
std::string case_name(const ::testing::TestParamInfo<Case>& info) { return describe(info.param); }

class SingleDevice : public ::testing::TestWithParam<Case> {};

// The path every rank runs must itself be right: against the fp64 reference, temporal heads included.
TEST_P(SingleDevice, MatchesTheReference) {
  const Case c = GetParam();
  const VideoLayout l = make_layout(c.grid, c.heads, c.dim, 2);
  const auto masks = mixed_masks(c.grid, c.heads, 0.25);
  const std::uint64_t seed = fresh_seed();
  auto p = make_problem(l, c.dtype, reference_heads(l, masks), seed);
  PlanCache plans;
  run_single(p, masks, true, backend(c.backend), plans);
  const auto cmp = compare_with_reference(p);
  EXPECT_TRUE(cmp.ok()) << p.label << ": " << cmp.failure;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, SingleDevice,
    ::testing::Values(Case{VideoGrid{3, 5, 7}, 4, 64, DType::F32, "cpu"},
                      Case{VideoGrid{4, 6, 5, 13, TextPlacement::Before}, 4, 80, DType::BF16, "cpu"},
                      Case{VideoGrid{1, 9, 11, 7, TextPlacement::After}, 4, 128, DType::F32, "cpu"},
                      Case{VideoGrid{3, 5, 7, 5, TextPlacement::After}, 4, 64, DType::F32, "reference"}),
    case_name);

TEST(UlyssesLocal, OneRankEqualsTheSingleDevicePathBitForBit) {
  VideoGrid g{3, 5, 7, 6, TextPlacement::Before};
  const VideoLayout l = make_layout(g, 4, 64);
  const auto masks = mixed_masks(g, 4, 0.25);
  auto single = make_problem(l, DType::F32, reference_heads(l, masks), fresh_seed());
  PlanCache plans;
  const Backend& cpu = backend("cpu");
  run_single(single, masks, true, cpu, plans);

  auto comm = make_local_communicator();
  auto rank = shard_problem(single, masks, 1, 0, true);
  const UlyssesReport report = ulysses_attention(*comm, rank.call, cpu, plans);
  EXPECT_EQ(compare_tokens(rank.o.view(), single.o.view(), g.video_begin(), g.video_tokens()).differing_bits, 0);
  EXPECT_EQ(compare_tokens(rank.text_o.view(), single.o.view(), 0, g.text_tokens).differing_bits, 0);
  EXPECT_EQ(compare_lse(rank.lse.view(), single.lse.view(), g.video_begin(), g.video_tokens()).differing_bits, 0);
  EXPECT_EQ(compare_lse(rank.text_lse.view(), single.lse.view(), 0, g.text_tokens).differing_bits, 0);
  EXPECT_EQ(report.ranks, 1);
  EXPECT_EQ(report.local_heads, 4);
  EXPECT_EQ(report.temporal_heads, 1);
  EXPECT_EQ(report.total.bytes_sent, 0);
  EXPECT_EQ(report.local.exchanges + report.local.collectives, 0);  // nothing between the exchanges talks to other ranks
  EXPECT_EQ(report.scatter.exchanges, 1);
  EXPECT_EQ(report.gather.exchanges, 1);
}

// A model's rank holds its video shard and the text in one output tensor: O and
// text_o (and LSE and text_lse) are token slices of one [B, N, H, D] view, whose
// bytes interleave with two batch entries, or with heads outside tokens, without
// sharing one. Taken, and bit-identical to the single-device path; slices that do
// share an element are still refused.
TEST(UlyssesLocal, VideoAndTextOutputsMayBeSlicesOfOneTensor) {
  const VideoGrid g{3, 5, 7, 6, TextPlacement::Before};
  const VideoLayout l{g, 2, 4, 64};
  const std::int64_t n = g.tokens(), t = g.text_tokens, video = g.video_tokens();
  const auto masks = mixed_masks(g, 4, 0.25);
  auto single = make_problem(l, DType::F32, reference_heads(l, masks), fresh_seed());
  PlanCache plans;
  const Backend& cpu = backend("cpu");
  run_single(single, masks, true, cpu, plans);
  auto comm = make_local_communicator();
  for (const MemoryLayout memory : {MemoryLayout::BNHD, MemoryLayout::BHND})
    for (const std::int64_t text_shift : {0, 1}) {  // 1: text_o and text_lse reach into the video's first token
      SCOPED_TRACE(std::string(memory == MemoryLayout::BNHD ? "BNHD" : "BHND") + " text shifted by " +
                   std::to_string(text_shift));
      Tensor o(DType::F32, 2, n + 1, 4, 64, memory);
      std::vector<float> lse(std::size_t(2 * 4 * (n + 1)), std::nanf(""));
      std::memset(o.view().data, 0xFF, o.bytes());
      const auto tokens = [](TensorView view, std::int64_t first, std::int64_t count) {
        view.data = static_cast<std::byte*>(view.data) + first * view.stride[1] * 4;
        view.shape[1] = count;
        return view;
      };
      const auto lse_tokens = [](LseView view, std::int64_t first, std::int64_t count) {
        view.data += first * view.stride[2];
        view.shape[2] = count;
        return view;
      };
      const LseView all_lse = LseView::contiguous(lse.data(), 2, 4, n + 1);
      auto rank = shard_problem(single, masks, 1, 0, true);
      rank.call.text_o = tokens(o.view(), text_shift, t);
      rank.call.o = tokens(o.view(), t, video);
      rank.call.text_lse = lse_tokens(all_lse, text_shift, t);
      rank.call.lse = lse_tokens(all_lse, t, video);
      if (text_shift != 0) {
        try {
          ulysses_attention(*comm, rank.call, cpu, plans);
          ADD_FAILURE() << "text_o over the video's first token was taken";
        } catch (const DistError& e) {
          EXPECT_NE(std::string(e.what()).find("text_o overlaps o"), std::string::npos) << e.what();
        }
        continue;
      }
      ulysses_attention(*comm, rank.call, cpu, plans);
      const TensorView whole = tokens(o.view(), 0, n);
      EXPECT_EQ(compare_tokens(whole, single.o.view(), 0, n).differing_bits, 0);
      EXPECT_EQ(compare_lse(lse_tokens(all_lse, 0, n), single.lse.view(), 0, n).differing_bits, 0);
    }
}

// One workspace across calls of different shapes (larger, smaller, larger again):
// every result is bit-identical to the single-device path, so nothing of an
// earlier call's data survives in the reused memory, and the memory is kept.
TEST(UlyssesLocal, AReusedWorkspaceGivesTheSameBitsAcrossShapes) {
  struct Shape {
    VideoGrid grid;
    std::int64_t heads, head_dim;
  };
  const Shape shapes[] = {{VideoGrid{4, 6, 7, 9, TextPlacement::After}, 4, 64},
                          {VideoGrid{2, 5, 5, 6, TextPlacement::Before}, 2, 80},
                          {VideoGrid{4, 6, 7, 9, TextPlacement::After}, 4, 64}};
  const Backend& cpu = backend("cpu");
  auto comm = make_local_communicator();
  PlanCache plans;
  UlyssesWorkspace workspace;
  EXPECT_EQ(workspace.bytes(), 0u);
  std::size_t largest = 0;
  for (const Shape& shape : shapes) {
    const VideoLayout l = make_layout(shape.grid, shape.heads, shape.head_dim);
    const auto masks = mixed_masks(shape.grid, shape.heads, 0.25);
    auto single = make_problem(l, DType::F32, reference_heads(l, masks), fresh_seed());
    run_single(single, masks, true, cpu, plans);
    auto rank = shard_problem(single, masks, 1, 0, true);
    ulysses_attention(*comm, rank.call, cpu, plans, workspace);
    const VideoGrid& g = shape.grid;
    const std::int64_t text_begin = g.text_placement == TextPlacement::Before ? 0 : g.video_end();
    EXPECT_EQ(compare_tokens(rank.o.view(), single.o.view(), g.video_begin(), g.video_tokens()).differing_bits, 0);
    EXPECT_EQ(compare_tokens(rank.text_o.view(), single.o.view(), text_begin, g.text_tokens).differing_bits, 0);
    EXPECT_EQ(compare_lse(rank.text_lse.view(), single.lse.view(), text_begin, g.text_tokens).differing_bits, 0);
    EXPECT_EQ(compare_lse(rank.lse.view(), single.lse.view(), g.video_begin(), g.video_tokens()).differing_bits, 0);
    largest = std::max(largest, workspace.bytes());
    EXPECT_EQ(workspace.bytes(), largest) << "the workspace keeps what it has grown to";
  }
  EXPECT_GT(largest, 0u);
  workspace.release();
  EXPECT_EQ(workspace.bytes(), 0u);
}

TEST(UlyssesLocal, RejectsBadInputWithTheReason) {
  VideoGrid g{2, 4, 4};
  const VideoLayout l = make_layout(g, 2, 64);
  const std::vector<MaskSpec> masks{MaskSpec::dense()};
  auto p = make_problem(l, DType::F32, reference_heads(l, masks), 1);
  auto comm = make_local_communicator();
  PlanCache plans;
  const Backend& reference = backend("reference");

  auto wrong_dim = shard_problem(p, masks, 1, 0, false);
  wrong_dim.call.layout.head_dim = 32;
  try {
    ulysses_attention(*comm, wrong_dim.call, reference, plans);
    FAIL() << "a head dim that does not match the tensors must be rejected";
  } catch (const DistError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("shape"), std::string::npos) << e.what();
  }

  auto stray_text = shard_problem(p, masks, 1, 0, false);
  stray_text.call.text_q = stray_text.call.q;
  EXPECT_THROW(ulysses_attention(*comm, stray_text.call, reference, plans), DistError);

  auto too_many_masks = shard_problem(p, std::vector<MaskSpec>(3), 1, 0, false);
  EXPECT_THROW(ulysses_attention(*comm, too_many_masks.call, reference, plans), DistError);
}

TEST(UlyssesLocal, MissingTransportsSayUnsupported) {
  if (!built_with_mpi()) {
    EXPECT_THROW(MpiSession(), Unsupported);
  }
  if (!built_with_nccl()) {
    auto comm = make_local_communicator();
    EXPECT_THROW(make_nccl_communicator(*comm), Unsupported);
  }
}

// One mask for every head is H masks (dist.hpp: "H masks ... or one for every head"):
// a single temporal mask makes every head temporal, so every head's tokens move.
TEST(ShardedPermutationBytes, OneTemporalMaskForAllHeadsCountsEveryHead) {
  VideoGrid g{4, 3, 5, 7, TextPlacement::Before};
  const VideoLayout l = make_layout(g, 4, 64);
  const std::vector<MaskSpec> one{mask_for_density(g, SparseKind::Temporal, 0.3)};
  const std::vector<MaskSpec> each(4, one[0]);
  for (int ranks : {2, 3}) {
    for (int r = 0; r < ranks; ++r) {
      const std::int64_t expected = brute_force_permutation_bytes(l, 4, ranks, r, 4, 64 * 4);
      for (const auto* masks : {&one, &each})
        EXPECT_EQ(sharded_permutation_bytes(l, *masks, DType::F32, DType::F32, false, ranks, r), expected)
            << ranks << " ranks, rank " << r << ", " << masks->size() << " masks";
    }
  }
}

// Each of these is caught by the rank's own checks before any exchange, and the
// message says which: not later, as a failure inside the local attention (or not
// at all), and no output byte is written. Among them, what the single-device path
// refuses in a view (validate_tensor, validate_lse, validate): strides that step
// backwards or make two elements share an address, a misaligned pointer, an
// output over an input or over another output, an fp8 output, a non-finite scale
// (a zero stride in O would keep one of two results; an O over Q would overwrite
// what the caller gave).
TEST(UlyssesLocal, RejectsBadViewsAndDtypesAtTheAgreement) {
  VideoGrid g{2, 4, 4, 3, TextPlacement::After};
  const VideoLayout l = make_layout(g, 2, 64);
  const std::vector<MaskSpec> masks{MaskSpec::dense()};
  auto p = make_problem(l, DType::F32, reference_heads(l, masks), fresh_seed());
  auto comm = make_local_communicator();
  PlanCache plans;
  const Backend& cpu = backend("cpu");
  // The bits of an fp32 view's elements.
  const auto bits_of = [](const TensorView& t) {
    std::vector<std::uint32_t> bits;
    for (std::int64_t b = 0; b < t.shape[0]; ++b)
      for (std::int64_t n = 0; n < t.shape[1]; ++n)
        for (std::int64_t h = 0; h < t.shape[2]; ++h)
          for (std::int64_t d = 0; d < t.shape[3]; ++d) {
            const float x = t.load(b, n, h, d);
            std::uint32_t u;
            std::memcpy(&u, &x, sizeof u);
            bits.push_back(u);
          }
    return bits;
  };
  const auto expect_rejected = [&](RankProblem& r, const std::string& reason) {
    const auto o_before = bits_of(r.o.view()), text_o_before = bits_of(r.text_o.view());
    try {
      ulysses_attention(*comm, r.call, cpu, plans);
      ADD_FAILURE() << "not rejected: " << reason;
    } catch (const DistError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rejected on every rank because of bad input"), std::string::npos) << what;
      EXPECT_NE(what.find(reason), std::string::npos) << what;
    }
    EXPECT_EQ(bits_of(r.o.view()), o_before) << reason << ": o was written";
    EXPECT_EQ(bits_of(r.text_o.view()), text_o_before) << reason << ": text_o was written";
  };
  {
    auto r = shard_problem(p, masks, 1, 0, true);
    r.call.k.data = nullptr;  // shape says 32 tokens
    expect_rejected(r, "k is null");
  }
  {
    auto r = shard_problem(p, masks, 1, 0, true);
    Tensor v16(DType::BF16, 1, g.video_tokens(), 2, 64);
    r.call.v = v16.view();
    expect_rejected(r, "q, k and v must share a dtype");
  }
  {
    auto r = shard_problem(p, masks, 1, 0, true);
    Tensor k3(DType::F32, 1, g.video_tokens(), 3, 64), v3(DType::F32, 1, g.video_tokens(), 3, 64);
    r.call.k = k3.view();  // 3 K/V heads do not group 2 query heads
    r.call.v = v3.view();
    expect_rejected(r, "k and v hold 3 heads: grouped-query attention needs a count that divides q's 2");
  }
  {
    auto r = shard_problem(p, masks, 1, 0, true);
    Tensor v1(DType::F32, 1, g.video_tokens(), 1, 64);
    r.call.v = v1.view();  // k has both heads
    expect_rejected(r, "k and v must hold as many heads, got 2 and 1");
  }
  {
    auto r = shard_problem(p, masks, 1, 0, true);
    Tensor text_o16(DType::BF16, 1, g.text_tokens, 2, 64);
    r.call.text_o = text_o16.view();  // o is fp32
    expect_rejected(r, "text tensors must have the dtypes");
  }
  {
    auto r = shard_problem(p, masks, 1, 0, true);
    r.call.text_lse = LseView{};  // lse is given
    expect_rejected(r, "give text_lse exactly when lse is given");
  }
  {
    auto r = shard_problem(p, masks, 1, 0, true);
    r.call.o.stride[2] = 0;  // both heads of a token at one address
    expect_rejected(r, "o has overlapping strides");
  }
  {
    auto r = shard_problem(p, masks, 1, 0, true);
    r.call.text_o.stride[1] = 0;
    expect_rejected(r, "text_o has overlapping strides");
  }
  {
    auto r = shard_problem(p, masks, 1, 0, true);
    // The tokens walked backwards from the last one: a valid NumPy view, which no stsa call takes.
    r.call.k.data = static_cast<float*>(r.call.k.data) + (r.call.k.shape[1] - 1) * r.call.k.stride[1];
    r.call.k.stride[1] = -r.call.k.stride[1];
    expect_rejected(r, "k has negative stride");
  }
  {
    auto r = shard_problem(p, masks, 1, 0, true);
    r.call.o.data = static_cast<std::byte*>(r.call.o.data) + 2;
    expect_rejected(r, "o is not aligned");
  }
  {
    auto r = shard_problem(p, masks, 1, 0, true);
    r.call.o.data = r.call.q.data;
    expect_rejected(r, "o overlaps an input tensor");
  }
  {
    auto r = shard_problem(p, masks, 1, 0, true);
    r.call.text_o.data = r.call.v.data;  // text O over the video V
    expect_rejected(r, "text_o overlaps an input tensor");
  }
  {
    auto r = shard_problem(p, masks, 1, 0, true);
    r.call.lse.data = static_cast<float*>(r.call.o.data);
    expect_rejected(r, "lse overlaps o");
  }
  {
    auto r = shard_problem(p, masks, 1, 0, true);
    r.call.text_o.data = r.call.o.data;
    expect_rejected(r, "text_o overlaps o");
  }
  {
    auto r = shard_problem(p, masks, 1, 0, true);
    r.call.o.dtype = r.call.text_o.dtype = DType::F8E4M3;
    expect_rejected(r, "o must be fp32, bf16 or fp16");
  }
  {
    auto r = shard_problem(p, masks, 1, 0, true);
    r.call.softmax_scale = std::numeric_limits<float>::quiet_NaN();
    expect_rejected(r, "softmax scale must be finite");
  }
}

// STSA_DIST_TIMEOUT: seconds, > 0 and below 1e7, the whole string a number, rounded up to a
// millisecond; empty: the 120 s default; anything else refused (not silently the default).
TEST(LocalCommunicator, TimeoutFromTheEnvironment) {
  const char* saved = std::getenv("STSA_DIST_TIMEOUT");
  const std::string kept = saved ? saved : "";
  const std::pair<const char*, std::int64_t> cases[] = {
      {"2.5", 2500}, {"", 120000}, {"0.0001", 1}, {"9999999", 9999999000}};
  for (const auto& [text, ms] : cases) {
    ::setenv("STSA_DIST_TIMEOUT", text, 1);
    EXPECT_EQ(make_local_communicator()->timeout().count(), ms) << "'" << text << "'";
  }
  for (const char* text : {"0", "-3", "5x", "30s", "abc", "1e7", "nan", "inf"}) {
    ::setenv("STSA_DIST_TIMEOUT", text, 1);
    try {
      make_local_communicator();
      ADD_FAILURE() << "'" << text << "' was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("STSA_DIST_TIMEOUT must be seconds"), std::string::npos) << e.what();
    }
  }
  if (saved)
    ::setenv("STSA_DIST_TIMEOUT", kept.c_str(), 1);
  else
    ::unsetenv("STSA_DIST_TIMEOUT");
}

TEST(LocalCommunicator, RefusesNegativeCountsAndOffsets) {
  auto comm = make_local_communicator();
  std::vector<std::byte> send(16), recv(16);
  const std::int64_t ok[] = {4}, negative[] = {-4};
  EXPECT_THROW(comm->alltoallv(send.data(), negative, ok, recv.data(), negative, ok), InvalidArgument);
  EXPECT_THROW(comm->alltoallv(send.data(), ok, negative, recv.data(), ok, ok), InvalidArgument);
  EXPECT_THROW(comm->alltoallv(send.data(), ok, ok, recv.data(), ok, negative), InvalidArgument);
  EXPECT_EQ(comm->traffic().exchanges, 0);  // refused before counting
}

}  // namespace
}  // namespace stsa::dist
