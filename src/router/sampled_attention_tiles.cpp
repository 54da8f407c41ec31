// sampled_chunk's work on AMX tiles. Per sub-chunk of keys:
//   1. K and V packed as bf16 pairs (pack_kv_tile, the attention kernel's
//      packer; fp16 as two bf16 parts, fp8 as its bf16 bits) for a few heads
//      at once, 32 keys at a time, so that each key's rows of those heads,
//      side by side in a [B, N, H, D] tensor, are read together (one head at
//      a time, rows a whole [H, D] row apart wait for memory: packing took a
//      third longer);
//   2. per head, S = Q K^T for all sampled rows as tile products, and the
//      online softmax (sampled_weights.hpp) as in sampled_chunk;
//   3. a weight matrix with one row per (output, sampled row): the dense
//      weights, and per candidate mask the same with the keys it forbids set to
//      0 (blocks it does not touch all 0, blocks it takes whole copied), each
//      weight as two bf16 parts; then tile products add W V to every output's
//      accumulators at once. Each candidate's rows are sorted by the mask's
//      codes, so the rows of a tile allow nearby keys, and products whose 16
//      rows allow none of their 32 keys are skipped.
// Apart from those skipped products every output row multiplies every key,
// where sampled_chunk skips each row's blocks a mask does not touch: the tile
// unit does the extra products faster than the vector unit would decide which
// to skip. The normalisers and the kept-pair counts are sampled_chunk's,
// block by block. A head dim that is not a multiple of 32 (the tile products'
// depth) runs padded with zero channels to the next one, as the attention
// kernel pads its (pack.hpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/round_up.hpp"
#include "cpu/pack.hpp"
#include "cpu/routing_tiles.hpp"
#include "router/sampled_attention.hpp"
#include "router/sampled_weights.hpp"

namespace stsa::router_detail {
namespace {

constexpr std::int64_t kRowTile = 16;  // rows of a tile product
constexpr std::int64_t kPanelKeys = cpu::kRoutingPanelKeys;
constexpr std::int64_t kWidth = kKeysPerSubChunk;
constexpr std::int64_t kBlocksPerSubChunk = kWidth / kKeyBlock;
constexpr std::int64_t kKeySteps = kWidth / kPanelKeys;  // key steps of a tile product per sub-chunk
constexpr std::int64_t kPackHeads = 4;  // heads packed together (their panels stay in L2)
static_assert(kWidth % kPanelKeys == 0 && kKeyBlock % kPanelKeys == 0);

// A block of kKeyBlock weight parts set to 0. (A copy of zeros: GCC makes a
// 128-byte memset a rep stosq, whose start-up cost was most of building the weights.)
void zero_block(std::uint16_t* at) {
  static constexpr std::uint16_t kZeros[kKeyBlock] = {};
  std::memcpy(at, kZeros, sizeof kZeros);
}

// One work item: a chunk of keys for a group of heads and one row set.
class TileChunk {
 public:
  TileChunk(const TensorView& q, const TensorView& k, const TensorView& v, std::span<const std::int64_t> heads,
            std::span<const float> scales, const RowSet& rows, const std::vector<CandidateMask>& masks,
            std::int64_t chunk, ChunkScratch& sc, std::span<ChunkPartial> out)
      : q_(q), k_(k), v_(v), heads_(heads), scales_(scales), rows_(rows), masks_(masks), sc_(sc), out_(out),
        dim_(k.head_dim()),
        kernel_dim_(round_up(dim_, cpu::kRoutingDimStep)),
        partial_dim_(partial_dim(dim_)),
        begin_(chunk * kKeysPerChunk),
        end_(std::min(k.tokens(), begin_ + kKeysPerChunk)),
        candidates_(masks.size()),
        outputs_(candidates_ + 1),
        count_(std::int64_t(rows.positions.size())),
        parts_(q.dtype == DType::F16 ? 2 : 1),
        row_pad_(round_up(std::max<std::int64_t>(count_, 1), kRowTile)),
        out_rows_(std::int64_t(outputs_) * row_pad_),
        q_words_(row_pad_ * parts_ * kernel_dim_ / 2),
        kt_panel_(parts_ * kernel_dim_ / 2 * kPanelKeys),
        v_panel_(parts_ * kPanelKeys / 2 * kernel_dim_),
        w_part_(out_rows_ * kWidth) {}

