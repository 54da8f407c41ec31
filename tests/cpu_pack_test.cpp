// Packing K and V (pack_kv_tile) into the AMX kernel's pair panels and into the fp32
// kernels' panels, checked against the panels' definition written out here element by
// element: K's pairs transposed, [head_dim / 2][tile_k]; V's pairs of consecutive keys,
// [tile_k / 2][head_dim]; fp32 K transposed and V rows; zero past the sequence; V's flags.
// The vector packers (pack_pairs_amx.cpp, pack_avx512.cpp, pack_avx2.cpp) are also called
// directly on hosts that can run them, so that a fallback to the element-by-element
// packer cannot hide a broken one; and the row loaders.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/isa.hpp"
#include "cpu/pack.hpp"
#include "stsa/tensor.hpp"
#include "support/testing.hpp"

namespace stsa {
namespace {

std::uint16_t bits_at(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, std::int64_t d) {
  return static_cast<const std::uint16_t*>(t.data)[t.offset(b, n, h, d)];
}

// Part `part` of a value as the panels hold it: a bf16 value is itself (one part);
// an fp16 one is high = itself rounded to bf16, low = the rest (exact in bf16).
std::uint32_t part_bits(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h, std::int64_t d,
                        int part) {
  const std::uint16_t bits = bits_at(t, b, n, h, d);
  if (t.dtype == DType::BF16) return bits;
  const float x = f16_to_float(bits);
  const std::uint16_t high = float_to_bf16(x);
  return part == 0 ? high : float_to_bf16(x - bf16_to_float(high));
}

struct Panels {
  std::vector<std::uint32_t> kt, v;
};

int parts_of(DType dtype) { return dtype == DType::F16 ? 2 : 1; }

// The panels of key tile `tile` by their definition (each part's panel after the
// other), with kernel_dim channels: the head's, then zeros.
Panels expected_panels(const cpu::RowSource& in, std::int64_t b, std::int64_t h, std::int64_t tile, int tile_k,
                       std::int64_t kernel_dim) {
  const std::int64_t d_count = in.k.head_dim(), head = in.head(h);
  const int parts = parts_of(in.k.dtype);
  const std::int64_t k_part = kernel_dim / 2 * tile_k, v_part = tile_k / 2 * kernel_dim;
  const auto channel = [&](std::int64_t token, std::int64_t d, int p) {
    return d < d_count ? part_bits(in.k, b, token, head, d, p) : 0u;
  };
  Panels want{std::vector<std::uint32_t>(std::size_t(parts * k_part), 0u),
              std::vector<std::uint32_t>(std::size_t(parts * v_part), 0u)};
  for (int p = 0; p < parts; ++p)
    for (std::int64_t c = 0; c < tile_k; ++c) {
      const std::int64_t n = tile * tile_k + c;
      if (n >= in.k.tokens()) break;
      const std::int64_t token = in.token(n);
      for (std::int64_t i = 0; i < kernel_dim / 2; ++i)
        want.kt[std::size_t(p * k_part + i * tile_k + c)] =
            channel(token, 2 * i, p) | channel(token, 2 * i + 1, p) << 16;
      for (std::int64_t d = 0; d < d_count; ++d)
        want.v[std::size_t(p * v_part + c / 2 * kernel_dim + d)] |= part_bits(in.v, b, token, head, d, p)
                                                                    << (16 * (c % 2));
    }
  return want;
}

// Fills the panels with a pattern no packer writes, so a word left alone shows.
Panels poisoned_panels(std::int64_t d_count, int tile_k, int parts = 1) {
  return {std::vector<std::uint32_t>(std::size_t(parts * d_count / 2 * tile_k), 0xdeadbeefu),
          std::vector<std::uint32_t>(std::size_t(parts * tile_k / 2 * d_count), 0xdeadbeefu)};
}

struct Case {
  DType dtype;
  std::int64_t tokens, heads, head_dim;
  int tile_k;
  MemoryLayout memory;
  bool gathered;  // rows read through a token and head map, as routed attention's temporal heads are
  std::int64_t kernel_dim = 0;  // the panels' channels, zero past the head's (0: the head dim)
  std::int64_t panel_dim() const { return std::max(kernel_dim, head_dim); }
};

// Random K and V of a case (batch 2) and the RowSource a pack reads them through:
// with `gathered`, a shuffled token map and the heads reversed. Not copyable: the
// source points into its own maps.
struct CaseInput {
  Tensor k, v;
  std::vector<std::int64_t> tokens, heads;
  cpu::RowSource in;

