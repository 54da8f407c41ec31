// Where the sm90 kernel's tiles live in shared memory, and where its wgmma
// operand descriptors start. Plain constexpr arithmetic shared by the kernel and
// by a host test that checks it against a model of TMA's 128-byte swizzle and of
// wgmma's canonical layouts (PTX ISA), so it can be verified without a GPU.
//
// A tile of `rows` x D two-byte elements is stored as D / 64 column blocks of
// `rows` x 128 bytes; inside a block, row r's 16-byte chunk c sits at chunk
// position c ^ (r % 8). That is what TMA writes for a 64-element-wide box with
// CU_TENSOR_MAP_SWIZZLE_128B when the block starts on a 1024-byte boundary.
#pragma once

#include <cstdint>

namespace stsa::cuda_detail::sm90_layout {

constexpr std::uint32_t kRowBytes = 128;       // one row of a column block: 64 elements
constexpr std::uint32_t kGroupBytes = 8 * kRowBytes;  // 8 rows: the swizzle's repeat, wgmma's SBO

constexpr std::uint32_t column_block_bytes(std::uint32_t rows) { return rows * kRowBytes; }

// Byte offset of element (row, column) of a tile, as TMA places it.
constexpr std::uint32_t element_offset(std::uint32_t row, std::uint32_t column, std::uint32_t rows) {
  const std::uint32_t byte_in_row = (column % 64) * 2;
  return (column / 64) * column_block_bytes(rows) + row * kRowBytes + (((byte_in_row / 16) ^ (row % 8)) * 16) +
         byte_in_row % 16;
}

// K-major operand (Q as A, K as B: rows x head dim): start of the 16-wide k-step
// `step` for the 64 (A) or 128 (B) rows beginning at `first_row`. Steps 0-3 lie in
// column block 0, 32 bytes apart inside the swizzled row; 4-7 in block 1.
constexpr std::uint32_t k_major_step_offset(std::uint32_t step, std::uint32_t first_row, std::uint32_t rows) {
  return (step / 4) * column_block_bytes(rows) + first_row * kRowBytes + (step % 4) * 32;
}

// MN-major operand (V as B: keys x head dim, N = head dim): start of the k-step
// covering keys 16 * step ... 16 * step + 15. Its LBO is column_block_bytes(rows).
constexpr std::uint32_t mn_major_step_offset(std::uint32_t step) { return step * 16 * kRowBytes; }

// The attention kernel's shared memory, from its 1024-byte aligned base: Q, then
// `stages` K tiles, then `stages` V tiles (128 rows each), then the mbarriers in
// this order: q_full, q_empty, k_full[stages], k_empty[stages], v_full[stages],
// v_empty[stages], turn[2]. Host code names a barrier from its offset with these.
constexpr int stages(int head_dim) { return head_dim == 64 ? 4 : 2; }  // D = 128: 2 x 2 x 32 KB + Q = 160 KB
constexpr std::uint32_t tile_bytes(int head_dim) { return 128u * std::uint32_t(head_dim) * 2u; }
constexpr std::uint32_t barriers_offset(int head_dim) {
  return tile_bytes(head_dim) * std::uint32_t(1 + 2 * stages(head_dim));
}
constexpr int barrier_count(int head_dim) { return 2 + 4 * stages(head_dim) + 2; }

}  // namespace stsa::cuda_detail::sm90_layout

namespace stsa::cuda_detail {

// Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"):
//   bits  0-13 start address >> 4     bits 16-29 leading byte offset >> 4
//   bits 32-45 stride byte offset >> 4  bits 62-63 swizzle (1 = 128-byte)
// Operands here are tiles of 64-element (128-byte) rows written by TMA with the
// 128-byte swizzle, every tile 1024-byte aligned (base offset 0):
//   K-major (Q, K): SBO = 1024 (one 8-row group); LBO unused (1).
//   MN-major (V):   SBO = 1024 (next 8 keys), LBO = distance between 64-column blocks.
constexpr std::uint64_t matrix_descriptor(std::uint32_t shared_byte_address, std::uint32_t leading_bytes,
                                          std::uint32_t stride_bytes) {
  return (std::uint64_t((shared_byte_address & 0x3FFFF) >> 4)) | (std::uint64_t((leading_bytes & 0x3FFFF) >> 4) << 16) |
         (std::uint64_t((stride_bytes & 0x3FFFF) >> 4) << 32) | (std::uint64_t(1) << 62);
}

}  // namespace stsa::cuda_detail
