// Token permutation: the index map, one-pass gather/scatter of a head subset,
// bit-identical round trips on awkward shapes and dtypes, and argument checks.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "stsa/error.hpp"
#include "stsa/permute.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

const std::vector<VideoGrid> kGrids = {
    {1, 3, 5, 0, TextPlacement::After},    // one frame
    {2, 1, 1, 0, TextPlacement::After},    // one token per frame
    {5, 7, 9, 13, TextPlacement::Before},  // text before, ragged
    {4, 5, 6, 70, TextPlacement::After},   // text after
    {13, 3, 11, 1, TextPlacement::Before},
};

TEST(PermutationMap, IsABijectionKeepingFrameZeroAndText) {
  for (const auto& g : kGrids) {
    const auto map = permutation_map(g, TokenOrder::FrameMajor, TokenOrder::SpatialMajor);
    std::vector<std::int64_t> sorted = map;
    std::sort(sorted.begin(), sorted.end());
    for (std::int64_t i = 0; i < g.tokens(); ++i) ASSERT_EQ(sorted[std::size_t(i)], i) << g.describe();
    for (std::int64_t pos = 0; pos < g.tokens(); ++pos) {
      const TokenCoord c = g.coord(pos, TokenOrder::SpatialMajor);
      // Same token in both orders.
      const TokenCoord back = g.coord(map[std::size_t(pos)], TokenOrder::FrameMajor);
      ASSERT_EQ(c.is_text, back.is_text);
      ASSERT_EQ(c.frame, back.frame);
      ASSERT_EQ(c.patch, back.patch);
      ASSERT_EQ(c.text_index, back.text_index);
      // Text tokens and frame 0 keep their positions.
      if (c.is_text || c.frame == 0) {
        ASSERT_EQ(map[std::size_t(pos)], pos) << g.describe() << " pos " << pos;
      }
    }
    const auto inverse = permutation_map(g, TokenOrder::SpatialMajor, TokenOrder::FrameMajor);
    for (std::int64_t pos = 0; pos < g.tokens(); ++pos)
      ASSERT_EQ(inverse[std::size_t(map[std::size_t(pos)])], pos);
  }
}

// Random bits in every element (NaN patterns included): a permutation must move bits, not values.
void fill_bits(const Tensor& t, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* bytes = static_cast<unsigned char*>(t.view().data);
  for (std::size_t i = 0; i < t.bytes(); ++i) bytes[i] = static_cast<unsigned char>(rng());
}

std::uint64_t element_bits(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, std::int64_t d) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, static_cast<const std::byte*>(t.data) + t.offset(b, n, h, d) * std::int64_t(element_size(t.dtype)),
              element_size(t.dtype));
  return bits;
}

