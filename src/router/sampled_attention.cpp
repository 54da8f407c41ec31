// Per key chunk, two passes shared by all sampled rows of a batch entry, so that
// each block of K and V is converted once and stays in cache while every row uses it:
//   1. scores s = scale q.k for every sampled row and key of a sub-chunk (an
//      S x 512 buffer per head that stays in L2), then e = exp(s - running max);
//   2. per key block: O_dense += sum_j e_j v_j for every row and, per candidate
//      mask, the same over the block's allowed keys. Blocks a mask does not touch
//      are skipped and blocks it takes whole add the dense output's block sum (its
//      normaliser's too), so products and the per-key mask test run only on
//      boundary blocks. The factor exp(-max) cancels in every ratio, so one exp per
//      pair serves all masks.
// combine_chunks() rescales the chunks to the row's overall maximum (in fp64);
// when a mask's allowed keys sit so far below it that their sum underflows, that
// row is recomputed in fp64 with the mask's own maximum.
#include "router/sampled_attention.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/round_up.hpp"
#include "cpu/pack.hpp"
#include "cpu/routing_tiles.hpp"
#include "router/sampled_weights.hpp"
#include "router/vector_clones.hpp"

namespace stsa::router_detail {
namespace {

constexpr std::int64_t kRowBlock = 4;   // sampled rows scored together (reuses each loaded key vector)
constexpr double kUnderflowFloor = 1e-25;

// out[r][j] = sum_d q[r][d] * kt[d][j] for kRowBlock rows and kKeyBlock keys (kt: transposed key block).
STSA_VECTOR_CLONES void score_rows(const float* __restrict q, std::int64_t dim, const float* __restrict kt,
                                   float* __restrict out) {
  float acc[kRowBlock][kKeyBlock] = {};
  for (std::int64_t d = 0; d < dim; ++d) {
    const float* key = kt + d * kKeyBlock;
    for (std::int64_t r = 0; r < kRowBlock; ++r) {
      const float qd = q[r * dim + d];
      for (std::int64_t j = 0; j < kKeyBlock; ++j) acc[r][j] += qd * key[j];
    }
  }
  std::memcpy(out, acc, sizeof(acc));
}

// kt[d][j] = rows[j][d] for a block of kKeyBlock key rows of `dim` channels.
STSA_VECTOR_CLONES void transpose_block(const float* __restrict rows, std::int64_t dim, float* __restrict kt) {
  for (std::int64_t d = 0; d < dim; ++d)
    for (std::int64_t j = 0; j < kKeyBlock; ++j) kt[d * kKeyBlock + j] = rows[j * dim + d];
}

// out[r][d] += sum_j w[r][j] * v[j][d] (`add`; else =) for kRowBlock weight rows over a block of kKeyBlock keys;
// v rows hold `padded` channels (a multiple of kLane). Each loaded lane of v serves all rows
// (a small GEMM micro-kernel), and the rows are independent accumulation chains: two lanes
// at a time where the row has them, so that 8 chains cover the FMA latency (with one lane, 4
// chains ran at half the FMA rate). Each lane's sums are the same either way.
// A GCC/Clang vector type keeps one lane in a register (plain arrays get split into scalars).
typedef float Lane __attribute__((vector_size(kLane * sizeof(float))));
STSA_VECTOR_CLONES void accumulate_rows(const float* const* __restrict w, const float* __restrict v,
                                        std::int64_t padded, float* const* __restrict out, bool add) {
  // (Written out twice rather than through a helper: a helper would not carry the
  // clones' target and would run the vector type in scalar code.)
  std::int64_t d0 = 0;
  for (; d0 + 2 * kLane <= padded; d0 += 2 * kLane) {
    Lane acc[kRowBlock][2] = {};
    for (std::int64_t j = 0; j < kKeyBlock; ++j) {
      Lane first, second;
      std::memcpy(&first, v + j * padded + d0, sizeof(first));
      std::memcpy(&second, v + j * padded + d0 + kLane, sizeof(second));
      for (std::int64_t r = 0; r < kRowBlock; ++r) {
        acc[r][0] += w[r][j] * first;
        acc[r][1] += w[r][j] * second;
      }
    }
    for (std::int64_t r = 0; r < kRowBlock; ++r)
      for (int l = 0; l < 2; ++l) {
        Lane sum = acc[r][l];
        if (add) {
          Lane before;
          std::memcpy(&before, out[r] + d0 + l * kLane, sizeof(before));
          sum += before;
        }
        std::memcpy(out[r] + d0 + l * kLane, &sum, sizeof(sum));
      }
  }
  for (; d0 < padded; d0 += kLane) {
    Lane acc[kRowBlock] = {};
    for (std::int64_t j = 0; j < kKeyBlock; ++j) {
      Lane row;
      std::memcpy(&row, v + j * padded + d0, sizeof(row));
      for (std::int64_t r = 0; r < kRowBlock; ++r) acc[r] += w[r][j] * row;
    }
    for (std::int64_t r = 0; r < kRowBlock; ++r) {
      Lane sum = acc[r];
      if (add) {
        Lane before;
        std::memcpy(&before, out[r] + d0, sizeof(before));
        sum += before;
      }
      std::memcpy(out[r] + d0, &sum, sizeof(sum));
    }
  }
}

// out[d] = t[b, n, h, d] as float, with the dtype switch hoisted out of the
// channel loop, and a unit-stride loop of its own for each (they vectorise).
// cpu::load_row does the same with a scale; this one is built as vector
// clones (fp16 rows: 36 ms of routing against 45 with the plain build).
template <typename T, typename Convert>
inline void convert_row(const T* __restrict p, std::int64_t step, std::int64_t dim, float* __restrict out,
                        Convert convert) {
  if (step == 1)
    for (std::int64_t d = 0; d < dim; ++d) out[d] = convert(p[d]);
  else
    for (std::int64_t d = 0; d < dim; ++d) out[d] = convert(p[d * step]);
}

STSA_VECTOR_CLONES void load_row(const TensorView& t, std::int64_t b, std::int64_t n, std::int64_t h,
                                 float* __restrict out) {
  const std::int64_t dim = t.head_dim(), step = t.stride[3], base = t.offset(b, n, h, 0);
  switch (t.dtype) {
    case DType::F32:
      convert_row(static_cast<const float*>(t.data) + base, step, dim, out, [](float x) { return x; });
      return;
    case DType::BF16:
      convert_row(static_cast<const std::uint16_t*>(t.data) + base, step, dim, out,
                  [](std::uint16_t x) { return bf16_to_float(x); });
      return;
    case DType::F16:
      convert_row(static_cast<const std::uint16_t*>(t.data) + base, step, dim, out,
                  [](std::uint16_t x) { return f16_to_float(x); });
      return;
    case DType::F8E4M3:
      convert_row(static_cast<const std::uint8_t*>(t.data) + base, step, dim, out,
                  [](std::uint8_t x) { return f8e4m3_to_float(x); });
      return;
  }
}

// fp64 output of one row under one mask, with the mask's own maximum (O = 0 when nothing is allowed).
std::vector<double> exact_row(const TensorView& q, const TensorView& k, const TensorView& v, std::int64_t b,
                              std::int64_t h, std::int64_t row, double scale, const CandidateMask& mask) {
  const std::int64_t n = k.tokens(), dim = k.head_dim(), kv = grouped_kv_head(h, q, k);
  std::vector<double> s(static_cast<std::size_t>(n), -std::numeric_limits<double>::infinity());
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < n; ++j) {
    if (!mask.allows(row, j)) continue;
    double dot = 0;
    for (std::int64_t d = 0; d < dim; ++d) dot += double(q.load(b, row, h, d)) * double(k.load(b, j, kv, d));
    s[std::size_t(j)] = dot * scale;
    m = std::max(m, s[std::size_t(j)]);
  }
  std::vector<double> o(static_cast<std::size_t>(dim), 0.0);
  double z = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    if (!mask.allows(row, j)) continue;
    const double e = std::exp(s[std::size_t(j)] - m);
    z += e;
    for (std::int64_t d = 0; d < dim; ++d) o[std::size_t(d)] += e * double(v.load(b, j, kv, d));
  }
  if (z == 0.0) return o;
  for (double& x : o) x /= z;
  return o;
}