  bool run() {
    for (ChunkPartial& o : out_) o.reset(count_, outputs_, dim_);
    if (count_ == 0 || begin_ >= end_) return true;
    // The tile unit flushes products under 2^-126: a bf16 head whose score scale would make them
    // matter takes the fp32 path, as a head with tiny V does (per head, whatever heads are beside it).
    if (q_.dtype == DType::BF16)
      for (const std::int64_t head : heads_)
        if (double(std::abs(scales_[std::size_t(head)])) >= cpu::kBf16PairScoreScaleLimit) return false;
    allocate();
    sort_candidate_rows();
    const auto group = std::int64_t(heads_.size());
    for (std::int64_t first = 0; first < group; first += kPackHeads) {
      const std::int64_t pack = std::min(kPackHeads, group - first);
      for (std::int64_t i = 0; i < pack; ++i) load_queries(first, i);
      std::fill(sc_.acc_tiles.begin(), sc_.acc_tiles.end(), 0.f);
      for (std::int64_t s0 = begin_; s0 < end_; s0 += kWidth) {
        const std::int64_t len = std::min(kWidth, end_ - s0);
        if (!pack_keys(first, pack, s0, len)) return false;
        for (std::int64_t i = 0; i < pack; ++i) head_step(first, i, s0, len);
      }
      for (std::int64_t i = 0; i < pack; ++i) finish(first + i, i);
    }
    return true;
  }

 private:
  void allocate() {
    sc_.q_pairs.assign(std::size_t(kPackHeads * q_words_), 0u);
    sc_.kt_pairs.resize(std::size_t(kPackHeads * kKeySteps * kt_panel_));
    sc_.v_pairs.resize(std::size_t(kPackHeads * kKeySteps * v_panel_));
    sc_.acc_tiles.resize(std::size_t(kPackHeads * out_rows_ * kernel_dim_));
    sc_.e.resize(std::size_t(row_pad_ * kWidth));
    sc_.block_sum.resize(std::size_t(count_ * kBlocksPerSubChunk));
    sc_.factor.resize(std::size_t(count_));
    sc_.masked.resize(std::size_t(kKeyBlock));
    sc_.live.resize(std::size_t(out_rows_ / kRowTile * kKeySteps));
    sc_.w_parts.resize(std::size_t(2 * w_part_));
    // Padding rows: weights 0 (their outputs are never read).
    for (std::size_t s = 0; s < outputs_; ++s)
      for (std::uint16_t* part : {high(), low()})
        std::fill(part + (std::int64_t(s) * row_pad_ + count_) * kWidth,
                  part + (std::int64_t(s) + 1) * row_pad_ * kWidth, std::uint16_t{0});
  }

  std::uint16_t* high() { return sc_.w_parts.data(); }
  std::uint16_t* low() { return sc_.w_parts.data() + w_part_; }

  // Each candidate's section holds the rows in the order of the mask's codes.
  void sort_candidate_rows() {
    sc_.order.resize(candidates_ * std::size_t(count_));
    for (std::size_t c = 0; c < candidates_; ++c) {
      const auto first = sc_.order.begin() + std::ptrdiff_t(c * std::size_t(count_));
      std::iota(first, first + count_, std::int64_t{0});
      const std::vector<std::int32_t>& code = masks_[c].code;
      std::stable_sort(first, first + count_, [&](std::int64_t x, std::int64_t y) {
        return code[std::size_t(rows_.positions[std::size_t(x)])] < code[std::size_t(rows_.positions[std::size_t(y)])];
      });
    }
  }

  // The sampled row at place i of output section s (0: dense, c + 1: candidate c).
  std::int64_t sample(std::size_t s, std::int64_t i) const {
    return s == 0 ? i : sc_.order[(s - 1) * std::size_t(count_) + std::size_t(i)];
  }

  void load_queries(std::int64_t first, std::int64_t i) {
    const std::int64_t h = heads_[std::size_t(first + i)], row_words = parts_ * kernel_dim_ / 2;
    for (std::int64_t r = 0; r < count_; ++r) {
      std::uint32_t* row = sc_.q_pairs.data() + i * q_words_ + r * row_words;
      if (parts_ == 1)
        cpu::load_row_pairs(q_, rows_.batch, rows_.positions[std::size_t(r)], h, false, row, kernel_dim_);
      else  // (an Inf or NaN gives a non-finite score, which is all the router asks of it)
        cpu::load_row_split_pairs(q_, rows_.batch, rows_.positions[std::size_t(r)], h, false, row, kernel_dim_);
    }
  }