TEST(Permute, GatherPlacesTokensAndRoundTripIsBitIdentical) {
  const std::uint64_t seed = testing::fresh_seed();
  for (const auto& g : kGrids)
    for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::F8E4M3})
      for (MemoryLayout memory : {MemoryLayout::BNHD, MemoryLayout::BHND}) {
        SCOPED_TRACE(g.describe() + " " + std::string(to_string(dtype)) + " seed " + std::to_string(seed));
        const std::int64_t batch = 2, heads = 5, dim = 3, n = g.tokens();
        const std::vector<std::int64_t> subset = {3, 0, 4};
        Tensor q(dtype, batch, n, heads, dim, memory), k(dtype, batch, n, heads, dim, memory),
            v(dtype, batch, n, heads, dim, memory);
        fill_bits(q, seed);
        fill_bits(k, seed + 1);
        fill_bits(v, seed + 2);
        Tensor pq(dtype, batch, n, 3, dim), pk(dtype, batch, n, 3, dim), pv(dtype, batch, n, 3, dim);
        const TensorView src[] = {q.view(), k.view(), v.view()};
        const TensorView packed[] = {pq.view(), pk.view(), pv.view()};
        gather_heads(g, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, subset, src, packed, 2);
        for (int t = 0; t < 3; ++t)
          for (std::int64_t b = 0; b < batch; ++b)
            for (std::int64_t pos = 0; pos < n; ++pos) {
              const std::int64_t from = g.position(g.coord(pos, TokenOrder::SpatialMajor), TokenOrder::FrameMajor);
              for (std::size_t j = 0; j < subset.size(); ++j)
                for (std::int64_t d = 0; d < dim; ++d)
                  ASSERT_EQ(element_bits(packed[t], b, pos, std::int64_t(j), d),
                            element_bits(src[t], b, from, subset[j], d));
            }
        // Scatter back into a copy whose subset heads are scrambled; other heads must stay untouched.
        Tensor out(dtype, batch, n, heads, dim, memory);
        fill_bits(out, seed + 3);
        const Tensor before = out;
        const TensorView packed_q[] = {pq.view()};
        const TensorView dest[] = {out.view()};
        LseBuffer plse(batch, 3, n), lse(batch, heads, n);
        for (std::int64_t b = 0; b < batch; ++b)
          for (std::int64_t j = 0; j < 3; ++j)
            for (std::int64_t pos = 0; pos < n; ++pos) plse.view().at(b, j, pos) = float(b * 1000000 + j * 10000 + pos);
        scatter_heads(g, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, subset, packed_q, dest, plse.view(),
                      lse.view());
        for (std::int64_t b = 0; b < batch; ++b)
          for (std::int64_t pos = 0; pos < n; ++pos)
            for (std::int64_t h = 0; h < heads; ++h) {
              const auto it = std::find(subset.begin(), subset.end(), h);
              const TensorView& expected = it != subset.end() ? q.view() : before.view();
              for (std::int64_t d = 0; d < dim; ++d)
                ASSERT_EQ(element_bits(out.view(), b, pos, h, d), element_bits(expected, b, pos, h, d))
                    << "b " << b << " pos " << pos << " h " << h;
              if (it != subset.end()) {
                const std::int64_t j = it - subset.begin();
                const std::int64_t packed_pos =
                    g.position(g.coord(pos, TokenOrder::FrameMajor), TokenOrder::SpatialMajor);
                ASSERT_EQ(lse.view().at(b, h, pos), float(b * 1000000 + j * 10000 + packed_pos));
              }
            }
      }
}

TEST(Permute, LargeCopyUsesThreadsAndStaysExact) {
  const VideoGrid g{7, 30, 33, 5, TextPlacement::After};
  const std::int64_t n = g.tokens(), heads = 6, dim = 64;
  Tensor x(DType::BF16, 1, n, heads, dim), packed(DType::BF16, 1, n, heads, dim), back(DType::BF16, 1, n, heads, dim);
  const std::uint64_t seed = testing::fresh_seed();
  fill_bits(x, seed);
  fill_bits(packed, seed + 1);  // poisoned: every element must be written
  fill_bits(back, seed + 2);
  std::vector<std::int64_t> all(heads);
  std::iota(all.begin(), all.end(), 0);
  const TensorView src[] = {x.view()}, mid[] = {packed.view()}, dst[] = {back.view()};
  // Threads asked for explicitly: 0 would pick one on a one-core host. Three split the rows unevenly.
  gather_heads(g, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, all, src, mid, 3);
  scatter_heads(g, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, all, mid, dst, {}, {}, 3);
  // The packed rows are the permuted ones (a round trip alone passes any self-inverse mix-up).
  const auto map = permutation_map(g, TokenOrder::FrameMajor, TokenOrder::SpatialMajor);
  const std::size_t row = std::size_t(heads * dim) * element_size(DType::BF16);
  for (std::int64_t pos = 0; pos < n; ++pos)
    ASSERT_EQ(std::memcmp(static_cast<const std::byte*>(packed.view().data) + std::size_t(pos) * row,
                          static_cast<const std::byte*>(x.view().data) + std::size_t(map[std::size_t(pos)]) * row, row),
              0)
        << "packed row " << pos;
  EXPECT_EQ(std::memcmp(x.view().data, back.view().data, x.bytes()), 0);
}

