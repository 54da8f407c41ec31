// How tokens and heads are split over ranks, and the bytes a call moves
// (computed from the shapes, for comparison with what the communicator counted).
#include <algorithm>
#include <string>

#include "stsa/dist.hpp"

namespace stsa::dist {
namespace {

void check_ranks(int ranks, int rank) {
  STSA_CHECK(ranks >= 1, InvalidArgument, "rank count must be >= 1, got ", ranks);
  STSA_CHECK(rank >= 0 && rank < ranks, InvalidArgument, "rank ", rank, " out of range [0, ", ranks, ")");
}

// Bytes of one (token, head) row of output plus its LSE value.
std::int64_t output_row_bytes(const VideoLayout& layout, DType out_dtype, bool with_lse) {
  return layout.head_dim * std::int64_t(element_size(out_dtype)) + (with_lse ? std::int64_t(sizeof(float)) : 0);
}

std::int64_t temporal_head_count(const VideoLayout& layout, std::span<const MaskSpec> masks) {
  STSA_CHECK(masks.size() == 1 || std::int64_t(masks.size()) == layout.heads, InvalidArgument, "got ", masks.size(),
             " masks for ", layout.heads, " heads (give one per head, or one for all)");
  std::int64_t temporal = 0;
  for (const MaskSpec& m : masks) temporal += m.natural_order() == TokenOrder::SpatialMajor ? 1 : 0;
  return masks.size() == 1 ? temporal * layout.heads : temporal;
}

// K and V's heads: the layout's for 0, else `kv_heads`, which must divide them (grouped-query attention).
std::int64_t resolved_kv_heads(const VideoLayout& layout, std::int64_t kv_heads) {
  if (kv_heads == 0) return layout.heads;
  STSA_CHECK(kv_heads >= 1 && kv_heads <= layout.heads && layout.heads % kv_heads == 0, InvalidArgument,
             "K/V heads must divide the ", layout.heads, " heads (grouped-query attention), got ", kv_heads);
  return kv_heads;
}

}  // namespace

Shard sequence_shard(std::int64_t video_tokens, int ranks, int rank) {
  check_ranks(ranks, rank);
  STSA_CHECK(video_tokens >= 0, InvalidArgument, "video token count must be >= 0, got ", video_tokens);
  const std::int64_t base = video_tokens / ranks, extra = video_tokens % ranks;
  return {rank * base + std::min<std::int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

std::int64_t heads_per_rank(std::int64_t heads, int ranks) {
  STSA_CHECK(heads >= 1, InvalidArgument, "head count must be >= 1, got ", heads);
  STSA_CHECK(ranks >= 1, InvalidArgument, "rank count must be >= 1, got ", ranks);
  if (heads % ranks != 0) {
    std::string divisors;
    for (std::int64_t p = 1; p <= heads; ++p)
      if (heads % p == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(p);
    throw InvalidArgument(::stsa::detail::concat("Ulysses splits heads over ranks: ", heads, " heads cannot be split over ",
                                         ranks, " ranks; run with a rank count that divides ", heads, " (",
                                         divisors, ")"));
  }
  return heads / ranks;
}

UlyssesVolume ulysses_volume(const VideoLayout& layout, DType in_dtype, DType out_dtype, bool with_lse, int ranks,
                             int rank, std::int64_t kv_heads) {
  layout.validate();
  check_ranks(ranks, rank);
  const std::int64_t local = heads_per_rank(layout.heads, ranks), other = layout.heads - local;
  const std::int64_t kv = resolved_kv_heads(layout, kv_heads);
  const std::int64_t kv_local = heads_per_rank(kv, ranks), kv_other = kv - kv_local;
  const std::int64_t video = layout.grid.video_tokens(), text = layout.grid.text_tokens;
  const std::int64_t mine = sequence_shard(video, ranks, rank).count, elsewhere = video - mine;
  const std::int64_t in_row = layout.head_dim * std::int64_t(element_size(in_dtype));
  const std::int64_t out_row = output_row_bytes(layout, out_dtype, with_lse);
  const std::int64_t b = layout.batch;
  UlyssesVolume v;
  // Q, K, V: my tokens of the other ranks' heads go out; their tokens of my heads come in.
  v.scatter_sent = b * mine * (other + 2 * kv_other) * in_row;
  v.scatter_received = b * elsewhere * (local + 2 * kv_local) * in_row;
  // O (+LSE): the other ranks' tokens of my heads go back; my tokens of their heads come in.
  // Text outputs of my heads go to every other rank; theirs come to me.
  v.gather_sent = b * elsewhere * local * out_row + std::int64_t(ranks - 1) * b * text * local * out_row;
  v.gather_received = b * mine * other * out_row + b * text * other * out_row;
  return v;
}

double ulysses_formula_bytes(const VideoLayout& layout, DType in_dtype, DType out_dtype, bool with_lse, int ranks,
                             std::int64_t kv_heads) {
  layout.validate();
  check_ranks(ranks, 0);
  const double p = ranks, b = double(layout.batch), h = double(layout.heads), d = double(layout.head_dim);
  const double kv = double(resolved_kv_heads(layout, kv_heads));
  const double shard = double(layout.grid.video_tokens()) / p, away = (p - 1.0) / p;
  const double in_bytes = double(element_size(in_dtype)), out_bytes = double(element_size(out_dtype));
  double bytes = (h + 2.0 * kv) * b * shard * d * away * in_bytes + b * shard * h * d * away * out_bytes;
  if (with_lse) bytes += b * shard * h * away * double(sizeof(float));
  const double text_row = d * out_bytes + (with_lse ? double(sizeof(float)) : 0.0);
  bytes += (p - 1.0) * b * double(layout.grid.text_tokens) * (h / p) * text_row;
  return bytes;
}

std::int64_t sharded_permutation_bytes(const VideoLayout& layout, std::span<const MaskSpec> masks, DType in_dtype,
                                       DType out_dtype, bool with_lse, int ranks, int rank) {
  layout.validate();
  check_ranks(ranks, rank);
  const std::int64_t temporal = temporal_head_count(layout, masks);
  if (temporal == 0 || ranks == 1) return 0;
  const VideoGrid& grid = layout.grid;
  const std::int64_t per_frame = grid.tokens_per_frame(), video = grid.video_tokens();
  const Shard mine = sequence_shard(video, ranks, rank);
  // Tokens whose frame-major and spatial-major positions fall in different shards
  // must cross ranks: forward for Q, K, V (from my frame-major shard), back for O
  // (from my spatial-major shard).
  std::int64_t leaving = 0, returning = 0;
  for (std::int64_t p = mine.begin; p < mine.end(); ++p) {
    const std::int64_t spatial = grid.video_position(p / per_frame, p % per_frame, TokenOrder::SpatialMajor);
    if (spatial < mine.begin || spatial >= mine.end()) ++leaving;
    const TokenCoord c = grid.coord(grid.video_begin() + p, TokenOrder::SpatialMajor);
    const std::int64_t frame_major = grid.video_position(c.frame, c.patch, TokenOrder::FrameMajor);
    if (frame_major < mine.begin || frame_major >= mine.end()) ++returning;
  }
  const std::int64_t in_row = layout.head_dim * std::int64_t(element_size(in_dtype));
  return layout.batch * temporal *
         (3 * leaving * in_row + returning * output_row_bytes(layout, out_dtype, with_lse));
}

}  // namespace stsa::dist