  // K and V of keys [s0, s0 + len) for heads first .. first + pack - 1, 32 keys
  // (one panel) at a time for all of them. False: a V value below kTinyV.
  bool pack_keys(std::int64_t first, std::int64_t pack, std::int64_t s0, std::int64_t len) {
    const cpu::RowSource source{q_, k_, v_};
    for (std::int64_t t = 0; t * kPanelKeys < len; ++t)
      for (std::int64_t i = 0; i < pack; ++i) {
        const cpu::KvFlags flags = cpu::pack_kv_tile(
            source, rows_.batch, heads_[std::size_t(first + i)], s0 / kPanelKeys + t, int(kPanelKeys), nullptr,
            nullptr, sc_.kt_pairs.data() + (i * kKeySteps + t) * kt_panel_,
            sc_.v_pairs.data() + (i * kKeySteps + t) * v_panel_, kernel_dim_);
        if (flags.tiny) return false;
      }
    return true;
  }

  // Head first + i over keys [s0, s0 + len), its K and V packed.
  void head_step(std::int64_t first, std::int64_t i, std::int64_t s0, std::int64_t len) {
    ChunkPartial& o = out_[std::size_t(first + i)];
    const int keys = int(round_up(len, kPanelKeys));
    float* const scores = sc_.e.data();
    float* const acc = sc_.acc_tiles.data() + i * out_rows_ * kernel_dim_;
    cpu::routing_scores_amx(sc_.q_pairs.data() + i * q_words_, sc_.kt_pairs.data() + i * kKeySteps * kt_panel_,
                            int(row_pad_), keys, int(kernel_dim_), parts_, scores, int(kWidth));
    const float scale = scales_[std::size_t(heads_[std::size_t(first + i)])];
    softmax_sub_chunk(scores, kWidth, count_, len, kWidth, scale, o.max.data(), sc_.factor.data(),
                      sc_.block_sum.data());
    for (std::size_t s = 0; s < outputs_; ++s)
      for (std::int64_t place = 0; place < count_; ++place) {
        const std::int64_t r = sample(s, place);
        const float factor = sc_.factor[std::size_t(r)];
        if (factor == 1.f) continue;
        if (s == 0)
          for (std::size_t x = 0; x < outputs_; ++x) o.z[std::size_t(r) * outputs_ + x] *= double(factor);
        float* row = acc + (std::int64_t(s) * row_pad_ + place) * kernel_dim_;
        for (std::int64_t d = 0; d < dim_; ++d) row[d] *= factor;
      }
    o.flops += 2.0 * double(count_) * double(len) * double(dim_);
    weights(o, s0, len, keys);
    cpu::routing_weighted_sums_amx(high(), w_part_, 2, int(kWidth), sc_.v_pairs.data() + i * kKeySteps * v_panel_,
                                   parts_, int(out_rows_), keys, int(kernel_dim_), sc_.live.data(), int(kKeySteps),
                                   acc, int(kernel_dim_));
  }