// A gather may read a head twice (grouped-query attention's K/V head for two query
// heads): each packed head is its own copy. A scatter, which would write one head
// twice, refuses it.
TEST(Permute, AGatherCopiesAHeadListedTwiceAndAScatterRefusesIt) {
  const VideoGrid g{3, 2, 2, 1, TextPlacement::After};
  Tensor a(DType::BF16, 2, g.tokens(), 3, 8), packed(DType::BF16, 2, g.tokens(), 3, 8);
  testing::fill_normal(a.view(), testing::fresh_seed());
  const std::vector<std::int64_t> heads{1, 1, 0};
  const TensorView src[] = {a.view()}, dst[] = {packed.view()};
  gather_heads(g, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, heads, src, dst);
  const std::vector<std::int64_t> map = permutation_map(g, TokenOrder::FrameMajor, TokenOrder::SpatialMajor);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t n = 0; n < g.tokens(); ++n)
      for (std::int64_t j = 0; j < 3; ++j)
        for (std::int64_t d = 0; d < 8; ++d)
          ASSERT_EQ(packed.view().load(b, n, j, d), a.view().load(b, map[std::size_t(n)], heads[std::size_t(j)], d))
              << b << " " << n << " " << j << " " << d;
  Tensor back(DType::BF16, 2, g.tokens(), 3, 8);
  const TensorView from[] = {packed.view()}, to[] = {back.view()};
  try {
    scatter_heads(g, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, heads, from, to);
    ADD_FAILURE() << "a scatter writing head 1 twice ran";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("permutation head index 1 listed twice"), std::string::npos) << e.what();
  }
}

TEST(Permute, RejectsBadArguments) {
  const VideoGrid g{3, 2, 2, 0, TextPlacement::After};
  Tensor a(DType::F32, 1, g.tokens(), 4, 8), p2(DType::F32, 1, g.tokens(), 2, 8), p2b(DType::BF16, 1, g.tokens(), 2, 8);
  Tensor wrong_tokens(DType::F32, 1, g.tokens() + 1, 2, 8);
  const TensorView src[] = {a.view()};
  auto gather = [&](std::vector<std::int64_t> heads, TensorView packed) {
    const TensorView dst[] = {packed};
    gather_heads(g, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, heads, src, dst);
  };
  EXPECT_THROW(gather({0, 4}, p2.view()), InvalidArgument);           // out of range
  EXPECT_THROW(gather({0, -1}, p2.view()), InvalidArgument);
  EXPECT_THROW(gather({0}, p2.view()), InvalidArgument);              // packed head count
  EXPECT_THROW(gather({0, 1}, p2b.view()), InvalidArgument);          // dtype
  EXPECT_THROW(gather({0, 1}, wrong_tokens.view()), InvalidArgument); // tokens
  EXPECT_THROW(gather({0, 1}, a.view()), InvalidArgument);            // heads mismatch (4 vs 2)
  TensorView overlapping = a.view();
  overlapping.shape[2] = 2;
  EXPECT_THROW(gather({2, 3}, overlapping), InvalidArgument);         // aliasing
  EXPECT_NO_THROW(gather({2, 3}, p2.view()));
  LseBuffer lse(1, 4, g.tokens());
  const TensorView packed[] = {p2.view()}, dest[] = {a.view()};
  EXPECT_THROW(scatter_heads(g, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, std::vector<std::int64_t>{0, 1},
                             packed, dest, lse.view(), {}),
               InvalidArgument);  // one LSE view without the other
  TensorView none = p2.view();  // zero heads (a Tensor cannot have none; a view can)
  none.shape[2] = 0;
  EXPECT_NO_THROW(gather({}, none));  // nothing moves
}

TEST(CopyBandwidth, MeasuresSomethingPositive) {
  EXPECT_GT(measure_copy_gbps(std::size_t(1) << 20, 1), 0.0);
  EXPECT_THROW(measure_copy_gbps(16), InvalidArgument);
}

