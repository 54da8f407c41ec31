// Where a video token sits in frame-major and in spatial-major order (layout.hpp:
// frame 0 first in both, then frame-major runs frame by frame, spatial-major
// patch by patch over frames 1..F-1), as host/device arithmetic shared by the
// GPU permutation and the device mask predicate. The predicate's host test
// (tests/cuda_mask_predicate_test.cpp) checks it against stsa::allowed().
#pragma once

#include "cuda/host_device.hpp"

namespace stsa::cuda_detail {

template <class Int>
struct VideoCoordinates {
  Int frame, patch;
};

// Frame and patch of video position v (0 <= v < frames * per_frame) in the given order.
template <class Int>
STSA_HOST_DEVICE VideoCoordinates<Int> video_coordinates(Int v, Int frames, Int per_frame, bool spatial_major) {
  if (!spatial_major || v < per_frame) return {v / per_frame, v % per_frame};
  const Int rest = v - per_frame;  // frames >= 2 here, since v >= per_frame
  return {Int(1 + rest % (frames - 1)), Int(rest / (frames - 1))};
}

// Video position of (frame, patch) in the given order.
template <class Int>
STSA_HOST_DEVICE Int video_position(Int frame, Int patch, Int frames, Int per_frame, bool spatial_major) {
  if (!spatial_major || frame == 0) return frame * per_frame + patch;
  return per_frame + patch * (frames - 1) + (frame - 1);
}

// Position, in order `from`, of the token at `position` (0 <= position < all
// tokens) in order `to`. Text tokens, outside [video_begin, video_begin +
// frames * per_frame), keep their place. Unsigned Int works too (no negative
// intermediate): the permutation kernel uses 32-bit unsigned arithmetic.
template <class Int>
STSA_HOST_DEVICE Int reordered_position(Int position, Int video_begin, Int frames, Int per_frame,
                                        bool to_spatial_major, bool from_spatial_major) {
  if (position < video_begin || position - video_begin >= frames * per_frame) return position;
  const VideoCoordinates<Int> at = video_coordinates<Int>(position - video_begin, frames, per_frame, to_spatial_major);
  return video_begin + video_position<Int>(at.frame, at.patch, frames, per_frame, from_spatial_major);
}

}  // namespace stsa::cuda_detail
