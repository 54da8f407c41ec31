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
#include "stsa/attention.hpp"
#include "stsa/cuda.hpp"
#include "stsa/error.hpp"

namespace stsa {
namespace {

using cuda_detail::kMaxPermuteHeads;

constexpr std::string_view kHostPermutation = "host tensors go through gather_heads / scatter_heads";

void check_heads(std::span<const std::int64_t> heads, std::int64_t total) {
  STSA_CHECK(std::int64_t(heads.size()) <= total, InvalidArgument, "permutation lists ", heads.size(),
             " heads of ", total);
  std::vector<bool> seen(std::size_t(std::max<std::int64_t>(total, 0)), false);
  for (const std::int64_t h : heads) {
    STSA_CHECK(h >= 0 && h < total, InvalidArgument, "permutation head index ", h, " out of range [0, ", total, ")");
    STSA_CHECK(!seen[std::size_t(h)], InvalidArgument, "permutation head index ", h, " listed twice");
    seen[std::size_t(h)] = true;
  }
}

void check_pair(std::size_t i, const VideoGrid& grid, const TensorView& full, const TensorView& packed,
                std::size_t packed_heads) {
  STSA_CHECK(full.data != nullptr && packed.data != nullptr, InvalidArgument, "permutation tensor ", i, " is null");
  STSA_CHECK(full.dtype == packed.dtype, InvalidArgument, "permutation tensor ", i, ": dtypes differ (",
             to_string(full.dtype), " vs ", to_string(packed.dtype), ")");
  STSA_CHECK(full.tokens() == grid.tokens() && packed.tokens() == grid.tokens(), InvalidArgument,
             "permutation tensor ", i, ": token counts ", full.tokens(), " / ", packed.tokens(),
             " do not match the grid ", grid.describe());
  STSA_CHECK(full.batch() == packed.batch() && full.head_dim() == packed.head_dim() && full.batch() >= 1 &&
                 full.head_dim() >= 1,
             InvalidArgument, "permutation tensor ", i, ": batch/head dim differ");
  STSA_CHECK(packed.heads() == std::int64_t(packed_heads), InvalidArgument, "permutation tensor ", i,
             ": packed tensor has ", packed.heads(), " heads, expected ", packed_heads);
  for (int d = 0; d < 4; ++d)
    STSA_CHECK(full.stride[d] >= 0 && packed.stride[d] >= 0, InvalidArgument, "permutation tensor ", i,
               ": negative strides are not supported");
  STSA_CHECK(!extents_overlap(full.byte_extent(), packed.byte_extent()), InvalidArgument, "permutation tensor ", i,
             ": source and destination overlap");
  const auto element = std::uintptr_t(element_size(full.dtype));
  STSA_CHECK(reinterpret_cast<std::uintptr_t>(full.data) % element == 0 &&
                 reinterpret_cast<std::uintptr_t>(packed.data) % element == 0,
             InvalidArgument, "permutation tensor ", i, ": data is not aligned to its ", element, "-byte elements");
}

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

// A scatter's LSE views: both or neither, shapes of the grid, batch and heads,
// strides the kernel takes, 4-byte aligned, apart from each other.
void check_lse_views(const VideoGrid& grid, std::span<const std::int64_t> heads, std::span<const TensorView> dests,
                     const LseView& packed_lse, const LseView& lse) {
  STSA_CHECK((packed_lse.data == nullptr) == (lse.data == nullptr), InvalidArgument,
             "permutation: give both LSE views or neither");
  if (packed_lse.data == nullptr) return;
  const std::int64_t batch = dests.empty() ? packed_lse.shape[0] : dests[0].batch();
  STSA_CHECK(packed_lse.shape[0] == batch && lse.shape[0] == batch && packed_lse.shape[2] == grid.tokens() &&
                 lse.shape[2] == grid.tokens() && packed_lse.shape[1] == std::int64_t(heads.size()),
             InvalidArgument, "permutation: LSE shapes do not match the grid, batch and heads");
  check_heads(heads, lse.shape[1]);
  for (int d = 0; d < 3; ++d)
    STSA_CHECK(packed_lse.stride[d] >= 0 && lse.stride[d] >= 0, InvalidArgument,
               "permutation: negative LSE strides are not supported");
  // A misaligned float would fault on the device and end the CUDA context.
  STSA_CHECK(reinterpret_cast<std::uintptr_t>(packed_lse.data) % alignof(float) == 0 &&
                 reinterpret_cast<std::uintptr_t>(lse.data) % alignof(float) == 0,
             InvalidArgument, "permutation: LSE views must be 4-byte aligned");
  STSA_CHECK(!extents_overlap(packed_lse.byte_extent(), lse.byte_extent()), InvalidArgument,
             "permutation: LSE source and destination overlap");
  if (!heads.empty()) validate_lse_memory("permutation: LSE destination", lse);  // distinct addresses
}

// What gather_heads / scatter_heads check (permute.hpp), all on the host and
// before any GPU is asked for, so that a malformed call is InvalidArgument with
// or without one. Sources are `full` for a gather, `packed` for a scatter; a
// scatter's LSE rows move in the same pass, so its LSE views count as a source
// and a destination.
void check_on_host(const VideoGrid& grid, std::span<const std::int64_t> heads, std::span<const TensorView> full,
                   std::span<const TensorView> packed, bool gather, const LseView& packed_lse = {},
                   const LseView& lse = {}) {
  grid.validate();
  STSA_CHECK(full.size() == packed.size(), InvalidArgument, "permutation: ", full.size(), " full tensors but ",
             packed.size(), " packed ones");
  for (std::size_t i = 0; i < full.size(); ++i) {
    check_heads(heads, full[i].heads());
    check_pair(i, grid, full[i], packed[i], heads.size());
  }
  if (!gather) check_lse_views(grid, heads, full, packed_lse, lse);
  if (heads.empty()) return;
  // Each destination's elements at distinct addresses, and none over another
  // pair's source or destination: the copies run in parallel, so such a byte
  // would be raced for (the CPU functions refuse the same).
  const std::span<const TensorView> sources = gather ? full : packed, dests = gather ? packed : full;
  std::vector<std::string> names;
  for (std::size_t i = 0; i < dests.size(); ++i) names.push_back(detail::concat("destination ", i));
  for (std::size_t i = 0; i < sources.size(); ++i) names.push_back(detail::concat("source ", i));
  std::vector<NamedExtent> outputs, inputs;
  for (std::size_t i = 0; i < dests.size(); ++i) {
    validate_view_memory(detail::concat("permutation: ", names[i]).c_str(), dests[i]);
    outputs.push_back(NamedExtent::of(names[i], dests[i]));
  }
  for (std::size_t i = 0; i < sources.size(); ++i)
    inputs.push_back(NamedExtent::of(names[dests.size() + i], sources[i]));
  if (lse.data != nullptr) outputs.push_back(NamedExtent::of("LSE destination", lse));
  if (packed_lse.data != nullptr) inputs.push_back(NamedExtent::of("LSE source", packed_lse));
  check_outputs_apart("permutation: ", outputs, inputs);
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
  check_on_host(grid, heads, sources, packed, /*gather=*/true);
  check_on_device(sources, packed, cuda_detail::current_device());
  refuse_blocked_legacy_stream(stream);
  permute(grid, from, to, heads, sources, packed, /*gather=*/true, stream);
}

void cuda_scatter_heads(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
                        std::span<const TensorView> packed, std::span<const TensorView> dests,
                        const LseView& packed_lse, const LseView& lse, void* stream) {
  check_on_host(grid, heads, dests, packed, /*gather=*/false, packed_lse, lse);
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