// Runs of heads adjacent in both tensors are copied as one block only where the
// heads really are adjacent in memory: consecutive head subsets between a BHND
// tensor and a BNHD one (either side), and channels with a stride other than 1.
TEST(Permute, ConsecutiveHeadsAndStridedChannelsMoveTheRightBits) {
  const VideoGrid g{3, 2, 3, 2, TextPlacement::Before};
  const std::int64_t batch = 2, heads = 5, dim = 4, n = g.tokens();
  const std::vector<std::int64_t> subset = {1, 2, 3};
  const std::uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Channel stride 2 (variant 2, source and destination): every other element of a buffer twice as large.
  Tensor wide_src(DType::BF16, batch, n, heads, 2 * dim);
  const auto strided = [&](const Tensor& t) {
    TensorView v = t.view();
    v.shape[3] = dim;
    v.stride[3] = 2;
    return v;
  };
  for (const int variant : {0, 1, 2}) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    Tensor src_t(DType::BF16, batch, n, heads, dim, variant == 0 ? MemoryLayout::BHND : MemoryLayout::BNHD);
    Tensor packed_t(DType::BF16, batch, n, 3, dim, variant == 1 ? MemoryLayout::BHND : MemoryLayout::BNHD);
    fill_bits(src_t, seed);
    fill_bits(wide_src, seed + 1);
    fill_bits(packed_t, seed + 2);
    const TensorView src[] = {variant == 2 ? strided(wide_src) : src_t.view()};
    const TensorView packed[] = {packed_t.view()};  // variant 2: channel strides 2 and 1
    gather_heads(g, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, subset, src, packed, 1);
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t pos = 0; pos < n; ++pos) {
        const std::int64_t from = g.position(g.coord(pos, TokenOrder::SpatialMajor), TokenOrder::FrameMajor);
        for (std::size_t j = 0; j < subset.size(); ++j)
          for (std::int64_t d = 0; d < dim; ++d)
            ASSERT_EQ(element_bits(packed[0], b, pos, std::int64_t(j), d), element_bits(src[0], b, from, subset[j], d))
                << "gather b " << b << " pos " << pos << " j " << j << " d " << d;
      }
    // And back into a scrambled copy of the source layout: the subset comes back, the rest is untouched.
    Tensor out_t = src_t, wide_out = wide_src;
    fill_bits(out_t, seed + 3);
    fill_bits(wide_out, seed + 3);
    const Tensor before_t = out_t, wide_before = wide_out;
    const TensorView dest[] = {variant == 2 ? strided(wide_out) : out_t.view()};
    const TensorView before = variant == 2 ? strided(wide_before) : before_t.view();
    scatter_heads(g, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, subset, packed, dest, {}, {}, 1);
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t pos = 0; pos < n; ++pos)
        for (std::int64_t h = 0; h < heads; ++h) {
          const bool moved = h >= 1 && h <= 3;
          for (std::int64_t d = 0; d < dim; ++d)
            ASSERT_EQ(element_bits(dest[0], b, pos, h, d), element_bits(moved ? src[0] : before, b, pos, h, d))
                << "scatter b " << b << " pos " << pos << " h " << h << " d " << d;
        }
    if (variant == 2) {  // the elements between the strided channels are not the tensor's: untouched
      const auto* got = static_cast<const unsigned char*>(wide_out.view().data);
      const auto* was = static_cast<const unsigned char*>(wide_before.view().data);
      for (std::size_t i = 0; i < wide_out.bytes(); i += 4)
        ASSERT_TRUE(got[i + 2] == was[i + 2] && got[i + 3] == was[i + 3]) << "byte " << i + 2;
    }
  }
}

