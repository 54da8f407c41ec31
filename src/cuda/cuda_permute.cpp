// cuda_gather_heads / cuda_scatter_heads: the checks of permute.hpp, then one
// row-copy launch per tensor (and one for LSE); and the device copy bandwidth
// they are measured against.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/capture.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device_checks.hpp"
#include "cuda/permute_launch.hpp"
#include "router/permute_checks.hpp"
#include "stsa/attention.hpp"
#include "stsa/cuda.hpp"
#include "stsa/error.hpp"

namespace stsa {
namespace {

using cuda_detail::kMaxPermuteHeads;

constexpr std::string_view kHostPermutation = "host tensors go through gather_heads / scatter_heads";

cuda_detail::PermuteGrid device_grid(const VideoGrid& grid, TokenOrder from, TokenOrder to) {
  cuda_detail::PermuteGrid g;
  g.frames = grid.frames;
  g.per_frame = grid.tokens_per_frame();
  g.text_tokens = grid.text_tokens;
  g.text_before = grid.text_placement == TextPlacement::Before;
  g.from_spatial_major = from == TokenOrder::SpatialMajor;
  g.to_spatial_major = to == TokenOrder::SpatialMajor;
  return g;
}

void copy_strides(std::int64_t (&out)[4], const TensorView& t) {
  for (int i = 0; i < 4; ++i) out[i] = t.stride[i];
}

// A capture may record the copies; the legacy stream during another stream's capture may not.
void refuse_blocked_legacy_stream(void* stream) { cuda_detail::stream_is_capturing(stream, "permutation: "); }

// Moves rows of `heads` between full and packed tensors in chunks of at most kMaxPermuteHeads.
void permute(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
             std::span<const TensorView> sources, std::span<const TensorView> dests, bool gather, void* stream) {
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const TensorView& src = sources[i];
    const TensorView& dst = dests[i];
    cuda_detail::PermuteParams p;
    p.src = src.data;
    p.dst = dst.data;
    copy_strides(p.src_stride, src);
    copy_strides(p.dst_stride, dst);
    p.batch = src.batch();
    p.tokens = src.tokens();
    p.head_dim = src.head_dim();
    p.element_bytes = int(element_size(src.dtype));
    p.grid = device_grid(grid, from, to);
    for (std::size_t first = 0; first < heads.size(); first += kMaxPermuteHeads) {
      const std::size_t count = std::min<std::size_t>(kMaxPermuteHeads, heads.size() - first);
      p.head_count = int(count);
      for (std::size_t j = 0; j < count; ++j) {
        const int full_head = int(heads[first + j]), packed_head = int(first + j);
        p.src_heads[j] = gather ? full_head : packed_head;
        p.dst_heads[j] = gather ? packed_head : full_head;
      }
      cuda_detail::launch_permute_rows(p, stream);
    }
  }
}

// gather_heads' / scatter_heads' own checks (the shared router_detail::check_permutation),
// all on the host and before any GPU is asked for, so that a malformed call is
// InvalidArgument with or without one; then what only the device needs: every pointer
// aligned to its elements (a misaligned one faults and ends the CUDA context).
void check_on_host(const char* what, const VideoGrid& grid, std::span<const std::int64_t> heads,
                   std::span<const TensorView> full, std::span<const TensorView> packed, bool gather,
                   const LseView& packed_lse = {}, const LseView& lse = {}) {
  router_detail::check_permutation(what, grid, heads, full, packed, gather, packed_lse, lse);
  for (std::size_t i = 0; i < full.size(); ++i) {
    const auto element = std::uintptr_t(element_size(full[i].dtype));
    STSA_CHECK(reinterpret_cast<std::uintptr_t>(full[i].data) % element == 0 &&
                   reinterpret_cast<std::uintptr_t>(packed[i].data) % element == 0,
               InvalidArgument, what, " tensor ", i, ": data is not aligned to its ", element, "-byte elements");
  }
  STSA_CHECK(reinterpret_cast<std::uintptr_t>(packed_lse.data) % alignof(float) == 0 &&
                 reinterpret_cast<std::uintptr_t>(lse.data) % alignof(float) == 0,
             InvalidArgument, what, ": LSE views must be 4-byte aligned");
}

void check_on_device(std::span<const TensorView> full, std::span<const TensorView> packed, int device) {
  for (std::size_t i = 0; i < full.size(); ++i) {
    cuda_detail::require_device_memory("permutation: ", detail::concat("tensor ", i, " (full)"), full[i].byte_extent(),
                                       device, kHostPermutation);
    cuda_detail::require_device_memory("permutation: ", detail::concat("tensor ", i, " (packed)"),
                                       packed[i].byte_extent(), device, kHostPermutation);
  }
}

}  // namespace

