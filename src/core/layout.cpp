#include "stsa/layout.hpp"

#include "stsa/error.hpp"

namespace stsa {

std::string_view to_string(TokenOrder order) {
  return order == TokenOrder::FrameMajor ? "frame-major" : "spatial-major";
}

void check_token_order(std::string_view what, TokenOrder order) {
  STSA_CHECK(order == TokenOrder::FrameMajor || order == TokenOrder::SpatialMajor, InvalidArgument, what,
             "token order ", int(order), " is not a TokenOrder value");
}

std::string_view to_string(TextPlacement placement) {
  return placement == TextPlacement::Before ? "before" : "after";
}

void VideoGrid::validate() const {
  STSA_CHECK(frames >= 1, InvalidArgument, "frames must be >= 1, got ", frames);
  STSA_CHECK(height >= 1, InvalidArgument, "height must be >= 1, got ", height);
  STSA_CHECK(width >= 1, InvalidArgument, "width must be >= 1, got ", width);
  STSA_CHECK(text_tokens >= 0, InvalidArgument, "text tokens must be >= 0, got ", text_tokens);
  // (A cast integer would pass for After in positions and print as "after".)
  STSA_CHECK(text_placement == TextPlacement::Before || text_placement == TextPlacement::After, InvalidArgument,
             "text placement must be before or after, got ", int(text_placement));
  constexpr std::int64_t kMaxTokens = (std::int64_t(1) << 31) - 1;  // tile indices and plans use 32-bit columns
  std::int64_t video = 0;
  const bool overflow = __builtin_mul_overflow(frames, height, &video) || __builtin_mul_overflow(video, width, &video);
  // Compared as kMaxTokens - video: video + text_tokens could overflow for a huge text count.
  STSA_CHECK(!overflow && video <= kMaxTokens && text_tokens <= kMaxTokens - video, InvalidArgument,
             "token count of ", frames, "x", height, "x", width, " + ", text_tokens,
             " text exceeds the supported maximum of ", kMaxTokens);
}

TokenCoord VideoGrid::coord(std::int64_t position, TokenOrder order) const {
  STSA_CHECK(position >= 0 && position < tokens(), InvalidArgument, "token position ", position,
             " out of range [0, ", tokens(), ")");
  TokenCoord c;
  const std::int64_t begin = video_begin();
  if (position < begin || position >= begin + video_tokens()) {
    c.is_text = true;
    c.text_index = position < begin ? position : position - video_tokens();
    return c;
  }
  const std::int64_t v = position - begin;
  const std::int64_t per_frame = tokens_per_frame();
  if (order == TokenOrder::FrameMajor || v < per_frame) {
    c.frame = v / per_frame;
    c.patch = v % per_frame;
  } else {
    const std::int64_t rest = v - per_frame;
    c.patch = rest / (frames - 1);
    c.frame = 1 + rest % (frames - 1);
  }
  return c;
}

std::int64_t VideoGrid::video_position(std::int64_t frame, std::int64_t patch, TokenOrder order) const {
  const std::int64_t per_frame = tokens_per_frame();
  if (order == TokenOrder::FrameMajor || frame == 0) return frame * per_frame + patch;
  return per_frame + patch * (frames - 1) + (frame - 1);
}

std::int64_t VideoGrid::position(const TokenCoord& c, TokenOrder order) const {
  if (c.is_text) return c.text_index + (text_placement == TextPlacement::Before ? 0 : video_tokens());
  return video_begin() + video_position(c.frame, c.patch, order);
}

std::string VideoGrid::describe() const {
  return detail::concat(frames, "x", height, "x", width, " (+", text_tokens, " text ", to_string(text_placement), ")");
}

void VideoLayout::validate() const {
  grid.validate();
  STSA_CHECK(batch >= 1, InvalidArgument, "batch must be >= 1, got ", batch);
  STSA_CHECK(heads >= 1, InvalidArgument, "heads must be >= 1, got ", heads);
  STSA_CHECK(head_dim >= 1 && head_dim <= 512, InvalidArgument, "head dim must be in [1, 512], got ", head_dim);
  std::int64_t total = 0;
  const bool overflow = __builtin_mul_overflow(batch, grid.tokens(), &total) ||
                        __builtin_mul_overflow(total, heads, &total) ||
                        __builtin_mul_overflow(total, head_dim, &total) ||
                        __builtin_mul_overflow(total, std::int64_t(8), &total);
  STSA_CHECK(!overflow, ResourceError, "B x N x H x D = ", batch, " x ", grid.tokens(), " x ", heads, " x ", head_dim,
             " overflows 64-bit byte counts");
}

}  // namespace stsa
