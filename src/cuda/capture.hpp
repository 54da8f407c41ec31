// CUDA graph capture: a call on a capturing stream may enqueue work but not
// allocate, copy synchronously or wait for the device (each invalidates the
// capture), so the uploads a first call makes must be refused up front.
#pragma once

#include <string>
#include <string_view>

namespace stsa::cuda_detail {

// Whether `stream` (a cudaStream_t; nullptr: the default stream) is being
// captured into a CUDA graph. Throws stsa::Error with CUDA's message when
// CUDA cannot say (the legacy stream while a blocking stream is being
// captured: no work may go there either).
bool stream_is_capturing(void* stream);

// The message of a refusal: what `what` needed, and the warm-up that avoids it.
std::string capture_needs_warm_up(std::string_view what);

}  // namespace stsa::cuda_detail
