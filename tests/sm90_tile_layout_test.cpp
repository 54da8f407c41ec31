// The sm90 kernel's shared-memory arithmetic, checked on the host against an
// independent model of the hardware (PTX ISA: TMA's 128-byte swizzle, wgmma's
// canonical K-major and MN-major layouts, the matrix descriptor format). The
// kernel itself runs only on an H200; this is what can be verified without one.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/sm90_tile_layout.hpp"

namespace stsa::cuda_detail {
namespace {

namespace L = sm90_layout;

// The 128-byte swizzle acts on shared-memory byte addresses: bits 4-6 (the
// 16-byte chunk in a 128-byte row) are XORed with bits 7-9 (the row mod 8).
std::uint32_t swizzle_128b(std::uint32_t address) { return address ^ (((address >> 7) & 7) << 4); }

// Descriptor fields back from the 64-bit word.
struct Fields {
  std::uint32_t start, leading, stride, base_offset, swizzle;
};
Fields decode(std::uint64_t d) {
  return {std::uint32_t(d & 0x3FFF) << 4, std::uint32_t((d >> 16) & 0x3FFF) << 4, std::uint32_t((d >> 32) & 0x3FFF) << 4,
          std::uint32_t((d >> 49) & 7), std::uint32_t(d >> 62)};
}

// Where wgmma reads element (m, k) of a K-major operand, for bf16/fp16 (T = 8
// elements per 16 bytes): ((8, m), (T, 2k)) : ((8T, SBO), (1, T)) elements, then swizzled.
std::uint32_t k_major_read(const Fields& f, std::uint32_t m, std::uint32_t k) {
  const std::uint32_t unswizzled = f.start + (m % 8) * 128 + (m / 8) * f.stride + (k % 8) * 2 + (k / 8) * 16;
  return swizzle_128b(unswizzled);
}

// Where wgmma reads element (k, n) of an MN-major operand:
// ((T, 8, n), (8, k)) : ((1, T, LBO), (8T, SBO)) elements, then swizzled.
std::uint32_t mn_major_read(const Fields& f, std::uint32_t k, std::uint32_t n) {
  const std::uint32_t unswizzled = f.start + (n % 64) * 2 + (n / 64) * f.leading + (k % 8) * 128 + (k / 8) * f.stride;
  return swizzle_128b(unswizzled);
}

TEST(Sm90TileLayout, DescriptorFieldsFollowThePtxFormat) {
  const Fields f = decode(matrix_descriptor(0x1F400, 16384, 1024));
  EXPECT_EQ(f.start, 0x1F400u);
  EXPECT_EQ(f.leading, 16384u);
  EXPECT_EQ(f.stride, 1024u);
  EXPECT_EQ(f.base_offset, 0u);
  EXPECT_EQ(f.swizzle, 1u);  // 128-byte swizzle
  // The PTX ISA's worked example encodes an LBO of 256 bf16 (512 bytes) as 32.
  EXPECT_EQ((matrix_descriptor(0, 512, 1024) >> 16) & 0x3FFF, 32u);
  EXPECT_EQ((matrix_descriptor(0, 512, 1024) >> 32) & 0x3FFF, 64u);
}

TEST(Sm90TileLayout, TmaPlacementIsAPermutationOfEachColumnBlock) {
  // Every element of a 128 x 128 tile lands on its own two bytes, inside its block.
  std::vector<int> seen(2 * 128 * 128 / 2, 0);
  for (std::uint32_t r = 0; r < 128; ++r)
    for (std::uint32_t c = 0; c < 128; ++c) {
      const std::uint32_t at = L::element_offset(r, c, 128);
      ASSERT_EQ(at % 2, 0u);
      ASSERT_EQ(at / L::column_block_bytes(128), c / 64);
      ++seen[at / 2];
    }
  for (const int count : seen) ASSERT_EQ(count, 1);
  // The model's swizzle and the placement agree (block bases are 1024-aligned).
  EXPECT_EQ(L::element_offset(3, 9, 128), swizzle_128b(3 * 128 + 18));
}

// S = Q K^T: for every k-step, the A descriptor (Q rows of each consumer
// warpgroup) and the B descriptor (K) read exactly the elements the product needs.
TEST(Sm90TileLayout, KMajorStepsReadTheRightQueryAndKeyElements) {
  constexpr std::uint32_t kTileBase = 4 * 1024;  // any 1024-aligned base
  for (const std::uint32_t head_dim : {64u, 128u})
    for (std::uint32_t step = 0; step < head_dim / 16; ++step) {
      for (std::uint32_t group = 0; group < 2; ++group) {
        const Fields q = decode(
            matrix_descriptor(kTileBase + L::k_major_step_offset(step, group * 64, 128), 16, L::kGroupBytes));
        for (std::uint32_t m = 0; m < 64; ++m)
          for (std::uint32_t k = 0; k < 16; ++k)
            ASSERT_EQ(k_major_read(q, m, k), kTileBase + L::element_offset(group * 64 + m, step * 16 + k, 128))
                << "Q: D " << head_dim << " step " << step << " group " << group << " m " << m << " k " << k;
      }
      const Fields key = decode(matrix_descriptor(kTileBase + L::k_major_step_offset(step, 0, 128), 16, L::kGroupBytes));
      for (std::uint32_t n = 0; n < 128; ++n)
        for (std::uint32_t k = 0; k < 16; ++k)
          ASSERT_EQ(k_major_read(key, n, k), kTileBase + L::element_offset(n, step * 16 + k, 128))
              << "K: step " << step << " key " << n << " k " << k;
    }
}

// O += P V: V is stored [key][d]; as the B operand (K = keys, N = d) it is
// MN-major, and each 16-key step must read V(16 step + k, n) for every d = n.
TEST(Sm90TileLayout, MnMajorStepsReadTheRightValueElements) {
  constexpr std::uint32_t kTileBase = 64 * 1024;
  for (const std::uint32_t head_dim : {64u, 128u})
    for (std::uint32_t step = 0; step < 8; ++step) {
      const Fields v = decode(matrix_descriptor(kTileBase + L::mn_major_step_offset(step), L::column_block_bytes(128),
                                                L::kGroupBytes));
      for (std::uint32_t k = 0; k < 16; ++k)
        for (std::uint32_t n = 0; n < head_dim; ++n)
          ASSERT_EQ(mn_major_read(v, k, n), kTileBase + L::element_offset(step * 16 + k, n, 128))
              << "V: D " << head_dim << " step " << step << " key " << k << " d " << n;
    }
}

}  // namespace
}  // namespace stsa::cuda_detail