// The LSE views of a scatter are checked like the tensors: shapes against the
// head count, batch and tokens, and no overlap between source and destination.
TEST(Permute, ScatterRefusesBadLseViews) {
  const VideoGrid g{3, 2, 2, 0, TextPlacement::After};
  const std::int64_t n = g.tokens();
  Tensor full(DType::F32, 1, n, 4, 8), packed(DType::F32, 1, n, 2, 8);
  const TensorView p[] = {packed.view()}, d[] = {full.view()};
  const std::vector<std::int64_t> heads = {0, 3};
  LseBuffer plse(1, 2, n), lse(1, 4, n), plse_three(1, 3, n);
  EXPECT_NO_THROW(scatter_heads(g, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, heads, p, d, plse.view(), lse.view()));
  EXPECT_THROW(scatter_heads(g, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, heads, p, d, plse_three.view(),
                             lse.view()),
               InvalidArgument);  // three packed LSE heads for two heads
  LseView overlapping = lse.view();
  overlapping.shape[1] = 2;  // the packed LSE inside the destination's
  EXPECT_THROW(scatter_heads(g, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, heads, p, d, overlapping, lse.view()),
               InvalidArgument);
  Tensor other_dim(DType::F32, 1, n, 2, 4);
  const TensorView narrow[] = {other_dim.view()};
  EXPECT_THROW(scatter_heads(g, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, heads, narrow, d), InvalidArgument);
}

// What a permutation writes must be writable element by element: two elements of
// one destination at one address would keep one of two values, and a destination
// over another pair's source would be read after it was written. Refused before
// any copy, so the caller's tensors are as they were.
TEST(Permute, RefusesDestinationsThatWouldLoseValues) {
  const VideoGrid g{3, 2, 2, 0, TextPlacement::After};
  const std::int64_t n = g.tokens();
  Tensor q(DType::F32, 1, n, 4, 8), k(DType::F32, 1, n, 4, 8), pq(DType::F32, 1, n, 2, 8), pk(DType::F32, 1, n, 2, 8);
  testing::fill_normal(q.view(), 1);
  testing::fill_normal(k.view(), 2);
  testing::fill_normal(pq.view(), 3);
  testing::fill_normal(pk.view(), 4);
  const auto values = [](const Tensor& t) {
    std::vector<float> out;
    const TensorView v = t.view();
    for (std::int64_t b = 0; b < v.shape[0]; ++b)
      for (std::int64_t i = 0; i < v.shape[1]; ++i)
        for (std::int64_t h = 0; h < v.shape[2]; ++h)
          for (std::int64_t d = 0; d < v.shape[3]; ++d) out.push_back(v.load(b, i, h, d));
    return out;
  };
  const auto before = std::vector{values(q), values(k), values(pq), values(pk)};
  const auto unchanged = [&] { return std::vector{values(q), values(k), values(pq), values(pk)} == before; };
  const std::vector<std::int64_t> heads = {1, 3};
  const auto gather = [&](TensorView packed_q, TensorView packed_k) {
    const TensorView sources[] = {q.view(), k.view()}, packed[] = {packed_q, packed_k};
    gather_heads(g, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, heads, sources, packed);
  };
  TensorView same_address = pq.view();
  same_address.stride[2] = 0;  // both packed heads at one address
  EXPECT_THROW(gather(same_address, pk.view()), InvalidArgument);
  TensorView over_k = k.view();  // the packed Q over heads 0-1 of K, which the second pair reads after
  over_k.shape[2] = 2;
  EXPECT_THROW(gather(over_k, pk.view()), InvalidArgument);
  EXPECT_THROW(gather(pq.view(), pq.view()), InvalidArgument);  // both pairs write one tensor
  EXPECT_TRUE(unchanged());

  const TensorView packed[] = {pq.view(), pk.view()};
  TensorView q_same_address = q.view();
  q_same_address.stride[1] = 0;  // every token of the destination at one address
  const TensorView bad_dests[] = {q_same_address, k.view()};
  EXPECT_THROW(scatter_heads(g, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, heads, packed, bad_dests),
               InvalidArgument);
  // The second pair writes into pq, which the first pair reads.
  const TensorView crossing[] = {q.view(), pq.view()};
  EXPECT_THROW(scatter_heads(g, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, std::vector<std::int64_t>{0, 1},
                             packed, crossing),
               InvalidArgument);
  const TensorView dests[] = {q.view(), k.view()};
  LseBuffer plse(1, 2, n), lse(1, 4, n);
  LseView lse_same_address = lse.view();
  lse_same_address.stride[2] = 0;
  EXPECT_THROW(scatter_heads(g, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, heads, packed, dests, plse.view(),
                             lse_same_address),
               InvalidArgument);
  EXPECT_TRUE(unchanged());
  EXPECT_NO_THROW(gather(pq.view(), pk.view()));
  EXPECT_NO_THROW(scatter_heads(g, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, heads, packed, dests, plse.view(),
                                lse.view()));
}

