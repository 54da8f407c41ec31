// Thin wrappers over the PTX instructions the attention kernel is built from
// (sm_80 and newer): asynchronous 16-byte copies into shared memory, ldmatrix,
// the m16n8k16 tensor-core MMA with fp32 accumulation, and exp2.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace stsa::cuda_detail {

__device__ __forceinline__ std::uint32_t shared_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

// Copies 16 bytes global -> shared without passing through registers. When
// `valid` is false nothing is read and the 16 shared bytes are zero-filled.
__device__ __forceinline__ void cp_async_16(void* shared, const void* global, bool valid) {
  const int source_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(source_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most `kPending` committed groups of this thread are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i.
// Lane l receives row l/4, columns 2(l%4) and 2(l%4)+1 of each matrix.
// `address` is a shared-window address (shared_address()): a kernel that keeps
// one 32-bit base per operand and adds constant offsets spends no registers
// on a 64-bit pointer per fragment.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* shared) {
  ldmatrix_x4(r, shared_address(shared));
}

// Same, transposed: lane l receives rows 2(l%4) and 2(l%4)+1 of column l/4.
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* shared) {
  ldmatrix_x4_trans(r, shared_address(shared));
}

// d += a * b for one 16x8x16 tile: a (16x16, row-major fragments), b (16x8,
// column fragments), d (16x8 fp32). Fragment layouts with g = lane/4, t = lane%4:
//   a[0]: (g, 2t..2t+1)   a[1]: (g+8, 2t..)   a[2]: (g, 2t+8..)   a[3]: (g+8, 2t+8..)
//   b0:   (2t..2t+1, g)   b1:   (2t+8.., g)
//   d[0..1]: (g, 2t..2t+1)   d[2..3]: (g+8, 2t..2t+1)
template <class Element>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                            std::uint32_t b1);

template <>
__device__ __forceinline__ void mma_16x8x16<__nv_bfloat16>(float (&d)[4], const std::uint32_t (&a)[4],
                                                           std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16x8x16<__half>(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                                    std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to the element type, `low` in the low half (the lower column).
template <class Element>
__device__ __forceinline__ std::uint32_t pack_pair(float low, float high);

template <>
__device__ __forceinline__ std::uint32_t pack_pair<__nv_bfloat16>(float low, float high) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

template <>
__device__ __forceinline__ std::uint32_t pack_pair<__half>(float low, float high) {
  const __half2 v = __floats2half2_rn(low, high);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

// 2^x with the hardware approximation (2 ulp); exp2(-inf) = 0, NaN stays NaN.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace stsa::cuda_detail
