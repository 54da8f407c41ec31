// Row copies between frame-major and spatial-major token order. The position
// map is computed in closed form per row (no index array to upload); rows move
// as 16-byte vectors, consecutive threads on consecutive bytes of a row
// (elements when a side is strided or unaligned).
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
// order. Int: 32 bits in the vector kernel, whose per-row index arithmetic would
// otherwise cost more issue slots than its 16-byte copy (64-bit division is a
// long software sequence), 64 bits elsewhere.
template <class Int>
__device__ __forceinline__ Int source_position(Int position, const PermuteGrid& g) {
  return reordered_position<Int>(position, g.text_before ? Int(g.text_tokens) : Int(0), Int(g.frames),
                                 Int(g.per_frame), g.to_spatial_major, g.from_spatial_major);
}

// One (batch, head) plane per grid row (blockIdx.y): the only per-thread index
// arithmetic is one 32-bit division into (position, vector) and the position
// map. Consecutive threads move consecutive 16-byte pieces of a row, so each
// source row (a gather reads scattered rows) is read whole by adjacent lanes.
__global__ void __launch_bounds__(kThreads) permute_rows_vec16(const PermuteParams p, unsigned vectors_per_row,
                                                               unsigned plane_vectors) {
  const unsigned i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= plane_vectors) return;
  const int plane = int(blockIdx.y);
  const std::int64_t b = plane / p.head_count;
  const int j = plane % p.head_count;
  const unsigned position = i / vectors_per_row;
  const unsigned vector = i - position * vectors_per_row;
  const unsigned from = source_position<unsigned>(position, p.grid);
  const auto* src = static_cast<const unsigned char*>(p.src) +
                    (b * p.src_stride[0] + std::int64_t(from) * p.src_stride[1] + p.src_heads[j] * p.src_stride[2]) *
                        p.element_bytes;
  auto* dst = static_cast<unsigned char*>(p.dst) +
              (b * p.dst_stride[0] + std::int64_t(position) * p.dst_stride[1] + p.dst_heads[j] * p.dst_stride[2]) *
                  p.element_bytes;
  reinterpret_cast<uint4*>(dst)[vector] = __ldg(reinterpret_cast<const uint4*>(src) + vector);
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
    const std::int64_t from = source_position<std::int64_t>(position, p.grid);
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
    const std::int64_t from = source_position<std::int64_t>(position, p.grid);
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
  const std::int64_t vectors_per_row = p.head_dim * p.element_bytes / 16;
  const std::int64_t planes = p.batch * p.head_count;
  if (vectorizable(p.src, p.src_stride, p.element_bytes, p.head_dim) &&
      vectorizable(p.dst, p.dst_stride, p.element_bytes, p.head_dim) && p.tokens * vectors_per_row <= INT_MAX &&
      planes <= 65535) {
    const auto plane_vectors = unsigned(p.tokens * vectors_per_row);
    const dim3 grid((plane_vectors + kThreads - 1) / kThreads, unsigned(planes));
    permute_rows_vec16<<<grid, kThreads, 0, cuda_stream>>>(p, unsigned(vectors_per_row), plane_vectors);
  } else if (p.element_bytes == 4) {
    permute_rows_elementwise<std::uint32_t><<<grid_for(rows * p.head_dim), kThreads, 0, cuda_stream>>>(
        p, rows * p.head_dim);
  } else if (p.element_bytes == 2) {
    permute_rows_elementwise<std::uint16_t><<<grid_for(rows * p.head_dim), kThreads, 0, cuda_stream>>>(
        p, rows * p.head_dim);
  } else {
    // One-byte elements (fp8) move as bytes: a wider word would index twice as far.
    STSA_CHECK(p.element_bytes == 1, InvalidArgument, "permutation: elements of ", p.element_bytes, " bytes");
    permute_rows_elementwise<std::uint8_t><<<grid_for(rows * p.head_dim), kThreads, 0, cuda_stream>>>(
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
