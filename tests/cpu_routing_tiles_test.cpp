// The router's products of bf16 pairs (routing_tiles.hpp) against plain fp64
// loops: scores of sampled rows against a key panel, on AMX tiles and with
// AVX-512 VDPBF16PS; on the tiles, weighted sums of V for many rows with some
// (row tile, key step) products marked dead, and the two-part split of the
// weights. Operands come from the library's packers (tested in cpu_pack_test):
// bf16 and fp8 values, and for the tiles fp16 values split into two parts; rows
// that are not a multiple of 32 exercise the single-tile blocks. Each unit's
// tests are skipped on a CPU without it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/isa.hpp"
#include "cpu/pack.hpp"
#include "cpu/routing_tiles.hpp"
#include "stsa/tensor.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

int parts_of(DType dtype) { return dtype == DType::F16 ? 2 : 1; }

// The isas whose units compute the scores here (Amx: tiles; Avx512: VDPBF16PS),
// and the values each takes (VDPBF16PS: no split fp16).
std::vector<Isa> score_units_here() {
  std::vector<Isa> here;
  for (const Isa isa : {Isa::Amx, Isa::Avx512})
    if (cpu::machine_supports(isa)) here.push_back(isa);
  return here;
}
std::vector<DType> score_dtypes(Isa unit) {
  if (unit == Isa::Amx) return {DType::BF16, DType::F16, DType::F8E4M3};
  return {DType::BF16, DType::F8E4M3};
}

struct Operands {
  Tensor q, k, v;  // [1, tokens, 1, head_dim]
  std::vector<std::uint32_t> q_pairs, kt_pairs, v_pairs;
};

// Random Q, K, V of `tokens` rows; Q's first `rows` rows, and K and V as the
// router packs them: tiles of kRoutingPanelKeys keys, `keys` of them in all
// (zero past `tokens`), the panels one after another.
Operands make_operands(DType dtype, std::int64_t tokens, int rows, int keys, int head_dim, std::uint64_t seed) {
  Operands x{Tensor(dtype, 1, tokens, 1, head_dim), Tensor(dtype, 1, tokens, 1, head_dim),
             Tensor(dtype, 1, tokens, 1, head_dim), {}, {}, {}};
  testing::fill_normal(x.q.view(), seed);
  testing::fill_normal(x.k.view(), seed + 1);
  testing::fill_normal(x.v.view(), seed + 2);
  const int parts = parts_of(dtype);
  const std::int64_t row_words = parts * head_dim / 2;
  x.q_pairs.assign(std::size_t(rows * row_words), 0u);
  for (int r = 0; r < rows; ++r) {
    if (parts == 1)
      cpu::load_row_pairs(x.q.view(), 0, r, 0, false, x.q_pairs.data() + r * row_words);
    else
      cpu::load_row_split_pairs(x.q.view(), 0, r, 0, false, x.q_pairs.data() + r * row_words);
  }
  constexpr int kPanel = cpu::kRoutingPanelKeys;
  const std::int64_t kt_panel = parts * head_dim / 2 * kPanel, v_panel = parts * kPanel / 2 * head_dim;
  x.kt_pairs.assign(std::size_t(keys / kPanel * kt_panel), 0xdeadbeefu);
  x.v_pairs.assign(std::size_t(keys / kPanel * v_panel), 0xdeadbeefu);
  const cpu::RowSource source{x.q.view(), x.k.view(), x.v.view()};
  for (int t = 0; t < keys / kPanel; ++t)
    cpu::pack_kv_tile(source, 0, 0, t, kPanel, nullptr, nullptr, x.kt_pairs.data() + t * kt_panel,
                      x.v_pairs.data() + t * v_panel);
  return x;
}

TEST(RoutingTiles, ScoresAreTheDotProducts) {
  if (score_units_here().empty()) GTEST_SKIP() << "neither AMX nor AVX-512 here";
  const std::uint64_t seed = testing::fresh_seed();
  for (const Isa unit : score_units_here())
    for (DType dtype : score_dtypes(unit))
      for (int head_dim : {64, 96, 128})
        for (int rows : {16, 48}) {
          SCOPED_TRACE(std::string(to_string(unit)) + " " + std::string(to_string(dtype)) + " D=" +
                       std::to_string(head_dim) + " rows " + std::to_string(rows) + " seed " + std::to_string(seed));
          constexpr int kKeys = 96;  // 90 real keys: the last panel ragged
          const Operands x = make_operands(dtype, 90, rows, kKeys, head_dim, seed);
          const int s_stride = kKeys + 16;
          std::vector<float> s(std::size_t(rows * s_stride), NAN);
          if (unit == Isa::Amx)
            cpu::routing_scores_amx(x.q_pairs.data(), x.kt_pairs.data(), rows, kKeys, head_dim, parts_of(dtype),
                                    s.data(), s_stride);
          else
            cpu::routing_scores_avx512(x.q_pairs.data(), x.kt_pairs.data(), rows, kKeys, head_dim, s.data(), s_stride);
          for (int r = 0; r < rows; ++r)
            for (int j = 0; j < s_stride; ++j) {
              const float got = s[std::size_t(r * s_stride + j)];
              if (j >= kKeys) {
                EXPECT_TRUE(std::isnan(got)) << "written past the keys asked for: row " << r << " column " << j;
                continue;
              }
              double want = 0, magnitude = 0;
              for (int d = 0; d < head_dim; ++d) {
                const double qd = x.q.view().load(0, r, 0, d);
                const double kd = j < 90 ? double(x.k.view().load(0, j, 0, d)) : 0.0;
                want += qd * kd;
                magnitude += std::abs(qd * kd);
              }
              // Exact products (split values: all four of their parts'), fp32 sums.
              EXPECT_NEAR(got, want, 2.0 * head_dim * 0x1p-24 * magnitude + 1e-30) << "row " << r << " key " << j;
            }
        }
}

