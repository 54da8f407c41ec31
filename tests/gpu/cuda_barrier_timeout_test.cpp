// The report a timed-out barrier wait leaves (src/cuda/barrier_timeout.hpp), on
// the host: its encoding, and the names of the sm90 attention kernel's barriers
// at their offsets, worked out here from the layout the kernel's static_assert
// ties itself to (Q, stages of K, stages of V, then the barriers). No GPU needed.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "cuda/barrier_timeout.hpp"

namespace stsa::cuda_detail {
namespace {

TEST(BarrierTimeout, TheWaitRoundTripsThroughItsWord) {
  for (const std::uint32_t offset : {0u, 24u, 163928u, 0xFFFFFu})
    for (const std::uint32_t parity : {0u, 1u})
      for (const std::uint32_t block : {0u, 131u, 0x3FFFFFu})
        for (const std::uint32_t thread : {0u, 257u, 383u, 1023u}) {
          const BarrierWait w = decode_barrier_wait(encode_barrier_wait(offset, parity, block, thread));
          EXPECT_TRUE(w.written);
          EXPECT_EQ(w.offset, offset);
          EXPECT_EQ(w.parity, parity);
          EXPECT_EQ(w.block, block);
          EXPECT_EQ(w.thread, thread);
        }
  EXPECT_FALSE(decode_barrier_wait(0).written);
}

TEST(BarrierTimeout, NamesEveryBarrierOfBothLayouts) {
  // D = 128: Q 32 KB + 2 x 2 stages x 32 KB = 160 KB, then 12 barriers.
  const std::uint32_t d128 = 163840;
  EXPECT_EQ(sm90_barrier_name(d128), "q_full (D = 128 layout)");
  EXPECT_EQ(sm90_barrier_name(d128 + 8), "q_empty (D = 128 layout)");
  EXPECT_EQ(sm90_barrier_name(d128 + 16), "k_full[0] (D = 128 layout)");
  EXPECT_EQ(sm90_barrier_name(d128 + 24), "k_full[1] (D = 128 layout)");
  EXPECT_EQ(sm90_barrier_name(d128 + 32), "k_empty[0] (D = 128 layout)");
  EXPECT_EQ(sm90_barrier_name(d128 + 48), "v_full[0] (D = 128 layout)");
  EXPECT_EQ(sm90_barrier_name(d128 + 72), "v_empty[1] (D = 128 layout)");
  EXPECT_EQ(sm90_barrier_name(d128 + 80), "turn[0] (D = 128 layout)");
  EXPECT_EQ(sm90_barrier_name(d128 + 88), "turn[1] (D = 128 layout)");
  // D = 64: Q 16 KB + 2 x 4 stages x 16 KB = 144 KB, then 20 barriers.
  const std::uint32_t d64 = 147456;
  EXPECT_EQ(sm90_barrier_name(d64), "q_full (D = 64 layout)");
  EXPECT_EQ(sm90_barrier_name(d64 + 8 * 5), "k_full[3] (D = 64 layout)");
  EXPECT_EQ(sm90_barrier_name(d64 + 8 * 6), "k_empty[0] (D = 64 layout)");
  EXPECT_EQ(sm90_barrier_name(d64 + 8 * 13), "v_full[3] (D = 64 layout)");
  EXPECT_EQ(sm90_barrier_name(d64 + 8 * 17), "v_empty[3] (D = 64 layout)");
  EXPECT_EQ(sm90_barrier_name(d64 + 8 * 19), "turn[1] (D = 64 layout)");
  // Anything else is said to be something else.
  for (const std::uint32_t other : {0u, 24u, d64 + 8 * 20, d128 - 8, d128 + 4, d128 + 96})
    EXPECT_NE(sm90_barrier_name(other).find("not a barrier of the sm90 attention kernel"), std::string::npos)
        << other;
}

TEST(BarrierTimeout, DescribesTheWaitInOneSentence) {
  const std::uint64_t words[2] = {encode_barrier_wait(163840 + 32, 1, 17, 300), 0x00000000800000ffull};
  const std::string text = describe_barrier_timeout(words);
  for (const char* part : {"block 17, thread 300 (warpgroup 2, a consumer, warp 9)", "parity 1 of k_empty[0] (D = 128",
                           "0x00000000800000ff"})
    EXPECT_NE(text.find(part), std::string::npos) << part << " in: " << text;
  const std::uint64_t producer[2] = {encode_barrier_wait(163840 + 8, 0, 0, 0), 0};
  EXPECT_NE(describe_barrier_timeout(producer).find("warpgroup 0, the producer"), std::string::npos);
  const std::uint64_t nothing[2] = {0, 0};
  EXPECT_EQ(describe_barrier_timeout(nothing), "");
}

}  // namespace
}  // namespace stsa::cuda_detail