// out[d] += in[d] for d < count.
STSA_VECTOR_CLONES void add_row(float* __restrict out, const float* __restrict in, std::int64_t count) {
  for (std::int64_t d = 0; d < count; ++d) out[d] += in[d];
}

// The 32 rows of V, `padded` channels each, in one pair panel of 32 keys
// (pack.hpp: [16][kernel_dim] words, keys 2i and 2i + 1 of channel d in word
// i * kernel_dim + d, the even key in the low half), as fp32: exact.
STSA_VECTOR_CLONES void unpack_value_panel(const std::uint32_t* __restrict panel, std::int64_t kernel_dim,
                                           std::int64_t padded, float* __restrict rows) {
  for (std::int64_t i = 0; i < cpu::kRoutingPanelKeys / 2; ++i) {
    float* even = rows + 2 * i * padded;
    float* odd = even + padded;
    for (std::int64_t d = 0; d < padded; ++d) {
      const std::uint32_t pair = panel[i * kernel_dim + d];
      even[d] = std::bit_cast<float>(pair << 16);
      odd[d] = std::bit_cast<float>(pair & 0xffff0000u);
    }
  }
}

// One work item on the vector units: keys [chunk * kKeysPerChunk, ...) for a
// group of heads and one row set. Per sub-chunk of keys, two passes shared by
// all sampled rows, so that each block of K and V is converted once and stays
// in cache while every row uses it (file comment). The scores come from fp32
// FMAs on scaled queries, or (`pairs`: bf16 or fp8 inputs on AVX-512) from
// VDPBF16PS on bf16 pairs of the unscaled values, K and V packed by the
// attention kernel's packer and V turned back into fp32 rows, exactly, for
// the weighted sums, which are fp32 FMAs either way. Whether a head's scores
// take pairs is its own choice (pair_scores), never its group's: a head's bits
// do not depend on the heads beside it.
class VectorChunk {
 public:
  VectorChunk(bool pairs, const TensorView& q, const TensorView& k, const TensorView& v,
              std::span<const std::int64_t> heads, std::span<const float> scales, const RowSet& rows,
              const std::vector<CandidateMask>& masks, std::int64_t chunk, ChunkScratch& sc,
              std::span<ChunkPartial> out)
      : pairs_(pairs), q_(q), k_(k), v_(v), heads_(heads), scales_(scales), rows_(rows), masks_(masks), sc_(sc),
        out_(out),
        dim_(k.head_dim()),
        padded_(partial_dim(dim_)),
        kernel_dim_(round_up(dim_, cpu::kRoutingDimStep)),
        begin_(chunk * kKeysPerChunk),
        end_(std::min(k.tokens(), begin_ + kKeysPerChunk)),
        candidates_(masks.size()),
        outputs_(candidates_ + 1),
        count_(std::int64_t(rows.positions.size())),
        group_(std::int64_t(heads.size())),
        // Rows of the score buffers: whole blocks of either product's rows.
        row_pad_(round_up(std::max<std::int64_t>(count_, 1), std::max(kPairScoreRows, kRowBlock))),
        acc_row_(outputs_ * std::size_t(padded_)),
        q_head_(std::size_t(row_pad_ * dim_)),
        q_pairs_head_(std::size_t(row_pad_ * kernel_dim_ / 2)),
        kt_head_(std::size_t(dim_ * kKeyBlock)),
        kt_pairs_head_(std::size_t(kKeyBlock / 2 * kernel_dim_)),
        v_pairs_head_(std::size_t(kKeysPerSubChunk / 2 * kernel_dim_)),
        vb_head_(std::size_t(padded_ * kKeyBlock)),
        e_head_(std::size_t(row_pad_ * kKeysPerSubChunk)),
        sum_head_(std::size_t(count_ * kBlocksPerSubChunk)) {}