// One pass copies every pair for the batch entries of the first: a pair with fewer
// was read and written past its end (768 bytes beyond a batch-1 packed view).
TEST(Permute, RefusesPairsWithAnotherBatch) {
  const VideoGrid g{3, 2, 2, 0, TextPlacement::After};
  const std::int64_t n = g.tokens();
  Tensor q(DType::F32, 2, n, 4, 8), pq(DType::F32, 2, n, 2, 8), k(DType::F32, 2, n, 4, 8), pk(DType::F32, 2, n, 2, 8);
  testing::fill_normal(pk.view(), 1);
  const Tensor pk_before = pk;
  TensorView k_one = k.view(), pk_one = pk.view();  // batch entry 0 of each; entry 1 stands for what lies past it
  k_one.shape[0] = pk_one.shape[0] = 1;
  const std::vector<std::int64_t> heads = {1, 3};
  const TensorView sources[] = {q.view(), k_one}, packed[] = {pq.view(), pk_one};
  EXPECT_THROW(gather_heads(g, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, heads, sources, packed, 1),
               InvalidArgument);
  EXPECT_EQ(std::memcmp(pk.view().data, pk_before.view().data, pk.bytes()), 0);
  Tensor o(DType::F32, 2, n, 4, 8), o2(DType::F32, 2, n, 4, 8);
  TensorView o_one = o2.view();
  o_one.shape[0] = 1;
  const TensorView from[] = {pq.view(), pk_one}, dests[] = {o.view(), o_one};
  EXPECT_THROW(scatter_heads(g, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, heads, from, dests, {}, {}, 1),
               InvalidArgument);
}

// A scatter's LSE rows are written in the same pass as O: an LSE destination over
// an O destination or over a packed tensor, or an O destination over the packed
// LSE, would keep one of two values or be read after it was written.
TEST(Permute, ScatterRefusesLseOverTheTensors) {
  const VideoGrid g{3, 2, 2, 0, TextPlacement::After};
  const std::int64_t n = g.tokens();
  Tensor packed_o(DType::F32, 1, n, 2, 8), o(DType::F32, 1, n, 4, 8);
  LseBuffer plse(1, 2, n), lse(1, 4, n);
  const std::vector<std::int64_t> heads = {0, 3};
  const auto scatter = [&](const TensorView& from, const TensorView& to, const LseView& from_lse,
                           const LseView& to_lse) {
    const TensorView packed[] = {from}, dests[] = {to};
    scatter_heads(g, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, heads, packed, dests, from_lse, to_lse, 1);
  };
  // An [1, 4, N] float view over the first 4 N floats of a tensor.
  const auto lse_over = [&](const Tensor& t) {
    return LseView::contiguous(static_cast<float*>(t.view().data), 1, 4, n);
  };
  const auto packed_lse_over = [&](const Tensor& t) {
    return LseView::contiguous(static_cast<float*>(t.view().data), 1, 2, n);
  };
  EXPECT_THROW(scatter(packed_o.view(), o.view(), plse.view(), lse_over(o)), InvalidArgument);
  EXPECT_THROW(scatter(packed_o.view(), o.view(), plse.view(), lse_over(packed_o)), InvalidArgument);
  EXPECT_THROW(scatter(packed_o.view(), o.view(), packed_lse_over(o), lse.view()), InvalidArgument);
  EXPECT_NO_THROW(scatter(packed_o.view(), o.view(), plse.view(), lse.view()));
}

}  // namespace
}  // namespace stsa
