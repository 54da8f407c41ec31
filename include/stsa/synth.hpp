// Synthetic video attention inputs whose heads have a known kind.
//
// THIS IS SYNTHETIC DATA, built to test and benchmark routing; it is not taken
// from any model. Each head's queries and keys are one constant vector rotated
// by a multi-axis rotary position embedding over (frame, y, x) with per-head
// random frequencies (rotary pairs as random Fourier features), so q_i . k_j is
// a Gaussian-like kernel of the coordinate difference plus pseudo-random
// background, scaled so a token's score with itself is `peak_logit`:
//   - spatial heads: sharp in frame (length 0.35 frames), broad in space (about
//     a quarter of the frame), so they attend within the same frame;
//   - temporal heads: sharp in space (0.35 patches), broad in time (about the
//     whole clip), so they attend to the same place across frames.
// A smooth random field drifting over time (a few moving plane waves) is added
// to q and k with a small weight and forms the values v (plus noise), so outputs
// vary smoothly in space and time. Frame 0 is an attention sink, as in video
// diffusion transformers: one channel pair adds `anchor_logit` to the score of
// every query with every frame-0 key, whose rotary part is scaled by 0.3 so the
// sink spreads over the frame. Text tokens get plain Gaussian q, k, v.
#pragma once

#include <cstdint>
#include <vector>

#include "stsa/layout.hpp"
#include "stsa/router.hpp"
#include "stsa/tensor.hpp"

namespace stsa::synth {

struct Options {
  VideoGrid grid;
  std::int64_t batch = 1;
  std::int64_t heads = 8;
  std::int64_t head_dim = 64;  // even
  DType dtype = DType::F32;
  MemoryLayout memory = MemoryLayout::BNHD;
  std::uint64_t seed = 1;
  double temporal_fraction = 0.5;  // share of temporal heads (rounded; which heads is seeded)
  double peak_logit = 12.0;        // scaled score of a token with itself
  double content_weight = 0.15;    // share of the moving field in q and k
  double anchor_logit = 8.0;       // extra scaled score of every query with frame-0 keys
  void validate() const;           // throws InvalidArgument naming the field
};

struct Data {
  VideoLayout layout;
  Tensor q, k, v;            // [B, N, H, D] in frame-major token order
  std::vector<Route> truth;  // Route::Spatial or Route::Temporal per head
};

Data make_video_tokens(const Options& options);

}  // namespace stsa::synth
