// Row copies between frame-major and spatial-major token order. The position
// map is computed in closed form per row (no index array to upload); rows move
// as 16-byte vectors, consecutive threads on consecutive bytes of a row.
#include <climits>
#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/permute_launch.hpp"
#include "cuda/video_order.hpp"
#include "stsa/error.hpp"

namespace stsa::cuda_detail {
namespace {

constexpr int kThreads = 256;

// Position, in the source order, of the token at `position` in the destination
// order (layout.hpp: frame 0 first in both orders, text tokens keep their place).
__device__ __forceinline__ std::int64_t source_position(std::int64_t position, const PermuteGrid& g) {
  const std::int64_t begin = g.text_before ? g.text_tokens : 0;
  const std::int64_t video = g.frames * g.per_frame;
  if (position < begin || position >= begin + video) return position;
  const auto at = video_coordinates<std::int64_t>(position - begin, g.frames, g.per_frame, g.to_spatial_major);
  const std::int64_t from_v =
      video_position<std::int64_t>(at.frame, at.patch, g.frames, g.per_frame, g.from_spatial_major);
  return begin + from_v;
}

__global__ void __launch_bounds__(kThreads) permute_rows_vec16(const PermuteParams p, unsigned vectors_per_row,
                                                               unsigned total_vectors) {
  for (unsigned i = blockIdx.x * kThreads + threadIdx.x; i < total_vectors; i += gridDim.x * kThreads) {
    const unsigned row = i / vectors_per_row;
    const unsigned vector = i % vectors_per_row;
    const unsigned j = row % unsigned(p.head_count);
    const unsigned token_row = row / unsigned(p.head_count);
    const std::int64_t position = token_row % p.tokens;
    const std::int64_t b = token_row / p.tokens;
    const std::int64_t from = source_position(position, p.grid);
    const auto* src = static_cast<const unsigned char*>(p.src) +
                      (b * p.src_stride[0] + from * p.src_stride[1] + p.src_heads[j] * p.src_stride[2]) *
                          p.element_bytes;
    auto* dst = static_cast<unsigned char*>(p.dst) +
                (b * p.dst_stride[0] + position * p.dst_stride[1] + p.dst_heads[j] * p.dst_stride[2]) *
                    p.element_bytes;
    reinterpret_cast<uint4*>(dst)[vector] = __ldg(reinterpret_cast<const uint4*>(src) + vector);
  }
}

template <class Word>
__global__ void __launch_bounds__(kThreads) permute_rows_elementwise(const PermuteParams p, std::int64_t total) {
  for (std::int64_t i = blockIdx.x * std::int64_t(kThreads) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * kThreads) {
    const std::int64_t d = i % p.head_dim;
    const std::int64_t row = i / p.head_dim;
    const int j = int(row % p.head_count);
    const std::int64_t position = (row / p.head_count) % p.tokens;
    const std::int64_t b = row / p.head_count / p.tokens;
    const std::int64_t from = source_position(position, p.grid);
    const Word* src = static_cast<const Word*>(p.src);
    Word* dst = static_cast<Word*>(p.dst);
    dst[b * p.dst_stride[0] + position * p.dst_stride[1] + p.dst_heads[j] * p.dst_stride[2] + d * p.dst_stride[3]] =
        src[b * p.src_stride[0] + from * p.src_stride[1] + p.src_heads[j] * p.src_stride[2] + d * p.src_stride[3]];
  }
}

__global__ void __launch_bounds__(kThreads) permute_lse(const PermuteLseParams p, std::int64_t total) {
  for (std::int64_t i = blockIdx.x * std::int64_t(kThreads) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * kThreads) {
    const std::int64_t position = i % p.tokens;
    const int j = int((i / p.tokens) % p.head_count);
    const std::int64_t b = i / p.tokens / p.head_count;
    const std::int64_t from = source_position(position, p.grid);
    p.dst[b * p.dst_stride[0] + p.dst_heads[j] * p.dst_stride[1] + position * p.dst_stride[2]] =
        p.src[b * p.src_stride[0] + p.src_heads[j] * p.src_stride[1] + from * p.src_stride[2]];
  }
}

// Enough blocks to fill the GPU several times over; the loops stride beyond that.
unsigned grid_for(std::int64_t items) {
  const std::int64_t blocks = (items + kThreads - 1) / kThreads;
  return unsigned(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

bool vectorizable(const void* base, const std::int64_t (&stride)[4], int element_bytes, std::int64_t head_dim) {
  if (stride[3] != 1 || (head_dim * element_bytes) % 16 != 0) return false;
  if (reinterpret_cast<std::uintptr_t>(base) % 16 != 0) return false;
  for (int i = 0; i < 3; ++i)
    if ((stride[i] * element_bytes) % 16 != 0) return false;
  return true;
}

}  // namespace

void launch_permute_rows(const PermuteParams& p, void* stream) {
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const std::int64_t rows = p.batch * p.tokens * p.head_count;
  if (rows == 0) return;
  if (vectorizable(p.src, p.src_stride, p.element_bytes, p.head_dim) &&
      vectorizable(p.dst, p.dst_stride, p.element_bytes, p.head_dim) &&
      rows * (p.head_dim * p.element_bytes / 16) <= INT_MAX) {
    const auto per_row = unsigned(p.head_dim * p.element_bytes / 16);
    const auto total = unsigned(rows * per_row);
    permute_rows_vec16<<<grid_for(total), kThreads, 0, cuda_stream>>>(p, per_row, total);
  } else if (p.element_bytes == 4) {
    permute_rows_elementwise<std::uint32_t><<<grid_for(rows * p.head_dim), kThreads, 0, cuda_stream>>>(
        p, rows * p.head_dim);
  } else {
    permute_rows_elementwise<std::uint16_t><<<grid_for(rows * p.head_dim), kThreads, 0, cuda_stream>>>(
        p, rows * p.head_dim);
  }
  STSA_CUDA_CHECK(cudaGetLastError());
}

void launch_permute_lse(const PermuteLseParams& p, void* stream) {
  const std::int64_t total = p.batch * p.head_count * p.tokens;
  if (total == 0) return;
  permute_lse<<<grid_for(total), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p, total);
  STSA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace stsa::cuda_detail