  CaseInput(const Case& c, std::uint64_t seed)
      : k(c.dtype, 2, c.tokens, c.heads, c.head_dim, c.memory),
        v(c.dtype, 2, c.tokens, c.heads, c.head_dim, c.memory),
        tokens(std::size_t(c.tokens)),
        heads(std::size_t(c.heads)),
        in{k.view(), k.view(), v.view()} {
    testing::fill_normal(k.view(), seed);
    testing::fill_normal(v.view(), seed + 1);
    std::iota(tokens.begin(), tokens.end(), 0);
    std::iota(heads.begin(), heads.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(tokens.begin(), tokens.end(), rng);
    std::reverse(heads.begin(), heads.end());
    if (c.gathered) {
      in.tokens = tokens.data();
      in.heads = heads.data();
    }
  }
  CaseInput(const CaseInput&) = delete;
  CaseInput& operator=(const CaseInput&) = delete;
};

std::string describe(const Case& c, std::uint64_t seed) {
  return std::string(to_string(c.dtype)) + ", tokens " + std::to_string(c.tokens) + ", head dim " +
         std::to_string(c.head_dim) + " in " + std::to_string(c.panel_dim()) + ", tile " + std::to_string(c.tile_k) +
         (c.gathered ? ", gathered" : "") + ", seed " + std::to_string(seed);
}

TEST(CpuPack, PairPanelsAreTheirDefinition) {
  const std::uint64_t seed = testing::fresh_seed();
  const bool avx512 = cpu::machine_supports(Isa::Avx512);
  for (const DType dtype : {DType::BF16, DType::F16})
    for (Case c : {Case{dtype, 300, 3, 128, 128, MemoryLayout::BNHD, false},
                   Case{dtype, 77, 2, 64, 64, MemoryLayout::BHND, true},
                   Case{dtype, 129, 1, 96, 128, MemoryLayout::BNHD, true},
                   Case{dtype, 16, 2, 128, 64, MemoryLayout::BNHD, false},
                   Case{dtype, 1, 1, 64, 128, MemoryLayout::BHND, false},
                   // Head dims the kernels are not built for, padded with zero channels.
                   Case{dtype, 131, 2, 80, 128, MemoryLayout::BNHD, false, 96},
                   Case{dtype, 50, 3, 59, 64, MemoryLayout::BHND, true, 64},
                   Case{dtype, 70, 2, 72, 32, MemoryLayout::BNHD, true, 96}}) {
    SCOPED_TRACE(describe(c, seed));
    const int parts = parts_of(c.dtype);
    const CaseInput input(c, seed);
    const cpu::RowSource& in = input.in;
    const std::int64_t tiles = (c.tokens + c.tile_k - 1) / c.tile_k;
    for (std::int64_t h = 0; h < c.heads; ++h)
      for (std::int64_t tile = 0; tile < tiles; ++tile) {
        const Panels want = expected_panels(in, 1, h, tile, c.tile_k, c.panel_dim());
        Panels got = poisoned_panels(c.panel_dim(), c.tile_k, parts);
        const cpu::KvFlags flags = cpu::pack_kv_tile(in, 1, h, tile, c.tile_k, nullptr, nullptr, got.kt.data(),
                                                     got.v.data(), c.kernel_dim);
        EXPECT_EQ(got.kt, want.kt) << "K, head " << h << ", tile " << tile;
        EXPECT_EQ(got.v, want.v) << "V, head " << h << ", tile " << tile;
        EXPECT_FALSE(flags.nonfinite || flags.tiny || flags.k_nonfinite);
        if (!avx512) continue;
        Panels direct = poisoned_panels(c.panel_dim(), c.tile_k, parts);
        cpu::KvFlags direct_flags;
        ASSERT_TRUE(cpu::pack_pairs_tile_amx(in, 1, h, tile, c.tile_k, direct.kt.data(), direct.v.data(), direct_flags,
                                             c.kernel_dim));
        EXPECT_EQ(direct.kt, want.kt) << "K, head " << h << ", tile " << tile;
        EXPECT_EQ(direct.v, want.v) << "V, head " << h << ", tile " << tile;
      }
  }
  if (!avx512) GTEST_SKIP() << "checked pack_kv_tile only: this CPU has no AVX-512 for the vector packer";
}

// Which packer a check goes through: pack_kv_tile's choice, or one vector packer
// called directly (so that a fallback to the element-by-element one cannot hide it).
enum class Packer { Any, Avx512, Avx2 };

// The direct packers this CPU can run.
std::vector<Packer> vector_packers() {
  std::vector<Packer> packers;
  if (cpu::machine_supports(Isa::Avx512)) packers.push_back(Packer::Avx512);
  if (cpu::machine_supports(Isa::Avx2)) packers.push_back(Packer::Avx2);
  return packers;
}

// K and V of one head (random, 64 channels, tiles of 64) for the flag tests: the
// flags of one tile with one element of K or V planted with a chosen value.
struct FlagProbe {
  static constexpr std::int64_t kDim = 64;
  static constexpr int kTile = 64;
  Tensor k, v;