  void run() {
    pair_head_.resize(std::size_t(group_));
    for (std::int64_t g = 0; g < group_; ++g) {
      // Pairs: the call's choice, unless the head is bf16 with a score scale past
      // kBf16PairScoreScaleLimit, where products VDPBF16PS flushes would matter.
      const bool pairs =
          pairs_ && !(q_.dtype == DType::BF16 && double(std::abs(scale_of(g))) >= cpu::kBf16PairScoreScaleLimit);
      pair_head_[std::size_t(g)] = pairs;
      (pairs ? pair_heads_ : fp32_heads_) += 1;
    }
    for (ChunkPartial& o : out_) o.reset(count_, outputs_, dim_);
    if (count_ == 0 || group_ == 0 || begin_ >= end_) return;
    allocate();
    for (std::int64_t g = 0; g < group_; ++g) load_queries(g);
    for (std::int64_t s0 = begin_; s0 < end_; s0 += kKeysPerSubChunk) {
      const std::int64_t s1 = std::min(end_, s0 + kKeysPerSubChunk), blocks = (s1 - s0 + kKeyBlock - 1) / kKeyBlock;
      for (std::int64_t blk = 0; blk < blocks; ++blk) {
        const std::int64_t k0 = s0 + blk * kKeyBlock, len = std::min(kKeyBlock, s1 - k0);
        if (fp32_heads_ > 0) score_block_fp32(k0, len, blk);
        if (pair_heads_ > 0) score_block_pairs(k0, len, blk);
      }
      // Online softmax: weights relative to the running maximum (earlier sums are
      // rescaled when it grows), and their per-block sums (what a mask that takes a
      // block whole adds to its normaliser).
      for (std::int64_t g = 0; g < group_; ++g) {
        ChunkPartial& o = out_[std::size_t(g)];
        const float scale = pair_scores(g) ? scale_of(g) : 1.f;  // (fp32: in the queries)
        softmax_sub_chunk(sc_.e.data() + std::size_t(g) * e_head_, kKeysPerSubChunk, count_, s1 - s0,
                          kKeysPerSubChunk, scale, o.max.data(), sc_.factor.data(),
                          sc_.block_sum.data() + std::size_t(g) * sum_head_);
        rescale_partial(o, outputs_, acc_row_, sc_.factor.data());
        o.flops += 2.0 * double(count_) * double(s1 - s0) * double(dim_);
      }
      for (std::int64_t blk = 0; blk < blocks; ++blk) {
        const std::int64_t k0 = s0 + blk * kKeyBlock, len = std::min(kKeyBlock, s1 - k0);
        load_values(k0, len, blk);
        for (std::int64_t g = 0; g < group_; ++g) weighted_sums(g, k0, len, blk);
      }
    }
    for (ChunkPartial& o : out_) o.add_output_flops(count_, end_ - begin_, dim_);
  }

