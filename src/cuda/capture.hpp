// CUDA graph capture: a call on a capturing stream may enqueue work but not
// allocate, copy synchronously or wait for the device (each invalidates the
// capture), so the uploads a first call makes must be refused up front.
#pragma once

#include <string>
#include <string_view>

namespace stsa::cuda_detail {

// Whether work enqueued on `stream` (a cudaStream_t; nullptr: the default
// stream) is being recorded into a CUDA graph: then nothing may be allocated,
// copied synchronously or waited for. The legacy stream while a blocking
// stream is captured is refused (Unsupported, the message led by `who`): any
// work there would invalidate that capture. Throws stsa::Error with CUDA's
// message when CUDA cannot say.
bool stream_is_capturing(void* stream, std::string_view who);

// The message of a refusal: what `what` needed, and the warm-up that avoids it.
std::string capture_needs_warm_up(std::string_view what);

// Puts the calling thread in relaxed capture mode for its lifetime, then
// restores the caller's mode. Global mode (PyTorch's default) prohibits this
// thread's "potentially unsafe" calls while any capture runs, and a prohibited
// call invalidates the capture; the queries the checks make (pointer
// attributes) must never cost a caller its graph. Nothing done under it may
// allocate or wait: those are refused during a capture before they happen.
// Without a usable runtime it does nothing.
class RelaxedCaptureScope {
 public:
  RelaxedCaptureScope();
  ~RelaxedCaptureScope();
  RelaxedCaptureScope(const RelaxedCaptureScope&) = delete;
  RelaxedCaptureScope& operator=(const RelaxedCaptureScope&) = delete;

 private:
  int previous_ = 0;  // cudaStreamCaptureMode
  bool active_ = false;
};

}  // namespace stsa::cuda_detail