  FlagProbe(DType dtype, std::int64_t tokens, std::uint64_t seed)
      : k(dtype, 1, tokens, 1, kDim), v(dtype, 1, tokens, 1, kDim) {
    testing::fill_normal(k.view(), seed);
    testing::fill_normal(v.view(), seed + 1);
  }
  static std::int64_t tile_of(std::int64_t at) { return at / kDim / kTile; }

  // The flags of tile `tile` with element `at` of K (in_k) or V set to `value`
  // (restored afterwards): through pack_kv_tile, or through one vector packer of the
  // dtype (fp32 panels: the AVX-512 or the AVX2 one; pair panels: the AVX-512 one).
  // With `float_panels`, fp16 and bf16 K and V go into the fp32 kernels' panels too.
  template <typename T>
  cpu::KvFlags flags_with(bool in_k, std::int64_t at, T value, std::int64_t tile, Packer packer = Packer::Any,
                          bool float_panels = false) {
    T* data = static_cast<T*>((in_k ? k : v).view().data);
    const T kept = data[at];
    data[at] = value;
    const cpu::RowSource in{k.view(), k.view(), v.view()};
    cpu::KvFlags flags;
    if (k.dtype() == DType::F32 || float_panels) {
      std::vector<float> kt(std::size_t(kDim * kTile)), v_rows(kt.size());
      if (packer == Packer::Avx512)
        EXPECT_TRUE(cpu::pack_floats_tile_avx512(in, 0, 0, tile, kTile, kt.data(), v_rows.data(), flags));
      else if (packer == Packer::Avx2)
        EXPECT_TRUE(cpu::pack_floats_tile_avx2(in, 0, 0, tile, kTile, kt.data(), v_rows.data(), flags));
      else
        flags = cpu::pack_kv_tile(in, 0, 0, tile, kTile, kt.data(), v_rows.data());
    } else {
      Panels got = poisoned_panels(kDim, kTile, parts_of(k.dtype()));
      if (packer != Packer::Any)
        EXPECT_TRUE(cpu::pack_pairs_tile_amx(in, 0, 0, tile, kTile, got.kt.data(), got.v.data(), flags));
      else
        flags = cpu::pack_kv_tile(in, 0, 0, tile, kTile, nullptr, nullptr, got.kt.data(), got.v.data());
    }
    data[at] = kept;
    return flags;
  }
};

// One V value at a time made Inf, NaN, tiny or a negative zero: only the first two
// set `nonfinite`, only tiny ones `tiny`, wherever the value sits in the tile.
TEST(CpuPack, Bf16VFlagsSeeEveryValue) {
  const bool avx512 = cpu::machine_supports(Isa::Avx512);
  FlagProbe probe(DType::BF16, 100, 7);
  struct Planted {
    std::uint16_t bits;
    bool nonfinite, tiny;
  };
  // +Inf, -NaN, 2^-65 (below kTinyV = 2^-64), -2^-64 (not below), -0, the smallest subnormal.
  for (const Planted p : {Planted{0x7f80, true, false}, Planted{0xffc1, true, false}, Planted{0x1f00, false, true},
                          Planted{0x9f80, false, false}, Planted{0x8000, false, false}, Planted{0x0001, false, true}})
    for (const std::int64_t at : {std::int64_t(0), std::int64_t(63), std::int64_t(64 * 64 + 17),
                                  std::int64_t(99 * 64 + 63)}) {
      const std::int64_t tile = FlagProbe::tile_of(at);
      const cpu::KvFlags flags = probe.flags_with(false, at, p.bits, tile);
      EXPECT_EQ(flags.nonfinite, p.nonfinite) << std::hex << p.bits << " at " << std::dec << at;
      EXPECT_EQ(flags.tiny, p.tiny) << std::hex << p.bits << " at " << std::dec << at;
      const cpu::KvFlags other = probe.flags_with(false, at, p.bits, 1 - tile);
      EXPECT_FALSE(other.nonfinite || other.tiny) << "a value in the other tile";
      if (avx512) {
        const cpu::KvFlags direct = probe.flags_with(false, at, p.bits, tile, Packer::Avx512);
        EXPECT_EQ(direct.nonfinite, p.nonfinite);
        EXPECT_EQ(direct.tiny, p.tiny);
      }
    }
}

// fp32 K and V for the fp32 kernels: kt [kernel_dim][tile_k] (K transposed) and
// v_rows [tile_k][kernel_dim], zero past the sequence and past the head's
// channels, each value's bits kept.
TEST(CpuPack, FloatPanelsAreTheirDefinition) {
  const std::uint64_t seed = testing::fresh_seed();
  for (Case c : {Case{DType::F32, 300, 3, 128, 128, MemoryLayout::BNHD, false},
                 Case{DType::F32, 77, 2, 64, 64, MemoryLayout::BHND, true},
                 Case{DType::F32, 129, 1, 80, 128, MemoryLayout::BNHD, true},
                 Case{DType::F32, 1, 1, 96, 64, MemoryLayout::BHND, false},
                 // Head dims the kernels are not built for, padded with zero channels.
                 Case{DType::F32, 131, 2, 72, 128, MemoryLayout::BNHD, false, 80},
                 Case{DType::F32, 50, 3, 59, 64, MemoryLayout::BHND, true, 64},
                 Case{DType::F32, 33, 2, 1, 16, MemoryLayout::BNHD, true, 64},
                 // fp16 and bf16 K and V widened to fp32 (the AVX-512 and AVX2 kernels' fp16 calls).
                 Case{DType::F16, 300, 2, 128, 128, MemoryLayout::BNHD, true},
                 Case{DType::F16, 77, 1, 72, 64, MemoryLayout::BHND, false, 80},
                 Case{DType::BF16, 129, 2, 64, 128, MemoryLayout::BNHD, false},
                 Case{DType::BF16, 50, 1, 80, 64, MemoryLayout::BHND, true}}) {
    SCOPED_TRACE(describe(c, seed));
    const CaseInput input(c, seed);
    const cpu::RowSource& in = input.in;
    const std::int64_t kd = c.panel_dim();
    const std::size_t panel = std::size_t(kd * c.tile_k);
    for (std::int64_t h = 0; h < c.heads; ++h)
      for (std::int64_t tile = 0; tile * c.tile_k < c.tokens; ++tile) {
        std::vector<float> want_kt(panel, 0.0f), want_v(panel, 0.0f);
        for (std::int64_t col = 0; col < c.tile_k && tile * c.tile_k + col < c.tokens; ++col) {
          const std::int64_t token = in.token(tile * c.tile_k + col);
          for (std::int64_t d = 0; d < c.head_dim; ++d) {
            want_kt[std::size_t(d * c.tile_k + col)] = in.k.load(1, token, in.head(h), d);
            want_v[std::size_t(col * kd + d)] = in.v.load(1, token, in.head(h), d);
          }
        }
        std::vector<float> kt(panel, -7.0f), v_rows(panel, -7.0f);
        const cpu::KvFlags flags =
            cpu::pack_kv_tile(in, 1, h, tile, c.tile_k, kt.data(), v_rows.data(), nullptr, nullptr, c.kernel_dim);
        EXPECT_EQ(kt, want_kt) << "K, head " << h << ", tile " << tile;
        EXPECT_EQ(v_rows, want_v) << "V, head " << h << ", tile " << tile;
        EXPECT_FALSE(flags.nonfinite || flags.tiny);
        for (const Packer packer : vector_packers()) {
          std::vector<float> direct_kt(panel, -7.0f), direct_v(panel, -7.0f);
          cpu::KvFlags direct;
          ASSERT_TRUE(packer == Packer::Avx512
                          ? cpu::pack_floats_tile_avx512(in, 1, h, tile, c.tile_k, direct_kt.data(), direct_v.data(),
                                                         direct, c.kernel_dim)
                          : cpu::pack_floats_tile_avx2(in, 1, h, tile, c.tile_k, direct_kt.data(), direct_v.data(),
                                                       direct, c.kernel_dim));
          const char* name = packer == Packer::Avx512 ? "AVX-512 packer" : "AVX2 packer";
          EXPECT_EQ(direct_kt, want_kt) << name << ", K, head " << h << ", tile " << tile;
          EXPECT_EQ(direct_v, want_v) << name << ", V, head " << h << ", tile " << tile;
          EXPECT_FALSE(direct.nonfinite || direct.tiny) << name;
        }
      }
  }
  if (vector_packers().size() < 2) GTEST_SKIP() << "this CPU lacks a vector packer's instructions: not all were checked";
}

// fp32 V's flags: Inf and NaN set nonfinite, nonzero magnitudes below 2^-64 tiny.
TEST(CpuPack, FloatVFlagsSeeEveryValue) {
  FlagProbe probe(DType::F32, 100, 9);
  struct Planted {
    float value;
    bool nonfinite, tiny;
  };
  for (const Planted p : {Planted{std::numeric_limits<float>::infinity(), true, false},
                          Planted{-std::numeric_limits<float>::quiet_NaN(), true, false},
                          Planted{std::numeric_limits<float>::max(), false, false}, Planted{0x1p-65f, false, true},
                          Planted{-0x1p-64f, false, false}, Planted{-0.0f, false, false},
                          Planted{std::numeric_limits<float>::denorm_min(), false, true}})
    for (const std::int64_t at : {std::int64_t(0), std::int64_t(64 * 64 + 17), std::int64_t(99 * 64 + 63)}) {
      const cpu::KvFlags flags = probe.flags_with(false, at, p.value, FlagProbe::tile_of(at));
      EXPECT_EQ(flags.nonfinite, p.nonfinite) << p.value << " at " << at;
      EXPECT_EQ(flags.tiny, p.tiny) << p.value << " at " << at;
      for (const Packer packer : vector_packers()) {
        const cpu::KvFlags direct = probe.flags_with(false, at, p.value, FlagProbe::tile_of(at), packer);
        EXPECT_EQ(direct.nonfinite, p.nonfinite) << p.value << " at " << at << ", packer " << int(packer);
        EXPECT_EQ(direct.tiny, p.tiny) << p.value << " at " << at << ", packer " << int(packer);
      }
    }
}

// fp16 and bf16 V widened into fp32 panels: Inf and NaN set nonfinite, and tiny
// is what it is for fp32 (bf16's smallest subnormal is below kTinyV, no fp16 value is).
TEST(CpuPack, HalfValuesInFloatPanelsAreFlaggedAsFloats) {
  struct Planted {
    DType dtype;
    std::uint16_t bits;
    bool nonfinite, tiny;
  };
  for (const Planted p : {Planted{DType::F16, 0x7c00, true, false}, Planted{DType::F16, 0xfe01, true, false},
                          Planted{DType::F16, 0x0001, false, false}, Planted{DType::BF16, 0xff80, true, false},
                          Planted{DType::BF16, 0x7fc1, true, false}, Planted{DType::BF16, 0x0001, false, true},
                          Planted{DType::BF16, 0x8000, false, false}}) {
    FlagProbe probe(p.dtype, 100, 11);
    for (const std::int64_t at : {std::int64_t(0), std::int64_t(64 * 64 + 17), std::int64_t(99 * 64 + 63)}) {
      const std::int64_t tile = FlagProbe::tile_of(at);
      std::vector<Packer> packers = vector_packers();
      packers.insert(packers.begin(), Packer::Any);
      for (const Packer packer : packers) {
        const cpu::KvFlags flags = probe.flags_with(false, at, p.bits, tile, packer, /*float_panels=*/true);
        EXPECT_EQ(flags.nonfinite, p.nonfinite) << to_string(p.dtype) << " " << std::hex << p.bits << std::dec
                                                << " at " << at << ", packer " << int(packer);
        EXPECT_EQ(flags.tiny, p.tiny) << to_string(p.dtype) << " " << std::hex << p.bits;
        EXPECT_FALSE(probe.flags_with(true, at, p.bits, tile, packer, true).nonfinite) << "K's values are flagged";
      }
    }
  }
}

// fp16: an Inf or NaN in K sets k_nonfinite, in V nonfinite; the smallest
// subnormal sets neither, nor tiny (no fp16 value, nor a low part, is below kTinyV).
TEST(CpuPack, F16FlagsComeFromTheSplit) {
  FlagProbe probe(DType::F16, 70, 3);
  struct Planted {
    bool in_k;
    std::uint16_t bits;
    bool k_nonfinite, nonfinite;
  };
  for (const Planted p : {Planted{true, 0x7c00, true, false}, Planted{true, 0xfe01, true, false},
                          Planted{false, 0xfc00, false, true}, Planted{false, 0x7e00, false, true},
                          Planted{false, 0x0001, false, false}, Planted{true, 0x8001, false, false}})
    for (const std::int64_t at : {std::int64_t(5), std::int64_t(64 * 64 + 63)}) {
      const cpu::KvFlags flags = probe.flags_with(p.in_k, at, p.bits, FlagProbe::tile_of(at));
      EXPECT_EQ(flags.k_nonfinite, p.k_nonfinite) << std::hex << p.bits << (p.in_k ? " in K" : " in V");
      EXPECT_EQ(flags.nonfinite, p.nonfinite) << std::hex << p.bits << (p.in_k ? " in K" : " in V");
      EXPECT_FALSE(flags.tiny);
    }
}

// load_row: each channel's value times the scale, then zeros to the kernel dim; the
// AVX-512 loader (contiguous fp32, fp16 and bf16 rows) writes the same bits and
// declines strided channels and fp8.
TEST(CpuPack, RowLoadsAreTheirValuesTimesTheScale) {
  const bool avx512 = cpu::machine_supports(Isa::Avx512);
  const std::uint64_t seed = testing::fresh_seed();
  for (const DType dtype : {DType::F32, DType::F16, DType::BF16, DType::F8E4M3})
    for (const std::int64_t head_dim : {1, 59, 64, 72, 128}) {
      Tensor t(dtype, 2, 5, 3, head_dim);
      testing::fill_normal(t.view(), seed + std::uint64_t(head_dim));
      TensorView strided = t.view();
      strided.stride[3] = 2;  // every other channel, half of them (in bounds)
      strided.shape[3] = (head_dim + 1) / 2;
      for (const TensorView& view : {t.view(), strided})
        for (const float scale : {1.0f, 0.37f, -1.0f}) {
          const std::int64_t kernel_dim = view.head_dim() + 13;
          std::vector<float> want(std::size_t(kernel_dim), 0.0f);
          for (std::int64_t d = 0; d < view.head_dim(); ++d) want[std::size_t(d)] = view.load(1, 3, 2, d) * scale;
          std::vector<float> got(std::size_t(kernel_dim), -7.0f);
          cpu::load_row(view, 1, 3, 2, scale, got.data(), kernel_dim);
          EXPECT_EQ(got, want) << to_string(dtype) << ", head dim " << view.head_dim() << ", scale " << scale;
          if (!avx512) continue;
          std::vector<float> direct(std::size_t(kernel_dim), -7.0f);
          const bool takes = dtype != DType::F8E4M3 && view.stride[3] == 1;
          EXPECT_EQ(cpu::load_row_avx512(view, 1, 3, 2, scale, direct.data(), kernel_dim), takes);
          if (takes) EXPECT_EQ(direct, want) << to_string(dtype) << ", head dim " << head_dim;
          else EXPECT_TRUE(std::all_of(direct.begin(), direct.end(), [](float x) { return x == -7.0f; }));
        }
    }
  if (!avx512) GTEST_SKIP() << "checked load_row only: this CPU has no AVX-512 for the vector loader";
}

// The helpers keep to the call's instruction set (RowSource::vector_cap): a call capped
// at AVX2 packs with the AVX2 packer, one capped at scalar element by element, with the
// same bits and flags whichever runs.
TEST(CpuPack, HelpersKeepToTheCallsInstructionSet) {
  const bool avx512 = cpu::machine_supports(Isa::Avx512), avx2 = cpu::machine_supports(Isa::Avx2);
  using cpu::FloatPacker;
  EXPECT_EQ(cpu::float_packer(Isa::Scalar), FloatPacker::Elementwise);
  EXPECT_EQ(cpu::float_packer(Isa::Avx2), avx2 ? FloatPacker::Avx2 : FloatPacker::Elementwise);
  const FloatPacker best = avx512 ? FloatPacker::Avx512 : cpu::float_packer(Isa::Avx2);
  EXPECT_EQ(cpu::float_packer(Isa::Avx512), best);
  EXPECT_EQ(cpu::float_packer(Isa::Amx), best);
  EXPECT_FALSE(cpu::may_use(Isa::Avx2, Isa::Avx512));
  EXPECT_EQ(cpu::may_use(Isa::Amx, Isa::Avx512), avx512);

  const std::uint64_t seed = testing::fresh_seed();
  for (const DType dtype : {DType::F32, DType::F16}) {
    SCOPED_TRACE(std::string(to_string(dtype)) + ", seed " + std::to_string(seed));
    Tensor k(dtype, 1, 150, 2, 80), v(dtype, 1, 150, 2, 80);
    testing::fill_normal(k.view(), seed);
    testing::fill_normal(v.view(), seed + 1);
    v.view().store(0, 140, 1, 7, std::numeric_limits<float>::infinity());  // a flag to carry
    std::vector<float> first_kt, first_v;
    cpu::KvFlags first;
    for (const Isa cap : {Isa::Amx, Isa::Avx2, Isa::Scalar}) {
      cpu::RowSource in{k.view(), k.view(), v.view()};
      in.vector_cap = cap;
      std::vector<float> kt(80 * 128, -7.0f), v_rows(80 * 128, -7.0f);
      const cpu::KvFlags flags = cpu::pack_kv_tile(in, 0, 1, 1, 128, kt.data(), v_rows.data());
      std::vector<float> q_row(96, -7.0f);
      cpu::load_row(k.view(), 0, 3, 1, 0.5f, q_row.data(), 96, cap);
      if (cap == Isa::Amx) {
        first_kt = kt, first_v = v_rows, first = flags;
        EXPECT_TRUE(flags.nonfinite);
        continue;
      }
      EXPECT_EQ(kt, first_kt) << "capped at " << to_string(cap);
      EXPECT_EQ(v_rows, first_v) << "capped at " << to_string(cap);
      EXPECT_EQ(flags.nonfinite, first.nonfinite);
      std::vector<float> uncapped(96, -7.0f);
      cpu::load_row(k.view(), 0, 3, 1, 0.5f, uncapped.data(), 96);
      EXPECT_EQ(q_row, uncapped) << "capped at " << to_string(cap);
    }
  }
}

TEST(CpuPack, PackerDeclinesWhatItCannotTake) {
  if (!cpu::machine_supports(Isa::Avx512)) GTEST_SKIP() << "this CPU has no AVX-512 for the vector packer";
  Tensor bf16(DType::BF16, 1, 40, 2, 80), fp16(DType::F16, 1, 40, 2, 64), fp32(DType::F32, 1, 40, 2, 64),
      ok(DType::BF16, 1, 40, 2, 64);
  const std::uint64_t seed = testing::fresh_seed();
  for (const Tensor* t : {&bf16, &fp16, &fp32, &ok}) testing::fill_normal(t->view(), seed);  // nonzero: packed would show
  constexpr std::uint32_t kUntouched = 0xdeadbeef;
  std::vector<std::uint32_t> kt(64 * 64, kUntouched), v(64 * 64, kUntouched);
  cpu::KvFlags flags;
  // A head dim not a multiple of 32 (nor the kernel dim it is padded to), fp32, K
  // and V of different dtypes, a tile not a multiple of 16, channels not
  // contiguous: nothing written.
  EXPECT_FALSE(cpu::pack_pairs_tile_amx({bf16.view(), bf16.view(), bf16.view()}, 0, 0, 0, 64, kt.data(), v.data(),
                                        flags));
  EXPECT_FALSE(cpu::pack_pairs_tile_amx({bf16.view(), bf16.view(), bf16.view()}, 0, 0, 0, 64, kt.data(), v.data(),
                                        flags, 88));
  EXPECT_FALSE(cpu::pack_pairs_tile_amx({fp32.view(), fp32.view(), fp32.view()}, 0, 0, 0, 64, kt.data(), v.data(),
                                        flags));
  EXPECT_FALSE(cpu::pack_pairs_tile_amx({ok.view(), ok.view(), fp16.view()}, 0, 0, 0, 64, kt.data(), v.data(),
                                        flags));
  EXPECT_FALSE(cpu::pack_pairs_tile_amx({ok.view(), ok.view(), ok.view()}, 0, 0, 0, 56, kt.data(), v.data(), flags));
  TensorView strided = ok.view();
  strided.stride[3] = 2;  // every other channel (half the head dim, so still in bounds)
  strided.shape[3] = 32;
  EXPECT_FALSE(cpu::pack_pairs_tile_amx({strided, strided, strided}, 0, 0, 0, 64, kt.data(), v.data(), flags));
  const auto untouched = [](std::uint32_t w) { return w == kUntouched; };
  EXPECT_TRUE(std::all_of(kt.begin(), kt.end(), untouched) && std::all_of(v.begin(), v.end(), untouched));
  // The fp32 packer: a head dim (and kernel dim) not a multiple of 16.
  Tensor fp32_72(DType::F32, 1, 40, 2, 72);
  testing::fill_normal(fp32_72.view(), seed + 1);
  const float untouched_float = std::bit_cast<float>(0x7fc0beefu);  // a NaN no packer of these inputs writes
  std::vector<float> fkt(80 * 64, untouched_float), fv(80 * 64, untouched_float);
  EXPECT_FALSE(cpu::pack_floats_tile_avx512({fp32_72.view(), fp32_72.view(), fp32_72.view()}, 0, 0, 0, 64, fkt.data(),
                                            fv.data(), flags));
  EXPECT_FALSE(cpu::pack_floats_tile_avx512({fp32_72.view(), fp32_72.view(), fp32_72.view()}, 0, 0, 0, 64, fkt.data(),
                                            fv.data(), flags, 88));
  EXPECT_FALSE(cpu::pack_floats_tile_avx2({fp32.view(), fp32.view(), fp32.view()}, 0, 0, 0, 60, fkt.data(), fv.data(),
                                          flags));  // a tile not a multiple of 8
  // fp8 (its panels are pairs), K and V of two dtypes.
  Tensor fp8(DType::F8E4M3, 1, 40, 2, 64);
  EXPECT_FALSE(cpu::pack_floats_tile_avx512({fp8.view(), fp8.view(), fp8.view()}, 0, 0, 0, 64, fkt.data(), fv.data(),
                                            flags));
  EXPECT_FALSE(cpu::pack_floats_tile_avx512({fp16.view(), fp16.view(), fp32.view()}, 0, 0, 0, 64, fkt.data(),
                                            fv.data(), flags));
  EXPECT_FALSE(cpu::pack_floats_tile_avx2({fp8.view(), fp8.view(), fp8.view()}, 0, 0, 0, 64, fkt.data(), fv.data(),
                                          flags));
  EXPECT_FALSE(cpu::pack_floats_tile_avx2({fp16.view(), fp16.view(), fp32.view()}, 0, 0, 0, 64, fkt.data(),
                                          fv.data(), flags));
  const auto untouched_bits = [](float x) { return std::bit_cast<std::uint32_t>(x) == 0x7fc0beefu; };
  EXPECT_TRUE(std::all_of(fkt.begin(), fkt.end(), untouched_bits) && std::all_of(fv.begin(), fv.end(), untouched_bits));
  EXPECT_FALSE(flags.nonfinite || flags.tiny);
}

}  // namespace
}  // namespace stsa

namespace stsa {
namespace {

// store_rows' vector division (store_avx512.cpp) against the scalar expression it
// replaces, value by value: IEEE division, then float_to_bf16's or float_to_f16's
// rounding (subnormal results kept, NaN quieted), with nothing written past `count`.
TEST(CpuStore, VectorRowDivisionIsTheScalarOne) {
  if (!cpu::machine_supports(Isa::Avx512)) GTEST_SKIP() << "this CPU has no AVX-512 for the vector division";
  const std::uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  const float specials[] = {0.0f, -0.0f, 1e-40f, -1e-41f, 0x1p-126f, 0x1.fffffep-127f, 3.0e38f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), std::bit_cast<float>(0x7fffffffu),
                            std::bit_cast<float>(0xffbfffffu), 1.00390625f, 1.01171875f,
                            // fp16: subnormal results, ties there and at 1, the overflow boundary
                            3e-6f, -0x1.8p-24f, 0x1.4p-23f, 1.00048828125f, 65504.0f, 65519.0f, 65520.0f};
  // (The last NaNs' payloads would round into the sign or exponent: NaN must stay NaN.)
  // scale: V's descale, 1 without one (x * 1 is x: the bits of a / l).
  const auto ls_and_scales = {std::pair{1.0f, 1.0f}, {3.0f, 1.0f}, {0.7f, 1.0f}, {1e-30f, 1.0f}, {2e38f, 1.0f},
                               {3.0f, 0.3f}, {0.7f, 5.0f}, {1e-30f, 0.3f}, {2e38f, 5.0f}};
  for (const auto& [l, scale] : ls_and_scales)
    for (const std::int64_t count : {std::int64_t(1), std::int64_t(16), std::int64_t(37), std::int64_t(128)}) {
      SCOPED_TRACE("l " + std::to_string(l) + ", scale " + std::to_string(scale) + ", count " +
                   std::to_string(count) + ", seed " + std::to_string(seed));
      std::vector<float> a(static_cast<std::size_t>(count));
      for (std::size_t d = 0; d < a.size(); ++d)
        a[d] = d % 3 == 0 ? specials[(d / 3 + std::size_t(count)) % std::size(specials)] * (l < 1 ? l : 1.0f)
                          : uniform(rng);
      std::vector<float> fp32(a.size() + 1, 42.0f);
      std::vector<std::uint16_t> bf16(a.size() + 1, 0x1234), f16(a.size() + 1, 0x1234);
      cpu::divide_row_avx512(a.data(), l, scale, count, DType::F32, fp32.data());
      cpu::divide_row_avx512(a.data(), l, scale, count, DType::BF16, bf16.data());
      cpu::divide_row_avx512(a.data(), l, scale, count, DType::F16, f16.data());
      for (std::size_t d = 0; d < a.size(); ++d) {
        const float quotient = a[d] / l, want = quotient * scale;
        std::uint32_t got_bits, want_bits;
        std::memcpy(&got_bits, &fp32[d], 4);
        std::memcpy(&want_bits, &want, 4);
        if (std::isnan(want))
          EXPECT_TRUE(std::isnan(fp32[d])) << d;
        else
          EXPECT_EQ(got_bits, want_bits) << a[d] << " / " << l;
        EXPECT_EQ(bf16[d], float_to_bf16(want)) << a[d] << " / " << l;
        EXPECT_EQ(f16[d], float_to_f16(want)) << a[d] << " / " << l;
      }
      EXPECT_EQ(f16.back(), 0x1234) << "written past the row";
      EXPECT_EQ(fp32.back(), 42.0f) << "written past the row";
      EXPECT_EQ(bf16.back(), 0x1234) << "written past the row";
    }
}

// The vector fp8 -> bf16 conversion gives f8e4m3_to_bf16's bits for every byte
// (the 256 of them in each lane position), at counts that end mid-vector, and
// writes nothing past the row.
TEST(CpuConvert, VectorFp8ToBf16IsTheScalarOne) {
  if (!cpu::machine_supports(Isa::Avx512)) GTEST_SKIP() << "this CPU has no AVX-512 for the vector conversion";
  for (const std::int64_t count : {std::int64_t(1), std::int64_t(31), std::int64_t(80), std::int64_t(256 + 32)})
    for (int offset = 0; offset < 256; offset += 37) {
      std::vector<std::uint8_t> src(static_cast<std::size_t>(count));
      for (std::size_t i = 0; i < src.size(); ++i) src[i] = std::uint8_t(i + std::size_t(offset));
      std::vector<std::uint16_t> got(src.size() + 1, 0x1234);
      cpu::f8e4m3_to_bf16_avx512(src.data(), count, got.data());
      for (std::size_t i = 0; i < src.size(); ++i)
        ASSERT_EQ(got[i], f8e4m3_to_bf16(src[i])) << "byte " << std::hex << int(src[i]);
      EXPECT_EQ(got.back(), 0x1234) << "written past the row";
    }
}

}  // namespace
}  // namespace stsa