 private:
  static constexpr std::int64_t kPairScoreRows = 8;  // routing_scores_avx512's row block
  static constexpr std::int64_t kBlocksPerSubChunk = kKeysPerSubChunk / kKeyBlock;
  static constexpr std::int64_t kPanels = kKeyBlock / cpu::kRoutingPanelKeys;  // pair panels a block
  static_assert(kKeyBlock % cpu::kRoutingPanelKeys == 0);

  float scale_of(std::int64_t g) const { return scales_[std::size_t(heads_[std::size_t(g)])]; }

  // Whether head g's scores come from bf16 pairs (decided once, in run()).
  bool pair_scores(std::int64_t g) const { return pair_head_[std::size_t(g)] != 0; }

  void allocate() {
    // (Buffers of both kinds per head of the group, used by its heads of each kind.)
    const auto group = std::size_t(group_);
    if (pair_heads_ > 0) {
      sc_.q_pairs.assign(q_pairs_head_ * group, 0u);
      sc_.kt_pairs.resize(kt_pairs_head_ * group);
      sc_.v_pairs.resize(v_pairs_head_ * group);
    }
    if (fp32_heads_ > 0) {
      sc_.qs.assign(q_head_ * group, 0.f);
      sc_.kt.resize(kt_head_ * group);
      sc_.key_rows.resize(kt_head_ * group);
    }
    sc_.vb.resize(vb_head_ * group);
    sc_.tile.resize(std::size_t(kRowBlock * kKeyBlock));
    sc_.e.resize(e_head_ * group);
    sc_.block_sum.resize(sum_head_ * group);
    sc_.masked.resize(std::size_t(count_) * candidates_ * kKeyBlock);
    sc_.block_partial.resize(std::size_t(count_ * padded_));
    sc_.zeros.assign(std::size_t(kKeyBlock), 0.f);
    sc_.sink.resize(std::size_t(padded_));
    sc_.factor.resize(std::size_t(count_));
  }

