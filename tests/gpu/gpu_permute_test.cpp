// The GPU token permutation against the CPU one (permute.hpp): bit-exact
// gathers and scatters, both orders, text before and after, one frame, the
// 16-byte vector path and the element path, LSE rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_support.hpp"
#include "support/error_pattern.hpp"
#include "stsa/cuda.hpp"
#include "stsa/error.hpp"
#include "stsa/permute.hpp"

namespace stsa {
namespace {

using gpu_testing::tensor_bytes;

struct PermuteCase {
  VideoGrid grid;
  std::int64_t heads = 5, head_dim = 64;
  DType dtype = DType::BF16;
  MemoryLayout memory = MemoryLayout::BNHD;
  std::vector<std::int64_t> packed_heads{3, 0, 4};
};

DeviceBuffer to_device(const TensorView& host) {
  DeviceBuffer d(tensor_bytes(host));
  d.copy_from_host(host.data, tensor_bytes(host));
  return d;
}

TensorView on_device(TensorView host, const DeviceBuffer& d) {
  host.data = d.data();
  return host;
}

// The device result equals `expected` bit for bit; if not, error_pattern.hpp's
// row_mismatch says which rows differ and where the device took them from.
void expect_same_rows(const TensorView& expected, const DeviceBuffer& device, const TensorView& source,
                      const std::string& what) {
  std::vector<std::byte> bytes(tensor_bytes(expected));
  device.copy_to_host(bytes.data(), bytes.size());
  TensorView got = expected;
  got.data = bytes.data();
  const std::string mismatch = testing::row_mismatch(expected, got, source);
  EXPECT_EQ(mismatch, "") << what << ": " << mismatch;
}

void check_case(const PermuteCase& c, TokenOrder from, TokenOrder to) {
  const std::int64_t n = c.grid.tokens(), hp = std::int64_t(c.packed_heads.size());
  SCOPED_TRACE(c.grid.describe() + " " + std::string(to_string(from)) + " -> " + std::string(to_string(to)) +
               " D=" + std::to_string(c.head_dim) + " " + std::string(to_string(c.dtype)));
  Tensor full(c.dtype, 2, n, c.heads, c.head_dim, c.memory);
  testing::fill_normal(full.view(), testing::fresh_seed());
  Tensor packed_cpu(c.dtype, 2, n, hp, c.head_dim, c.memory);
  const std::vector<TensorView> src{full.view()}, packed_host{packed_cpu.view()};
  gather_heads(c.grid, from, to, c.packed_heads, src, packed_host);

  const DeviceBuffer full_d = to_device(full.view());
  DeviceBuffer packed_d(tensor_bytes(packed_cpu.view()));
  packed_d.fill_bytes(0xFF);
  const std::vector<TensorView> src_d{on_device(full.view(), full_d)}, packed_dv{on_device(packed_cpu.view(), packed_d)};
  cuda_gather_heads(c.grid, from, to, c.packed_heads, src_d, packed_dv);
  cuda_synchronize();
  expect_same_rows(packed_cpu.view(), packed_d, full.view(), "gather");

  // Scatter back into a poisoned copy: the packed heads come back bit-exact, the others stay poisoned.
  DeviceBuffer back_d(tensor_bytes(full.view()));
  back_d.fill_bytes(0xFF);
  LseBuffer packed_lse(2, hp, n), lse_cpu(2, c.heads, n);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < hp; ++h)
      for (std::int64_t i = 0; i < n; ++i) packed_lse.view().at(b, h, i) = float(b * 1000000 + h * 10000 + i);
  std::fill_n(lse_cpu.view().data, 2 * c.heads * n, -1.f);
  Tensor back_cpu(c.dtype, 2, n, c.heads, c.head_dim, c.memory);
  std::memset(back_cpu.view().data, 0xFF, back_cpu.bytes());
  const std::vector<TensorView> back_host{back_cpu.view()};
  scatter_heads(c.grid, to, from, c.packed_heads, packed_host, back_host, packed_lse.view(), lse_cpu.view());