  // The weight matrix of one sub-chunk from its softmax weights (sc_.e), each
  // mask's normalisers and kept pairs, and which products are live.
  void weights(ChunkPartial& o, std::int64_t s0, std::int64_t len, int keys) {
    const float* scores = sc_.e.data();
    const std::int64_t blocks = (len + kKeyBlock - 1) / kKeyBlock;
    constexpr std::int64_t kStepsPerBlock = kKeyBlock / kPanelKeys;
    std::fill(sc_.live.begin(), sc_.live.end(), std::uint8_t{0});
    for (std::int64_t t = 0; t < row_pad_ / kRowTile; ++t)  // the dense section: every key step
      std::fill_n(sc_.live.begin() + t * kKeySteps, keys / kPanelKeys, std::uint8_t{1});
    cpu::split_weights_amx(scores, int(count_), int(blocks * kKeyBlock), int(kWidth), w_part_, high());
    for (std::int64_t r = 0; r < count_; ++r)
      for (std::int64_t blk = 0; blk < blocks; ++blk)
        o.z[std::size_t(r) * outputs_] += sc_.block_sum[std::size_t(r * kBlocksPerSubChunk + blk)];
    for (std::size_t c = 0; c < candidates_; ++c) {
      const CandidateMask& mask = masks_[c];
      for (std::int64_t place = 0; place < count_; ++place) {
        const std::int64_t r = sample(c + 1, place), qpos = rows_.positions[std::size_t(r)];
        const float* row_weights = scores + r * kWidth;
        const double* sums = sc_.block_sum.data() + r * kBlocksPerSubChunk;
        double& z = o.z[std::size_t(r) * outputs_ + c + 1];
        const std::int64_t at_row = (std::int64_t(c) + 1) * row_pad_ + place;
        std::uint8_t* live = sc_.live.data() + at_row / kRowTile * kKeySteps;
        for (std::int64_t blk = 0; blk < blocks; ++blk) {
          const std::int64_t k0 = s0 + blk * kKeyBlock, block_len = std::min(kKeyBlock, s0 + len - k0);
          const std::int64_t col = blk * kKeyBlock, at = at_row * kWidth + col;
          switch (mask.cover(qpos, k0 / kKeyBlock)) {
            case CandidateMask::Cover::None:
              zero_block(high() + at);
              zero_block(low() + at);
              break;
            case CandidateMask::Cover::All:
              std::memcpy(high() + at, high() + r * kWidth + col, kKeyBlock * 2);
              std::memcpy(low() + at, low() + r * kWidth + col, kKeyBlock * 2);
              o.kept[c] += block_len;
              z += sums[blk];
              std::fill_n(live + blk * kStepsPerBlock, kStepsPerBlock, std::uint8_t{1});
              break;
            case CandidateMask::Cover::Some: {
              const std::int64_t allowed =
                  masked_weights(row_weights + col, mask.code.data() + k0, mask.forced.data() + k0,
                                 mask.code[std::size_t(qpos)], mask.forced[std::size_t(qpos)] != 0, mask.width,
                                 block_len, sc_.masked.data());
              o.kept[c] += allowed;
              if (allowed > 0) {
                z += block_sum(sc_.masked.data());
                std::fill_n(live + blk * kStepsPerBlock, kStepsPerBlock, std::uint8_t{1});
              }
              cpu::split_weights_amx(sc_.masked.data(), 1, int(kKeyBlock), int(kKeyBlock), w_part_, high() + at);
              break;
            }
          }
        }
      }
    }
  }

  // Head g's accumulators into its partial sums (rows in sampled order), and its FLOPs.
  void finish(std::int64_t g, std::int64_t i) {
    ChunkPartial& o = out_[std::size_t(g)];
    const float* acc = sc_.acc_tiles.data() + i * out_rows_ * kernel_dim_;
    for (std::size_t s = 0; s < outputs_; ++s)
      for (std::int64_t place = 0; place < count_; ++place)
        std::copy_n(acc + (std::int64_t(s) * row_pad_ + place) * kernel_dim_, dim_,
                    o.acc.data() + (std::size_t(sample(s, place)) * outputs_ + s) * std::size_t(partial_dim_));
    o.add_output_flops(count_, end_ - begin_, dim_);
  }

  const TensorView &q_, &k_, &v_;
  std::span<const std::int64_t> heads_;
  std::span<const float> scales_;  // by head id
  const RowSet& rows_;
  const std::vector<CandidateMask>& masks_;
  ChunkScratch& sc_;
  std::span<ChunkPartial> out_;
  const std::int64_t dim_;
  const std::int64_t kernel_dim_;   // dim_ padded to the tile products' depth (zero channels past dim_)
  const std::int64_t partial_dim_;  // ChunkPartial::acc's row length
  const std::int64_t begin_, end_;
  const std::size_t candidates_, outputs_;
  const std::int64_t count_;
  const int parts_;  // split fp16 values: a high and a low bf16 part
  // The weight matrix and the accumulators: one section of row_pad_ rows per output.
  const std::int64_t row_pad_, out_rows_, q_words_, kt_panel_, v_panel_, w_part_;
};

}  // namespace

bool sampled_chunk_tiles(const TensorView& q, const TensorView& k, const TensorView& v,
                         std::span<const std::int64_t> heads, std::span<const float> scales, const RowSet& rows,
                         const std::vector<CandidateMask>& masks, std::int64_t chunk, ChunkScratch& scratch,
                         std::span<ChunkPartial> out) {
  return TileChunk(q, k, v, heads, scales, rows, masks, chunk, scratch, out).run();
}

}  // namespace stsa::router_detail