  // Head g's sampled rows: scaled fp32 rows, or bf16 pairs padded to kernel_dim_.
  void load_queries(std::int64_t g) {
    const std::int64_t h = heads_[std::size_t(g)];
    const float scale = scale_of(g);
    const bool pairs = pair_scores(g);
    for (std::int64_t r = 0; r < count_; ++r) {
      const std::int64_t position = rows_.positions[std::size_t(r)];
      if (pairs) {
        std::uint32_t* row = sc_.q_pairs.data() + std::size_t(g) * q_pairs_head_ + std::size_t(r * kernel_dim_ / 2);
        cpu::load_row_pairs(q_, rows_.batch, position, h, false, row, kernel_dim_);
      } else {
        float* row = sc_.qs.data() + std::size_t(g) * q_head_ + std::size_t(r * dim_);
        load_row(q_, rows_.batch, position, h, row);
        for (std::int64_t d = 0; d < dim_; ++d) row[d] *= scale;
      }
    }
  }

  // Scores of keys [k0, k0 + len) (block blk of the sub-chunk) for the heads whose
  // scores are fp32. Each key row is read once for all those heads.
  void score_block_fp32(std::int64_t k0, std::int64_t len, std::int64_t blk) {
    const std::int64_t row_blocks = row_pad_ / kRowBlock, b = rows_.batch;
    if (len < kKeyBlock) std::fill(sc_.key_rows.begin(), sc_.key_rows.end(), 0.f);
    for (std::int64_t j = 0; j < len; ++j)
      for (std::int64_t g = 0; g < group_; ++g)
        if (!pair_scores(g))
          load_row(k_, b, k0 + j, grouped_kv_head(heads_[std::size_t(g)], q_, k_),
                   sc_.key_rows.data() + std::size_t(g) * kt_head_ + std::size_t(j * dim_));
    for (std::int64_t g = 0; g < group_; ++g) {
      if (pair_scores(g)) continue;
      float* kt = sc_.kt.data() + std::size_t(g) * kt_head_;
      transpose_block(sc_.key_rows.data() + std::size_t(g) * kt_head_, dim_, kt);
      for (std::int64_t rb = 0; rb < row_blocks; ++rb) {
        score_rows(sc_.qs.data() + std::size_t(g) * q_head_ + std::size_t(rb * kRowBlock * dim_), dim_, kt,
                   sc_.tile.data());
        for (std::int64_t r = rb * kRowBlock; r < std::min(count_, (rb + 1) * kRowBlock); ++r)
          std::copy_n(sc_.tile.begin() + (r - rb * kRowBlock) * kKeyBlock, len,
                      sc_.e.begin() + std::int64_t(std::size_t(g) * e_head_) + r * kKeysPerSubChunk + blk * kKeyBlock);
      }
    }
  }

