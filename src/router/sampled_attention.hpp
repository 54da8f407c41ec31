// Exact attention of a few sampled query rows of one head against all keys,
// dense and under each candidate mask, reduced to squared output errors.
//
// The keys are cut into fixed chunks of kKeysPerChunk (independent of the thread
// count). A work item takes one chunk for a group of heads: it reads each key's
// row once for all heads of the group (per-head reads of a [B, N, H, D] tensor
// stride over the other heads and run at a fraction of the memory bandwidth),
// walks the chunk in fixed sub-chunks with an online softmax, and yields partial
// sums per head relative to their maximum; combine_chunks() merges a head's
// chunks in chunk order. Which heads share an item does not change any head's
// arithmetic, so the result is bit-identical however many threads ran.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "router/candidate_mask.hpp"
#include "stsa/cpu.hpp"
#include "stsa/tensor.hpp"

namespace stsa::router_detail {

constexpr std::int64_t kKeysPerSubChunk = 512;  // scores of one sub-chunk stay in L2
constexpr std::int64_t kKeysPerChunk = 4096;
static_assert(kKeysPerSubChunk % CandidateMask::kBlock == 0 && kKeysPerChunk % kKeysPerSubChunk == 0);

struct SampledErrors {
  std::vector<double> squared_error;  // per candidate: sum over rows and channels of (O_mask - O_dense)^2
  double squared_reference = 0;       // sum of O_dense^2
  double flops = 0;                   // scores + weighted sums actually computed
};

// The sampled rows of one batch entry: token positions in tensor order.
struct RowSet {
  std::int64_t batch = 0;
  std::vector<std::int64_t> positions;
};

// Partial sums of one (head, row set, key chunk); outputs = 1 (dense) + candidates.
struct ChunkPartial {
  std::vector<float> max;          // [rows]: the chunk's largest scaled score (NaN: a non-finite score)
  std::vector<double> z;           // [rows][outputs]: sums of exp(s - max) over allowed keys
  std::vector<float> acc;          // [rows][outputs][partial_dim(D), sampled_weights.hpp]: the same weights times V
  std::vector<std::int64_t> kept;  // [candidates]: allowed (row, key) pairs
  double flops = 0;

  // Empty sums for `rows` rows, `outputs` outputs and head dim `dim`: no pairs kept, no FLOPs.
  void reset(std::int64_t rows, std::size_t outputs, std::int64_t dim);
  // Once `kept` is final, the FLOPs of the outputs: the dense one's over `keys` keys and each
  // candidate's kept pairs (the scores are counted as they run).
  void add_output_flops(std::int64_t rows, std::int64_t keys, std::int64_t dim);
};

// Per-thread buffers, reused across items.
struct ChunkScratch {
  std::vector<float> qs, key_rows, kt, vb, tile, e, masked, zeros, sink, factor, block_partial;
  std::vector<double> block_sum;
  std::vector<const float*> w_rows;
  std::vector<float*> o_rows;
  // sampled_chunk_tiles: Q, K and V as bf16 pairs, the weights' bf16 parts, the
  // outputs' accumulators, which tile products are not all zero, the row orders.
  std::vector<std::uint32_t> q_pairs, kt_pairs, v_pairs;
  std::vector<std::uint16_t> w_parts;
  std::vector<float> acc_tiles;
  std::vector<std::uint8_t> live;
  std::vector<std::int64_t> order;
};

std::int64_t key_chunks(std::int64_t tokens);

// Fills out[g] for keys [chunk * kKeysPerChunk, ...) of (rows.batch, heads[g]), for every g;
// head h's scores are scaled by scales[h] (the scale of rows.batch's heads, descales included).
// `units` Fma: fp32 vectors throughout; Bf16Dot (pair_units' choice for bf16 or fp8 inputs on
// AVX-512): the scores as VDPBF16PS products of bf16 pairs, exact and summed in fp32 (but for a
// bf16 head whose score scale reaches cpu::kBf16PairScoreScaleLimit), the weighted sums as with Fma.
void sampled_chunk(ProductUnits units, const TensorView& q, const TensorView& k, const TensorView& v,
                   std::span<const std::int64_t> heads, std::span<const float> scales, const RowSet& rows,
                   const std::vector<CandidateMask>& masks, std::int64_t chunk, ChunkScratch& scratch,
                   std::span<ChunkPartial> out);

// The units the sampled attention of these inputs runs on: AmxTiles
// (sampled_chunk_tiles) where `isa` (resolved) is Amx and Q, K and V are all
// bf16, all fp16 or all fp8; Bf16Dot (sampled_chunk's pair scores) where it is
// Avx512 and they are all bf16 or all fp8 (fp16 would take four products of its
// parts where fp32 takes one FMA); otherwise Fma. Either pair unit needs a head
// dim of at most cpu::kMaxPairPanelDim (padded to a multiple of 32 with zero
// channels). A head that cannot take pairs (bf16 with a score scale of at least
// cpu::kBf16PairScoreScaleLimit, where flushed Q K products would matter; for the
// tiles also tiny V) is computed in fp32 on its own.
ProductUnits pair_units(Isa isa, const TensorView& q, const TensorView& k, const TensorView& v);

// sampled_chunk's partial sums from AMX tile products (sampled_attention_tiles.cpp):
// scores exact products summed in fp32, as sampled_chunk's; the weights as two
// bf16 parts each (within 2^-16 of themselves) times V. Returns false, with `out`
// unspecified, when the chunk holds a nonzero |V| below kTinyV (pack.hpp), whose
// products the tile unit would flush to zero, or a head is bf16 with a score scale of
// at least cpu::kBf16PairScoreScaleLimit, where its flushed Q K products would matter:
// the caller then runs sampled_chunk.
bool sampled_chunk_tiles(const TensorView& q, const TensorView& k, const TensorView& v,
                         std::span<const std::int64_t> heads, std::span<const float> scales, const RowSet& rows,
                         const std::vector<CandidateMask>& masks, std::int64_t chunk, ChunkScratch& scratch,
                         std::span<ChunkPartial> out);

// Adds the rows' errors, merged over all chunks of the row set (in order), to `into`:
// squared differences of the outputs times out_scale (V's descale for rows.batch and head).
void combine_chunks(const TensorView& q, const TensorView& k, const TensorView& v, std::int64_t head, float scale,
                    double out_scale, const RowSet& rows, const std::vector<CandidateMask>& masks,
                    std::span<const ChunkPartial> chunks, SampledErrors& into);

}  // namespace stsa::router_detail
