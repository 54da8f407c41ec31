// Video token layouts: how the tokens of one sequence map to (frame, patch) or text.
//
// A sequence holds F frames of height x width patches (P = height * width
// tokens per frame) and optionally T text tokens placed before or after the
// video. Video tokens come in one of two orders:
//   FrameMajor   (f, y, x): position f * P + p.
//   SpatialMajor (y, x, f) with frame 0 kept in front: frame 0 occupies
//                positions [0, P) exactly as in frame-major order, then frames
//                1..F-1 interleave: token (f, p), f >= 1, sits at P + p * (F-1) + (f-1).
// Frame 0 is the global anchor, so it is one contiguous block in both orders.
// Positions above are relative to the first video token; text tokens keep
// their place in both orders.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace stsa {

enum class TokenOrder : std::uint8_t { FrameMajor, SpatialMajor };
enum class TextPlacement : std::uint8_t { Before, After };

std::string_view to_string(TokenOrder order);
std::string_view to_string(TextPlacement placement);
// InvalidArgument, prefixed by `what`, unless `order` is one of TokenOrder's values (a cast
// integer is none: coordinates read it as spatial-major).
void check_token_order(std::string_view what, TokenOrder order);

// Where a token is: a text token (index among text tokens) or a video token (frame, patch).
struct TokenCoord {
  bool is_text = false;
  std::int64_t text_index = -1;
  std::int64_t frame = -1;
  std::int64_t patch = -1;  // y * width + x
};

// The tokens of one sequence (no batch, heads or channels).
struct VideoGrid {
  std::int64_t frames = 1;
  std::int64_t height = 1;
  std::int64_t width = 1;
  std::int64_t text_tokens = 0;
  TextPlacement text_placement = TextPlacement::After;

  std::int64_t tokens_per_frame() const { return height * width; }
  std::int64_t video_tokens() const { return frames * height * width; }
  std::int64_t tokens() const { return video_tokens() + text_tokens; }
  // Position of the first video token in the sequence.
  std::int64_t video_begin() const { return text_placement == TextPlacement::Before ? text_tokens : 0; }
  std::int64_t video_end() const { return video_begin() + video_tokens(); }

  // Throws InvalidArgument for sizes < 1 (text < 0) or a token count beyond 2^31 - 1.
  void validate() const;

  TokenCoord coord(std::int64_t position, TokenOrder order) const;
  std::int64_t video_position(std::int64_t frame, std::int64_t patch, TokenOrder order) const;  // relative to video_begin()
  std::int64_t position(const TokenCoord& c, TokenOrder order) const;  // absolute

  std::string describe() const;  // e.g. "21x90x160 (+0 text after)"
  bool operator==(const VideoGrid&) const = default;
};

// A whole attention problem's shape: the grid plus batch, heads and head dim.
struct VideoLayout {
  VideoGrid grid;
  std::int64_t batch = 1;
  std::int64_t heads = 1;
  std::int64_t head_dim = 64;

  std::int64_t tokens() const { return grid.tokens(); }
  // Throws InvalidArgument / ResourceError; also rejects B*N*H*D overflowing int64.
  void validate() const;
  bool operator==(const VideoLayout&) const = default;
};

}  // namespace stsa