  // The same from bf16 pairs for the other heads: K and V packed panel by panel (V
  // kept for the weighted sums), the scores unscaled (softmax_sub_chunk scales them).
  void score_block_pairs(std::int64_t k0, std::int64_t len, std::int64_t blk) {
    const cpu::RowSource source{q_, k_, v_};
    const std::int64_t panels = (len + cpu::kRoutingPanelKeys - 1) / cpu::kRoutingPanelKeys;
    const std::int64_t kt_panel = kernel_dim_ / 2 * cpu::kRoutingPanelKeys, v_panel = kt_panel;
    for (std::int64_t g = 0; g < group_; ++g) {
      if (!pair_scores(g)) continue;
      std::uint32_t* kt = sc_.kt_pairs.data() + std::size_t(g) * kt_pairs_head_;
      std::uint32_t* v = sc_.v_pairs.data() + std::size_t(g) * v_pairs_head_ + std::size_t(blk * kPanels * v_panel);
      for (std::int64_t t = 0; t < panels; ++t)
        cpu::pack_kv_tile(source, rows_.batch, heads_[std::size_t(g)], k0 / cpu::kRoutingPanelKeys + t,
                          int(cpu::kRoutingPanelKeys), nullptr, nullptr, kt + t * kt_panel, v + t * v_panel,
                          kernel_dim_);
      cpu::routing_scores_avx512(sc_.q_pairs.data() + std::size_t(g) * q_pairs_head_, kt, int(row_pad_),
                                 int(panels * cpu::kRoutingPanelKeys), int(kernel_dim_),
                                 sc_.e.data() + std::size_t(g) * e_head_ + blk * kKeyBlock, int(kKeysPerSubChunk));
    }
  }

  // V of keys [k0, k0 + len) for every head as fp32 rows of padded_ channels (zero past
  // len): from the pairs packed with K, or read as the fp32 heads' K was.
  void load_values(std::int64_t k0, std::int64_t len, std::int64_t blk) {
    if (len < kKeyBlock) std::fill(sc_.vb.begin(), sc_.vb.end(), 0.f);
    const std::int64_t v_panel = kernel_dim_ / 2 * cpu::kRoutingPanelKeys;
    for (std::int64_t g = 0; g < group_; ++g)
      if (pair_scores(g))
        for (std::int64_t t = 0; t * cpu::kRoutingPanelKeys < len; ++t)
          unpack_value_panel(
              sc_.v_pairs.data() + std::size_t(g) * v_pairs_head_ + std::size_t((blk * kPanels + t) * v_panel),
              kernel_dim_, padded_,
              sc_.vb.data() + std::size_t(g) * vb_head_ + std::size_t(t * cpu::kRoutingPanelKeys * padded_));
    if (fp32_heads_ == 0) return;
    for (std::int64_t j = 0; j < len; ++j)
      for (std::int64_t g = 0; g < group_; ++g)
        if (!pair_scores(g))
          load_row(v_, rows_.batch, k0 + j, grouped_kv_head(heads_[std::size_t(g)], q_, k_),
                   sc_.vb.data() + std::size_t(g) * vb_head_ + std::size_t(j * padded_));
  }

  // Head g's weighted sums of V over one block, dense and per mask, and the masks'
  // normalisers. The dense weights' products are computed once per row: the dense
  // output and every mask that takes the whole block add them (the same bits as
  // computing each: accumulate_rows sums a block before adding it). Masks that
  // take some of the block get products of their own weights.
  void weighted_sums(std::int64_t g, std::int64_t k0, std::int64_t len, std::int64_t blk) {
    ChunkPartial& o = out_[std::size_t(g)];
    const float* vb = sc_.vb.data() + std::size_t(g) * vb_head_;
    const float* e = sc_.e.data() + std::size_t(g) * e_head_ + blk * kKeyBlock;
    const double* sums = sc_.block_sum.data() + std::size_t(g) * sum_head_ + blk;
    const std::int64_t global_block = k0 / kKeyBlock;
    sc_.w_rows.clear();
    sc_.o_rows.clear();
    for (std::int64_t r = 0; r < count_; ++r) {
      sc_.w_rows.push_back(e + r * kKeysPerSubChunk);
      sc_.o_rows.push_back(sc_.block_partial.data() + r * padded_);
    }
    accumulate_listed_rows(vb, /*add=*/false);
    sc_.w_rows.clear();
    sc_.o_rows.clear();
    for (std::int64_t r = 0; r < count_; ++r) {
      const float* row = e + r * kKeysPerSubChunk;
      const float* partial = sc_.block_partial.data() + r * padded_;
      const double row_sum = sums[r * kBlocksPerSubChunk];
      float* acc = o.acc.data() + std::size_t(r) * acc_row_;
      double* z = o.z.data() + std::size_t(r) * outputs_;
      add_row(acc, partial, padded_);
      z[0] += row_sum;
      const std::int64_t qpos = rows_.positions[std::size_t(r)];
      for (std::size_t c = 0; c < candidates_; ++c) {
        const CandidateMask& mask = masks_[c];
        const CandidateMask::Cover cover = mask.cover(qpos, global_block);
        if (cover == CandidateMask::Cover::None) continue;
        if (cover == CandidateMask::Cover::All) {
          o.kept[c] += len;
          z[c + 1] += row_sum;
          add_row(acc + (c + 1) * std::size_t(padded_), partial, padded_);
          continue;
        }
        float* masked = sc_.masked.data() + (std::size_t(r) * candidates_ + c) * kKeyBlock;
        const std::int64_t allowed =
            masked_weights(row, mask.code.data() + k0, mask.forced.data() + k0, mask.code[std::size_t(qpos)],
                           mask.forced[std::size_t(qpos)] != 0, mask.width, len, masked);
        if (allowed == 0) continue;
        o.kept[c] += allowed;
        z[c + 1] += block_sum(masked);
        sc_.w_rows.push_back(masked);
        sc_.o_rows.push_back(acc + (c + 1) * std::size_t(padded_));
      }
    }
    accumulate_listed_rows(vb, /*add=*/true);
  }