void cuda_gather_heads(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
                       std::span<const TensorView> sources, std::span<const TensorView> packed, void* stream) {
  check_on_host("cuda gather", grid, heads, sources, packed, /*gather=*/true);
  check_on_device(sources, packed, cuda_detail::current_device());
  refuse_blocked_legacy_stream(stream);
  permute(grid, from, to, heads, sources, packed, /*gather=*/true, stream);
}

void cuda_scatter_heads(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
                        std::span<const TensorView> packed, std::span<const TensorView> dests,
                        const LseView& packed_lse, const LseView& lse, void* stream) {
  check_on_host("cuda scatter", grid, heads, dests, packed, /*gather=*/false, packed_lse, lse);
  const bool with_lse = packed_lse.data != nullptr;
  const int device = cuda_detail::current_device();
  check_on_device(dests, packed, device);
  if (with_lse) {
    cuda_detail::require_device_memory("permutation: ", "packed LSE", packed_lse.byte_extent(), device,
                                       kHostPermutation);
    cuda_detail::require_device_memory("permutation: ", "LSE", lse.byte_extent(), device, kHostPermutation);
  }
  refuse_blocked_legacy_stream(stream);
  permute(grid, from, to, heads, packed, dests, /*gather=*/false, stream);
  if (!with_lse) return;
  cuda_detail::PermuteLseParams p;
  p.src = packed_lse.data;
  p.dst = lse.data;
  for (int i = 0; i < 3; ++i) {
    p.src_stride[i] = packed_lse.stride[i];
    p.dst_stride[i] = lse.stride[i];
  }
  p.batch = lse.shape[0];
  p.tokens = grid.tokens();
  p.grid = device_grid(grid, from, to);
  for (std::size_t first = 0; first < heads.size(); first += kMaxPermuteHeads) {
    const std::size_t count = std::min<std::size_t>(kMaxPermuteHeads, heads.size() - first);
    p.head_count = int(count);
    for (std::size_t j = 0; j < count; ++j) {
      p.src_heads[j] = int(first + j);
      p.dst_heads[j] = int(heads[first + j]);
    }
    cuda_detail::launch_permute_lse(p, stream);
  }
}

double cuda_measure_copy_gbps(std::size_t bytes) {
  STSA_CHECK(bytes > 0, InvalidArgument, "cuda_measure_copy_gbps: no bytes to copy");
  const DeviceBuffer from(bytes), to(bytes);  // Unsupported without a GPU
  struct Events {
    cudaEvent_t start = nullptr, stop = nullptr;
    ~Events() {  // errors ignored, and cleared: they must not fail a later launch check
      if (start) cudaEventDestroy(start);
      if (stop) cudaEventDestroy(stop);
      cudaGetLastError();
    }
  } events;
  STSA_CUDA_CHECK(cudaEventCreate(&events.start));
  STSA_CUDA_CHECK(cudaEventCreate(&events.stop));
  STSA_CUDA_CHECK(cudaMemcpy(to.data(), from.data(), bytes, cudaMemcpyDeviceToDevice));  // warm-up
  std::vector<float> ms(5);
  for (float& m : ms) {
    STSA_CUDA_CHECK(cudaEventRecord(events.start, nullptr));
    STSA_CUDA_CHECK(cudaMemcpyAsync(to.data(), from.data(), bytes, cudaMemcpyDeviceToDevice, nullptr));
    STSA_CUDA_CHECK(cudaEventRecord(events.stop, nullptr));
    STSA_CUDA_CHECK(cudaEventSynchronize(events.stop));
    STSA_CUDA_CHECK(cudaEventElapsedTime(&m, events.start, events.stop));
  }
  std::nth_element(ms.begin(), ms.begin() + 2, ms.end());
  return ms[2] > 0 ? 2.0 * double(bytes) / (double(ms[2]) * 1e6) : 0.0;
}

}  // namespace stsa