  DeviceBuffer plse_d(std::size_t(2 * hp * n) * 4), lse_d(std::size_t(2 * c.heads * n) * 4);
  plse_d.copy_from_host(packed_lse.view().data, plse_d.bytes());
  std::vector<float> minus_one(std::size_t(2 * c.heads * n), -1.f);
  lse_d.copy_from_host(minus_one.data(), lse_d.bytes());
  LseView plse_v = packed_lse.view(), lse_v = lse_cpu.view();
  plse_v.data = static_cast<float*>(plse_d.data());
  lse_v.data = static_cast<float*>(lse_d.data());
  const std::vector<TensorView> back_dv{on_device(full.view(), back_d)};
  cuda_scatter_heads(c.grid, to, from, c.packed_heads, packed_dv, back_dv, plse_v, lse_v);
  cuda_synchronize();
  expect_same_rows(back_cpu.view(), back_d, packed_cpu.view(), "scatter");
  std::vector<float> lse_got(minus_one.size());
  lse_d.copy_to_host(lse_got.data(), lse_got.size() * 4);
  EXPECT_EQ(std::memcmp(lse_got.data(), lse_cpu.view().data, lse_got.size() * 4), 0) << "LSE scatter";
}

TEST(GpuPermute, MatchesTheCpuPermutationBitForBit) {
  STSA_REQUIRE_GPU();
  std::vector<PermuteCase> cases;
  cases.push_back({VideoGrid{4, 3, 5, 7, TextPlacement::After}});
  cases.push_back({VideoGrid{5, 4, 4, 9, TextPlacement::Before}, 5, 128, DType::F16});
  cases.push_back({VideoGrid{1, 6, 7, 0, TextPlacement::After}, 5, 64, DType::F32});
  cases.push_back({VideoGrid{3, 5, 5, 3, TextPlacement::After}, 5, 64, DType::BF16, MemoryLayout::BHND});
  cases.push_back({VideoGrid{2, 3, 7, 1, TextPlacement::After}, 5, 80, DType::BF16});  // 10 vectors per row
  cases.push_back({VideoGrid{3, 4, 6, 2, TextPlacement::Before}, 5, 5, DType::F16});  // element path: 10-byte rows
  cases.push_back({VideoGrid{7, 2, 3, 0, TextPlacement::After}, 5, 3, DType::F32, MemoryLayout::BHND});
  // fp8 rows: as 16-byte vectors, and one byte at a time (40-byte rows), where two-byte words went twice as far.
  cases.push_back({VideoGrid{2, 3, 5, 1, TextPlacement::After}, 5, 64, DType::F8E4M3});
  cases.push_back({VideoGrid{3, 4, 6, 2, TextPlacement::Before}, 5, 40, DType::F8E4M3});
  for (const auto& c : cases) {
    check_case(c, TokenOrder::FrameMajor, TokenOrder::SpatialMajor);
    check_case(c, TokenOrder::SpatialMajor, TokenOrder::FrameMajor);
  }
}

TEST(GpuPermute, ManyHeadsTakeSeveralLaunches) {
  STSA_REQUIRE_GPU();
  PermuteCase c{VideoGrid{3, 4, 4, 0, TextPlacement::After}, 70, 64};
  c.packed_heads.resize(67);
  std::iota(c.packed_heads.begin(), c.packed_heads.end(), 2);
  check_case(c, TokenOrder::FrameMajor, TokenOrder::SpatialMajor);
}

TEST(GpuPermuteInput, HostMemoryOrBadHeadsAreRejected) {
  const VideoGrid grid{2, 3, 3, 0, TextPlacement::After};
  Tensor full(DType::BF16, 1, grid.tokens(), 3, 16), packed(DType::BF16, 1, grid.tokens(), 2, 16);
  const std::vector<TensorView> src{full.view()}, dst{packed.view()};
  const std::vector<std::int64_t> heads{0, 1};
  EXPECT_THROW(cuda_gather_heads(grid, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, heads, src, dst),
               Unsupported);  // host memory, or no GPU at all
  if (cuda_device_count() == 0) return;
  const std::vector<std::int64_t> twice{1, 1};
  EXPECT_THROW(cuda_scatter_heads(grid, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, twice, dst, src),
               InvalidArgument);  // a scatter would write head 1 twice (a gather may read it twice)
}

// LSE views on the device that the scatter cannot take are refused before any
// launch (a misaligned float would fault and end the context); zero heads move nothing.
TEST(GpuPermuteInput, BadLseViewsAreRejectedAndZeroHeadsMoveNothing) {
  STSA_REQUIRE_GPU();
  const VideoGrid grid{2, 3, 3, 1, TextPlacement::After};
  const std::int64_t n = grid.tokens();
  Tensor full_host(DType::BF16, 1, n, 3, 16), packed_host(DType::BF16, 1, n, 2, 16);
  const std::uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  testing::fill_normal(full_host.view(), seed);  // random: a move where none is due shows
  testing::fill_normal(packed_host.view(), seed + 1);
  DeviceBuffer full_d = to_device(full_host.view()), packed_d = to_device(packed_host.view());
  const std::vector<TensorView> full{on_device(full_host.view(), full_d)}, packed{on_device(packed_host.view(), packed_d)};
  const std::vector<std::int64_t> heads{2, 0};
  DeviceBuffer packed_lse_d(std::size_t(2 * n) * 4 + 4), lse_d(std::size_t(3 * n) * 4 + 4);
  LseView packed_lse = LseView::contiguous(static_cast<float*>(packed_lse_d.data()), 1, 2, n);
  LseView lse = LseView::contiguous(static_cast<float*>(lse_d.data()), 1, 3, n);
  const auto scatter = [&](const LseView& from, const LseView& to) {
    cuda_scatter_heads(grid, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, heads, packed, full, from, to);
  };
  EXPECT_THROW(scatter(packed_lse, LseView{}), InvalidArgument);  // one side only
  EXPECT_THROW(scatter(LseView{}, lse), InvalidArgument);
  LseView misaligned = lse;
  misaligned.data = reinterpret_cast<float*>(static_cast<unsigned char*>(lse_d.data()) + 2);
  EXPECT_THROW(scatter(packed_lse, misaligned), InvalidArgument);
  LseView backwards = lse;
  backwards.stride[2] = -1;
  EXPECT_THROW(scatter(packed_lse, backwards), InvalidArgument);
  EXPECT_NO_THROW(scatter(packed_lse, lse));
  cuda_synchronize();

  // Zero heads (a Tensor cannot have none; a view can): random sources, poisoned
  // destinations, and not one destination byte changes, either way.
  const std::vector<std::int64_t> no_heads;
  TensorView none_view = packed[0];
  none_view.shape[2] = 0;
  const std::vector<TensorView> none{none_view};
  LseView no_packed_lse = packed_lse;
  no_packed_lse.shape[1] = 0;
  const auto all_poison = [](const DeviceBuffer& d) {
    std::vector<unsigned char> bytes(d.bytes());
    d.copy_to_host(bytes.data(), bytes.size());
    return std::all_of(bytes.begin(), bytes.end(), [](unsigned char b) { return b == 0xFF; });
  };
  full_d.copy_from_host(full_host.view().data, full_d.bytes());
  packed_d.fill_bytes(0xFF);
  EXPECT_NO_THROW(cuda_gather_heads(grid, TokenOrder::FrameMajor, TokenOrder::SpatialMajor, no_heads, full, none));
  cuda_synchronize();
  EXPECT_TRUE(all_poison(packed_d)) << "a gather of zero heads wrote its destination";

  packed_d.copy_from_host(packed_host.view().data, packed_d.bytes());
  std::vector<float> lse_values(packed_lse_d.bytes() / sizeof(float));
  std::mt19937_64 rng(seed + 2);
  std::normal_distribution<float> normal;
  for (float& x : lse_values) x = normal(rng);
  packed_lse_d.copy_from_host(lse_values.data(), packed_lse_d.bytes());
  full_d.fill_bytes(0xFF);
  lse_d.fill_bytes(0xFF);
  EXPECT_NO_THROW(cuda_scatter_heads(grid, TokenOrder::SpatialMajor, TokenOrder::FrameMajor, no_heads, none, full,
                                     no_packed_lse, lse));
  cuda_synchronize();
  EXPECT_TRUE(all_poison(full_d)) << "a scatter of zero heads wrote its destination";
  EXPECT_TRUE(all_poison(lse_d)) << "a scatter of zero heads wrote the LSE";
}

}  // namespace
}  // namespace stsa