  // accumulate_rows over the listed (weights, output) rows, kRowBlock at a time
  // (the last block filled with zero weights into a sink).
  void accumulate_listed_rows(const float* vb, bool add) {
    while (sc_.w_rows.size() % kRowBlock != 0) {
      sc_.w_rows.push_back(sc_.zeros.data());
      sc_.o_rows.push_back(sc_.sink.data());
    }
    for (std::size_t i = 0; i < sc_.w_rows.size(); i += kRowBlock)
      accumulate_rows(sc_.w_rows.data() + i, vb, padded_, sc_.o_rows.data() + i, add);
  }

  const bool pairs_;
  const TensorView &q_, &k_, &v_;
  std::span<const std::int64_t> heads_;
  std::span<const float> scales_;  // by head id
  const RowSet& rows_;
  const std::vector<CandidateMask>& masks_;
  ChunkScratch& sc_;
  std::span<ChunkPartial> out_;
  const std::int64_t dim_, padded_, kernel_dim_;  // padded_: ChunkPartial::acc's rows; kernel_dim_: the pair panels'
  const std::int64_t begin_, end_;
  const std::size_t candidates_, outputs_;
  const std::int64_t count_, group_, row_pad_;
  // Per head, in the scratch buffers: accumulator row, queries (fp32, pairs), a key
  // block (fp32, pairs), the sub-chunk's V pairs, a value block, the sub-chunk's
  // weights and block sums.
  const std::size_t acc_row_, q_head_, q_pairs_head_, kt_head_, kt_pairs_head_, v_pairs_head_, vb_head_, e_head_,
      sum_head_;
  std::vector<std::uint8_t> pair_head_;            // per head of the group: its scores take pairs
  std::int64_t pair_heads_ = 0, fp32_heads_ = 0;  // how many heads take pairs, fp32
};

}  // namespace

void ChunkPartial::reset(std::int64_t rows, std::size_t outputs, std::int64_t dim) {
  const auto count = std::size_t(rows);
  max.assign(count, -std::numeric_limits<float>::infinity());
  z.assign(count * outputs, 0.0);
  acc.assign(count * outputs * std::size_t(partial_dim(dim)), 0.f);
  kept.assign(outputs - 1, 0);
  flops = 0;
}

void ChunkPartial::add_output_flops(std::int64_t rows, std::int64_t keys, std::int64_t dim) {
  for (const std::int64_t pairs : kept) flops += 2.0 * double(pairs) * double(dim);
  flops += 2.0 * double(rows) * double(keys) * double(dim);
}

