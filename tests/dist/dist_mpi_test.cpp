// Ulysses over MPI: run under `mpirun -np P` (P = 1, 2, 4). Every rank builds
// the same full problem (shared seed), computes the single-device result, runs
// the distributed call on its shard and checks that its rows are bit-identical
// to the single-device rows, and that it moved exactly the Ulysses volume.
// Every rank runs the same tests in the same order; a failure on one rank is
// reported by that rank and turns every rank's exit code non-zero.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "dist_testing.hpp"

namespace stsa::dist {
namespace {

Communicator* world = nullptr;

using namespace stsa::dist_testing;  // the shared problem, shards and comparisons of these tests
using stsa::testing::compare_with_reference;
using stsa::testing::make_problem;

// Fresh inputs every run, the same on every rank.
std::uint64_t shared_seed() {
  const std::uint64_t mine = stsa::testing::fresh_seed();
  std::vector<std::uint64_t> all(std::size_t(world->size()));
  world->allgather(&mine, sizeof mine, all.data());
  return all[0];
}

// null_when_empty: a rank holding no token passes null views, its LSE's too (docs/distributed.md).
// kv_heads: K and V's heads (0: l.heads; fewer for grouped-query attention).
void expect_matches_single(const VideoLayout& l, DType dtype, const std::vector<MaskSpec>& masks, bool with_lse,
                           std::string_view backend_name = "cpu", bool descales = false,
                           bool null_when_empty = false, std::int64_t kv_heads = 0) {
  const int ranks = world->size(), rank = world->rank();
  const std::uint64_t seed = shared_seed();
  auto single = make_problem(l, dtype, reference_heads(l, masks), seed);
  if (descales) give_descales(single, seed);  // the shared seed: every rank holds the same factors
  const std::int64_t kv = kv_heads == 0 ? l.heads : kv_heads;
  if (kv != l.heads) {  // fresh K and V of kv heads, the same on every rank
    single.k = Tensor(dtype, l.batch, l.tokens(), kv, l.head_dim);
    single.v = Tensor(dtype, l.batch, l.tokens(), kv, l.head_dim);
    stsa::testing::fill_normal(single.k.view(), seed * 5 + 1);
    stsa::testing::fill_normal(single.v.view(), seed * 5 + 2);
  }
  SCOPED_TRACE(::testing::Message() << "rank " << rank << " of " << ranks << ", " << single.label);
  const Backend& engine = backend(backend_name);
  PlanCache plans;
  run_single(single, masks, with_lse, engine, plans);

  auto mine = shard_problem(single, masks, ranks, rank, with_lse);
  if (null_when_empty && mine.shard.count == 0) mine.call.lse.data = nullptr;
  const UlyssesReport report = ulysses_attention(*world, mine.call, engine, plans);

  // Same heads, same plans, same per-row reduction order: the bits must match.
  const VideoGrid& g = l.grid;
  const std::int64_t first = g.video_begin() + mine.shard.begin;
  const std::int64_t text_begin = g.text_placement == TextPlacement::Before ? 0 : g.video_end();
  EXPECT_EQ(compare_tokens(mine.o.view(), single.o.view(), first, mine.shard.count).differing_bits, 0);
  EXPECT_EQ(compare_tokens(mine.text_o.view(), single.o.view(), text_begin, g.text_tokens).differing_bits, 0);
  if (with_lse) {
    EXPECT_EQ(compare_lse(mine.lse.view(), single.lse.view(), first, mine.shard.count).differing_bits, 0);
    EXPECT_EQ(compare_lse(mine.text_lse.view(), single.lse.view(), text_begin, g.text_tokens).differing_bits, 0);
  }
  // ...and the single-device rows themselves are right (the comparison checks LSE too).
  if (with_lse) {
    const auto cmp = compare_with_reference(single, 24, seed);
    EXPECT_TRUE(cmp.ok()) << cmp.failure;
  }

  // Bytes: exactly the Ulysses volume; nothing between the exchanges.
  const UlyssesVolume expected = ulysses_volume(l, dtype, single.o.view().dtype, with_lse, ranks, rank, kv);
  EXPECT_EQ(report.scatter.bytes_sent, expected.scatter_sent);
  EXPECT_EQ(report.scatter.bytes_received, expected.scatter_received);
  EXPECT_EQ(report.gather.bytes_sent, expected.gather_sent);
  EXPECT_EQ(report.gather.bytes_received, expected.gather_received);
  EXPECT_EQ(report.local.bytes_sent + report.local.control_bytes_sent + report.local.collectives, 0);
  if (g.video_tokens() % ranks == 0) {
    EXPECT_EQ(double(report.scatter.bytes_sent + report.gather.bytes_sent),
              ulysses_formula_bytes(l, dtype, single.o.view().dtype, with_lse, ranks, kv));
  }
  EXPECT_EQ(report.local_heads, l.heads / ranks);
  EXPECT_EQ(report.local_kv_heads, kv / ranks);
  EXPECT_EQ(report.head_begin, rank * (l.heads / ranks));
}

TEST(Communicator, AllToAllDeliversEveryBlockToItsRank) {
  const int ranks = world->size(), rank = world->rank();
  // Rank r sends (r + 1) * (s + 1) bytes of value 16 r + s to rank s.
  std::vector<std::int64_t> send_counts, send_offsets, recv_counts, recv_offsets;
  std::int64_t send_total = 0, recv_total = 0;
  for (int s = 0; s < ranks; ++s) {
    send_offsets.push_back(send_total);
    send_counts.push_back((rank + 1) * (s + 1));
    send_total += send_counts.back();
    recv_offsets.push_back(recv_total);
    recv_counts.push_back((s + 1) * (rank + 1));
    recv_total += recv_counts.back();
  }
  std::vector<std::byte> send(static_cast<std::size_t>(send_total)), recv(static_cast<std::size_t>(recv_total));
  for (int s = 0; s < ranks; ++s)
    std::fill_n(send.begin() + send_offsets[std::size_t(s)], send_counts[std::size_t(s)], std::byte(16 * rank + s));
  const Traffic before = world->traffic();
  world->alltoallv(send.data(), send_counts, send_offsets, recv.data(), recv_counts, recv_offsets);
  const Traffic moved = world->traffic() - before;
  for (int s = 0; s < ranks; ++s)
    for (std::int64_t i = 0; i < recv_counts[std::size_t(s)]; ++i)
      ASSERT_EQ(recv[std::size_t(recv_offsets[std::size_t(s)] + i)], std::byte(16 * s + rank)) << "from rank " << s;
  EXPECT_EQ(moved.bytes_sent, send_total - send_counts[std::size_t(rank)]);
  EXPECT_EQ(moved.bytes_received, recv_total - recv_counts[std::size_t(rank)]);

  double values[] = {double(rank), double(rank), double(rank)};
  world->allreduce(std::span<double>(values, 1), ReduceOp::Sum);
  world->allreduce(std::span<double>(values + 1, 1), ReduceOp::Max);
  world->allreduce(std::span<double>(values + 2, 1), ReduceOp::Min);
  EXPECT_EQ(values[0], ranks * (ranks - 1) / 2.0);
  EXPECT_EQ(values[1], ranks - 1.0);
  EXPECT_EQ(values[2], 0.0);
  world->barrier();
}

TEST(Ulysses, SpatialHeadsEvenShards) {
  const VideoLayout l = make_layout(VideoGrid{3, 6, 8}, 8, 64);  // 144 tokens: P = 1, 2, 4 divide it
  expect_matches_single(l, DType::F32, {mask_for_density(l.grid, SparseKind::Spatial, 0.25)}, true);
}

TEST(Ulysses, UnevenShardsMixedSpatialTemporalHeadsBf16) {
  const VideoLayout l = make_layout(VideoGrid{3, 5, 7}, 4, 80, 2);  // 105 tokens: uneven for P = 2, 4
  expect_matches_single(l, DType::BF16, mixed_masks(l.grid, 4, 0.25), true);
}

TEST(Ulysses, TextTokensBefore) {
  const VideoLayout l = make_layout(VideoGrid{2, 6, 6, 13, TextPlacement::Before}, 8, 128);
  expect_matches_single(l, DType::F32, mixed_masks(l.grid, 8, 0.3), true);
}

TEST(Ulysses, TextTokensAfterAllTemporalWithoutLse) {
  const VideoLayout l = make_layout(VideoGrid{4, 4, 5, 7, TextPlacement::After}, 4, 64);
  expect_matches_single(l, DType::F32, {mask_for_density(l.grid, SparseKind::Temporal, 0.2)}, false);
}

TEST(Ulysses, MoreRanksThanVideoTokens) {
  const VideoLayout l = make_layout(VideoGrid{1, 1, 3, 2, TextPlacement::After}, 4, 64);  // rank 3 of 4 holds nothing
  expect_matches_single(l, DType::F32, {MaskSpec::dense()}, true);
}

// Without text, a rank past the last video token holds no output row: it may pass a null LSE
// while the others want theirs (the ranks disagreed on "whether LSE is wanted").
TEST(Ulysses, ARankWithoutTokensPassesNullViews) {
  const VideoLayout l = make_layout(VideoGrid{1, 1, 3, 0, TextPlacement::After}, 4, 64);  // rank 3 of 4: nothing
  expect_matches_single(l, DType::F32, {MaskSpec::dense()}, true, "cpu", false, /*null_when_empty=*/true);
}

TEST(Ulysses, DescalesFollowTheirHeadsToEveryRank) {
  const VideoLayout l = make_layout(VideoGrid{3, 5, 6, 4, TextPlacement::After}, 8, 64, 2);
  expect_matches_single(l, DType::F8E4M3, mixed_masks(l.grid, 8, 0.3), true, "cpu", /*descales=*/true);
  expect_matches_single(l, DType::F32, mixed_masks(l.grid, 8, 0.3), true, "reference", /*descales=*/true);
}

// Grouped-query attention: 8 query heads reading 4 K/V heads, each rank holding its query
// heads' K/V heads (P = 1, 2, 4); temporal heads among them share a K/V head with a spatial one.
TEST(Ulysses, GroupedKvHeadsTravelWithTheirQueryHeads) {
  const VideoLayout l = make_layout(VideoGrid{3, 5, 6, 4, TextPlacement::Before}, 8, 64, 2);
  expect_matches_single(l, DType::BF16, mixed_masks(l.grid, 8, 0.3), true, "cpu", /*descales=*/false,
                        /*null_when_empty=*/false, /*kv_heads=*/4);
  expect_matches_single(l, DType::F32, mixed_masks(l.grid, 8, 0.3), true, "reference", false, false, 4);
}

// K/V heads that do not split over the ranks are refused on every rank alike (P = 2 and 4 for 1 K/V head).
TEST(UlyssesErrors, KvHeadsThatDoNotSplitOverTheRanksAreRefusedEverywhere) {
  const int ranks = world->size();
  if (ranks == 1) return;
  const VideoLayout l = make_layout(VideoGrid{3, 4, 4}, 4, 64);
  const std::vector<MaskSpec> masks{MaskSpec::dense()};
  auto single = make_problem(l, DType::F32, reference_heads(l, masks), 1);
  single.k = Tensor(DType::F32, 1, l.tokens(), 1, 64);
  single.v = Tensor(DType::F32, 1, l.tokens(), 1, 64);
  auto mine = shard_problem(single, masks, ranks, world->rank(), true);
  PlanCache plans;
  try {
    ulysses_attention(*world, mine.call, backend("cpu"), plans);
    ADD_FAILURE() << "1 K/V head over " << ranks << " ranks ran";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("1 K/V heads (grouped-query attention) cannot be split over"),
              std::string::npos)
        << e.what();
  }
}

TEST(Ulysses, ReferenceBackendAlsoBitIdentical) {
  const VideoLayout l = make_layout(VideoGrid{3, 5, 7, 5, TextPlacement::Before}, 4, 64);
  expect_matches_single(l, DType::F32, mixed_masks(l.grid, 4, 0.25), true, "reference");
}

// Routing after the exchange, on each rank's own heads, decides exactly as one device does.
TEST(Ulysses, RoutesEachRanksHeadsLikeOneDevice) {
  const int ranks = world->size(), rank = world->rank();
  const VideoLayout l = make_layout(VideoGrid{4, 6, 6, 5, TextPlacement::After}, 8, 64);
  const std::uint64_t seed = shared_seed();
  RouterOptions options;
  options.samples = 16;
  options.seed = seed;
  const Router router(options);
  auto single = make_problem(l, DType::F32, reference_heads(l, {MaskSpec::dense()}), seed);
  SCOPED_TRACE(::testing::Message() << "rank " << rank << " of " << ranks << ", " << single.label);
  const Backend& engine = backend("cpu");
  PlanCache plans;
  const RoutedResult decided = routed_attention(
      engine, plans, RoutedCall{l, single.q.view(), single.k.view(), single.v.view(), single.o.view(), single.lse.view()},
      router);

  auto mine = shard_problem(single, {}, ranks, rank, true);
  mine.call.router = &router;
  const UlyssesReport report = ulysses_attention(*world, mine.call, engine, plans);
  ASSERT_EQ(std::int64_t(report.routes.size()), l.heads / ranks);
  for (std::size_t h = 0; h < report.routes.size(); ++h) {
    const HeadRoute& expected = decided.heads[std::size_t(report.head_begin) + h];
    EXPECT_EQ(report.routes[h].route, expected.route) << "head " << report.head_begin + std::int64_t(h);
    EXPECT_EQ(report.routes[h].spec, expected.spec) << "head " << report.head_begin + std::int64_t(h);
  }
  const std::int64_t first = l.grid.video_begin() + mine.shard.begin;
  EXPECT_EQ(compare_tokens(mine.o.view(), single.o.view(), first, mine.shard.count).differing_bits, 0);
  EXPECT_EQ(compare_lse(mine.lse.view(), single.lse.view(), first, mine.shard.count).differing_bits, 0);
  EXPECT_EQ(compare_tokens(mine.text_o.view(), single.o.view(), l.grid.video_end(), l.grid.text_tokens).differing_bits, 0);
  EXPECT_EQ(report.local.collectives, 0);
}

// A rank with bad input must make every rank fail, with the same message, and
// leave the communicator usable (the next tests run on it).
TEST(UlyssesErrors, BadInputOnOneRankFailsOnEveryRank) {
  const int ranks = world->size(), rank = world->rank(), bad = ranks - 1;
  const VideoLayout l = make_layout(VideoGrid{2, 4, 4}, 4, 64);
  const std::vector<MaskSpec> masks{MaskSpec::dense()};
  auto p = make_problem(l, DType::F32, reference_heads(l, masks), 7);
  auto mine = shard_problem(p, masks, ranks, rank, true);
  if (rank == bad) mine.call.layout.head_dim = 80;  // the tensors say 64
  PlanCache plans;
  const auto start = std::chrono::steady_clock::now();
  try {
    ulysses_attention(*world, mine.call, backend("cpu"), plans);
    ADD_FAILURE() << "rank " << rank << ": bad input on rank " << bad << " was not reported";
  } catch (const DistError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank " + std::to_string(bad) + ": "), std::string::npos) << what;
    EXPECT_NE(what.find("shape"), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
}

TEST(UlyssesErrors, WrongShardSizeOnOneRank) {
  const int ranks = world->size(), rank = world->rank();
  const VideoLayout l = make_layout(VideoGrid{2, 4, 4}, 4, 64);
  const std::vector<MaskSpec> masks{MaskSpec::dense()};
  auto p = make_problem(l, DType::F32, reference_heads(l, masks), 8);
  auto mine = shard_problem(p, masks, ranks, rank, false);
  if (rank == 0)  // claims one token more than its shard; rejected before any access
    for (TensorView* t : {&mine.call.q, &mine.call.k, &mine.call.v, &mine.call.o}) t->shape[1] += 1;
  PlanCache plans;
  try {
    ulysses_attention(*world, mine.call, backend("cpu"), plans);
    ADD_FAILURE() << "a wrong shard size was not reported";
  } catch (const DistError& e) {
    EXPECT_NE(std::string(e.what()).find("should hold"), std::string::npos) << e.what();
  }
}

TEST(UlyssesErrors, RanksThatDisagreeOnMasks) {
  const int ranks = world->size(), rank = world->rank();
  if (ranks == 1) GTEST_SKIP() << "needs two ranks";
  const VideoLayout l = make_layout(VideoGrid{2, 4, 4}, 4, 64);
  const std::vector<MaskSpec> masks{rank == 0 ? MaskSpec::dense() : mask_for_density(l.grid, SparseKind::Spatial, 0.3)};
  auto p = make_problem(l, DType::F32, reference_heads(l, masks), 9);
  auto mine = shard_problem(p, masks, ranks, rank, false);
  PlanCache plans;
  try {
    ulysses_attention(*world, mine.call, backend("cpu"), plans);
    ADD_FAILURE() << "disagreeing masks were not reported";
  } catch (const DistError& e) {
    EXPECT_NE(std::string(e.what()).find("disagree on head masks"), std::string::npos) << e.what();
  }
}

TEST(UlyssesErrors, RankCountThatDoesNotDivideHeads) {
  const int ranks = world->size(), rank = world->rank();
  if (ranks == 1) GTEST_SKIP() << "one rank divides every head count";
  const VideoLayout l = make_layout(VideoGrid{2, 4, 4}, 3, 64);
  const std::vector<MaskSpec> masks{MaskSpec::dense()};
  auto p = make_problem(l, DType::F32, reference_heads(l, masks), 10);
  auto mine = shard_problem(p, masks, ranks, rank, false);
  PlanCache plans;
  try {
    ulysses_attention(*world, mine.call, backend("cpu"), plans);
    ADD_FAILURE() << "3 heads over " << ranks << " ranks were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("(1, 3)"), std::string::npos) << e.what();
  }
}

// What every rank must agree on besides the masks: the softmax scale, the tile
// shape and the router's options (its seed included). Rank 1 differs in one of
// them; every rank must name it.
TEST(UlyssesErrors, RanksThatDisagreeOnScaleTileOrRouter) {
  const int ranks = world->size(), rank = world->rank();
  if (ranks == 1) GTEST_SKIP() << "needs two ranks";
  const VideoLayout l = make_layout(VideoGrid{2, 4, 4}, 4, 64);
  const std::vector<MaskSpec> masks{MaskSpec::dense()};
  auto p = make_problem(l, DType::F32, reference_heads(l, masks), 11);
  PlanCache plans;
  RouterOptions options;
  options.samples = 8;
  options.threads = 1;
  const auto expect_disagreement = [&](const UlyssesCall& call, const std::string& field) {
    try {
      ulysses_attention(*world, call, backend("cpu"), plans);
      ADD_FAILURE() << "ranks that disagree on " << field << " were not reported";
    } catch (const DistError& e) {
      EXPECT_NE(std::string(e.what()).find("disagree on " + field), std::string::npos) << e.what();
    }
  };
  {
    auto mine = shard_problem(p, masks, ranks, rank, false);
    mine.call.softmax_scale = rank == 1 ? 0.25f : 0.125f;
    expect_disagreement(mine.call, "softmax scale");
  }
  {
    auto mine = shard_problem(p, masks, ranks, rank, false);
    mine.call.tile = TileShape{64, rank == 1 ? 128 : 64};
    expect_disagreement(mine.call, "tile columns");
  }
  {
    auto mine = shard_problem(p, masks, ranks, rank, false);
    const std::vector<float> factors(std::size_t(l.batch * l.heads), rank == 1 ? 0.5f : 0.25f);
    mine.call.descales.k = factors;
    expect_disagreement(mine.call, "descales");
  }
  {
    auto mine = shard_problem(p, {}, ranks, rank, false);
    RouterOptions o = options;
    if (rank == 1) o.seed = 2;
    const Router router(o);
    mine.call.router = &router;
    expect_disagreement(mine.call, "router options");
  }
}

// One mask for every head and H copies of it describe the same problem: ranks
// that give it either way agree, and the result is the single-device one.
TEST(Ulysses, OneMaskAndOneMaskPerHeadAgree) {
  const int ranks = world->size(), rank = world->rank();
  const VideoLayout l = make_layout(VideoGrid{3, 4, 4}, 4, 64);
  const MaskSpec spatial = mask_for_density(l.grid, SparseKind::Spatial, 0.3);
  const std::vector<MaskSpec> one{spatial}, each(4, spatial);
  auto single = make_problem(l, DType::F32, reference_heads(l, one), shared_seed());
  PlanCache plans;
  run_single(single, one, false, backend("cpu"), plans);
  auto mine = shard_problem(single, rank % 2 == 0 ? one : each, ranks, rank, false);
  ASSERT_NO_THROW(ulysses_attention(*world, mine.call, backend("cpu"), plans));
  EXPECT_EQ(compare_tokens(mine.o.view(), single.o.view(), mine.shard.begin, mine.shard.count).differing_bits, 0);
}

// The CPU backend under its own name, failing on one rank only: after the agreement, in the local attention.
class FailingOnRank final : public Backend {
 public:
  explicit FailingOnRank(bool fail) : fail_(fail) {}
  std::string_view name() const override { return "cpu"; }
  Support supports(const AttentionCall& call) const override { return backend("cpu").supports(call); }
  void run(const AttentionCall& call) const override {
    if (fail_) throw Error("this rank's attention failed");
    backend("cpu").run(call);
  }

 private:
  bool fail_;
};

// A failure in one rank's local attention (the last rank's) reaches every rank
// as a DistError that names it, before the return exchange: no rank waits in it.
TEST(UlyssesErrors, LocalFailureOnOneRankFailsOnEveryRank) {
  const int ranks = world->size(), rank = world->rank(), bad = ranks - 1;
  const VideoLayout l = make_layout(VideoGrid{2, 4, 4}, 4, 64);
  const std::vector<MaskSpec> masks{MaskSpec::dense()};
  auto p = make_problem(l, DType::F32, reference_heads(l, masks), 12);
  auto mine = shard_problem(p, masks, ranks, rank, false);
  PlanCache plans;
  const FailingOnRank engine(rank == bad);
  try {
    ulysses_attention(*world, mine.call, engine, plans);
    ADD_FAILURE() << "rank " << rank << ": the failure on rank " << bad << " was not reported";
  } catch (const DistError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("local attention failed"), std::string::npos) << what;
    EXPECT_NE(what.find("rank " + std::to_string(bad) + ": this rank's attention failed"), std::string::npos) << what;
  }
}

// Non-zero ranks print only failures, prefixed with their rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace stsa::dist

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  stsa::dist::MpiSession mpi;
  auto comm = mpi.world();
  comm->set_timeout(std::chrono::seconds(30));
  stsa::dist::world = comm.get();
  if (comm->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new stsa::dist::RankFailurePrinter(comm->rank()));
  }
  int failed = 0;
  try {
    failed = RUN_ALL_TESTS();
  } catch (const stsa::dist::CommTimeout& e) {
    std::fprintf(stderr, "[rank %d] %s\n", comm->rank(), e.what());
    comm->abort(3);
  }
  // Every rank exits with the worst result of all ranks.
  double worst = failed;
  comm->allreduce(std::span<double>(&worst, 1), stsa::dist::ReduceOp::Max);
  stsa::dist::world = nullptr;
  comm.reset();
  return worst != 0 ? 1 : 0;
}