TEST(RoutingTiles, WeightedSumsAddTheLiveProductsOnly) {
  if (!cpu::machine_supports(Isa::Amx)) GTEST_SKIP() << "no AMX here";
  const std::uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  for (DType dtype : {DType::BF16, DType::F16})
    for (int head_dim : {64, 128})
      for (int rows : {32, 48}) {
        SCOPED_TRACE(std::string(to_string(dtype)) + " D=" + std::to_string(head_dim) + " rows " +
                     std::to_string(rows) + " seed " + std::to_string(seed));
        constexpr int kKeys = 128, kSteps = kKeys / 32, kWStride = kKeys + 32;
        const Operands x = make_operands(dtype, 100, 16, kKeys, head_dim, seed);  // keys 100..127: V zero
        const int row_tiles = rows / 16;
        std::vector<std::uint8_t> live(std::size_t(row_tiles * kSteps));
        for (auto& l : live) l = std::uint8_t(rng() % 3 != 0);
        live[0] = 1;
        live[1] = 0;
        std::vector<float> w(std::size_t(rows * kWStride));
        for (float& e : w) e = unit(rng);
        const std::int64_t w_part = std::int64_t(rows) * kWStride;
        std::vector<std::uint16_t> parts(std::size_t(2 * w_part));
        cpu::split_weights_amx(w.data(), rows, kWStride, kWStride, w_part, parts.data());
        // A dead product's weights are NaN: computing it anyway would poison its outputs.
        for (int t = 0; t < row_tiles; ++t)
          for (int c = 0; c < kSteps; ++c)
            if (!live[std::size_t(t * kSteps + c)])
              for (int i = 0; i < 16; ++i)
                for (int j = 0; j < 32; ++j)
                  for (int p = 0; p < 2; ++p)
                    parts[std::size_t(p * w_part + (t * 16 + i) * kWStride + c * 32 + j)] = 0x7fc0;
        const int acc_stride = head_dim + 16;
        std::vector<float> acc(std::size_t(rows * acc_stride));
        for (float& a : acc) a = unit(rng);
        const std::vector<float> before = acc;
        cpu::routing_weighted_sums_amx(parts.data(), w_part, 2, kWStride, x.v_pairs.data(), parts_of(dtype), rows,
                                       kKeys, head_dim, live.data(), kSteps, acc.data(), acc_stride);
        for (int r = 0; r < rows; ++r)
          for (int d = 0; d < acc_stride; ++d) {
            const float got = acc[std::size_t(r * acc_stride + d)];
            if (d >= head_dim) {
              EXPECT_EQ(got, before[std::size_t(r * acc_stride + d)]) << "row " << r << " column " << d;
              continue;
            }
            double want = before[std::size_t(r * acc_stride + d)], magnitude = std::abs(want);
            for (int j = 0; j < 100; ++j) {
              if (!live[std::size_t(r / 16 * kSteps + j / 32)]) continue;
              const double term = double(w[std::size_t(r * kWStride + j)]) * x.v.view().load(0, j, 0, d);
              want += term;
              magnitude += std::abs(term);
            }
            // Weights within 2^-16 of themselves (bf16 V); with split fp16 V the
            // low x low products left out add up to 2^-16 of a term; fp32 sums.
            const double share = dtype == DType::BF16 ? 0x1p-16 : 0x1p-15;
            EXPECT_NEAR(got, want, (share + 2.0 * kKeys * 0x1p-24) * magnitude) << "row " << r << " channel " << d;
          }
      }
}

TEST(RoutingTiles, SplitWeightsSumToWithinTwoToTheMinus16) {
  if (!cpu::machine_supports(Isa::Amx)) GTEST_SKIP() << "no AMX here";
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<float> w(256);
  for (float& x : w) x = std::ldexp(std::uniform_real_distribution<float>(0.5f, 1.f)(rng), -int(rng() % 40));
  w[0] = 0.f;
  w[1] = 1.f;
  w[2] = 0x1.fffffep-1f;  // the largest weight below 1: 24 significand bits
  // Two rows of 128: part p of weight i (row i / 128) at parts[p * 256 + i].
  std::vector<std::uint16_t> parts(2 * w.size());
  cpu::split_weights_amx(w.data(), 2, 128, 128, std::int64_t(w.size()), parts.data());
  for (std::size_t i = 0; i < w.size(); ++i) {
    const float h = bf16_to_float(parts[i]), l = bf16_to_float(parts[w.size() + i]);
    std::uint32_t w_bits, h_bits;
    std::memcpy(&w_bits, &w[i], 4);
    std::memcpy(&h_bits, &h, 4);
    EXPECT_EQ(h_bits, w_bits & 0xffff0000u) << i << ": the high part is the value's upper half";
    // The remainder is below 2^-7 of w and keeps 8 bits: within 2^-16 of w.
    EXPECT_LE(std::abs(double(h) + double(l) - double(w[i])), 0x1p-16 * double(w[i])) << i;
  }
}

}  // namespace
}  // namespace stsa