ProductUnits pair_units(Isa isa, const TensorView& q, const TensorView& k, const TensorView& v) {
  const DType dtype = q.dtype;
  if (k.dtype != dtype || v.dtype != dtype || q.head_dim() > cpu::kMaxPairPanelDim) return ProductUnits::Fma;
  const bool bf16_or_fp8 = dtype == DType::BF16 || dtype == DType::F8E4M3;
  if (isa == Isa::Amx && (bf16_or_fp8 || dtype == DType::F16)) return ProductUnits::AmxTiles;
  if (isa == Isa::Avx512 && bf16_or_fp8) return ProductUnits::Bf16Dot;
  return ProductUnits::Fma;
}

std::int64_t key_chunks(std::int64_t tokens) { return (tokens + kKeysPerChunk - 1) / kKeysPerChunk; }

void sampled_chunk(ProductUnits units, const TensorView& q, const TensorView& k, const TensorView& v,
                   std::span<const std::int64_t> heads, std::span<const float> scales, const RowSet& rows,
                   const std::vector<CandidateMask>& masks, std::int64_t chunk, ChunkScratch& sc,
                   std::span<ChunkPartial> out) {
  VectorChunk(units == ProductUnits::Bf16Dot, q, k, v, heads, scales, rows, masks, chunk, sc, out).run();
}

void combine_chunks(const TensorView& q, const TensorView& k, const TensorView& v, std::int64_t head, float scale,
                    double out_scale, const RowSet& rows, const std::vector<CandidateMask>& masks,
                    std::span<const ChunkPartial> chunks, SampledErrors& into) {
  const std::int64_t dim = k.head_dim(), padded = partial_dim(dim);
  const std::size_t candidates = masks.size(), outputs = candidates + 1;
  into.squared_error.resize(candidates, 0.0);
  for (const ChunkPartial& c : chunks) into.flops += c.flops;
  std::vector<double> factor(chunks.size()), o(outputs * std::size_t(dim)), z(outputs);
  for (std::size_t r = 0; r < rows.positions.size(); ++r) {
    // Rescale every chunk to the row's overall maximum (non-finite scores poison the row).
    double top = -std::numeric_limits<double>::infinity();
    bool finite = true;
    for (const ChunkPartial& c : chunks) {
      finite = finite && std::isfinite(c.max[r]);
      top = std::max(top, double(c.max[r]));
    }
    if (!finite) {
      into.squared_reference = std::numeric_limits<double>::quiet_NaN();
      for (double& e : into.squared_error) e = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    for (std::size_t i = 0; i < chunks.size(); ++i) factor[i] = std::exp(double(chunks[i].max[r]) - top);
    std::fill(o.begin(), o.end(), 0.0);
    std::fill(z.begin(), z.end(), 0.0);
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      const ChunkPartial& c = chunks[i];
      for (std::size_t s = 0; s < outputs; ++s) {
        z[s] += factor[i] * c.z[r * outputs + s];
        const float* acc = c.acc.data() + (r * outputs + s) * std::size_t(padded);
        for (std::int64_t d = 0; d < dim; ++d) o[s * std::size_t(dim) + std::size_t(d)] += factor[i] * double(acc[d]);
      }
    }
    for (std::int64_t d = 0; d < dim; ++d)
      into.squared_reference += std::pow(out_scale * (o[std::size_t(d)] / z[0]), 2);
    for (std::size_t c = 0; c < candidates; ++c) {
      const double* oc = o.data() + (c + 1) * std::size_t(dim);
      if (z[c + 1] > kUnderflowFloor || !std::isfinite(z[c + 1])) {
        for (std::int64_t d = 0; d < dim; ++d)
          into.squared_error[c] += std::pow(out_scale * (oc[d] / z[c + 1] - o[std::size_t(d)] / z[0]), 2);
        continue;
      }
      const std::vector<double> exact = exact_row(q, k, v, rows.batch, head, rows.positions[r], scale, masks[c]);
      for (std::int64_t d = 0; d < dim; ++d)
        into.squared_error[c] += std::pow(out_scale * (exact[std::size_t(d)] - o[std::size_t(d)] / z[0]), 2);
    }
  }
}

}  // namespace stsa::router_detail
