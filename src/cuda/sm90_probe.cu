// The sm90 building-block probe (see sm90_probe.hpp). Shares every piece with the
// attention kernel except the softmax and the pipeline: one tile, one pass.
#include <cuda_bf16.h>

#include "cuda/cuda_check.hpp"
#include "cuda/ptx_sm90.cuh"
#include "cuda/sm90_probe.hpp"
#include "cuda/sm90_tile_layout.hpp"
#include "cuda/tensor_map.hpp"
#include "cuda/wgmma_ops.cuh"
#include "stsa/error.hpp"

namespace stsa::cuda_detail {
namespace {

constexpr int kRows = 128;

struct ProbeParams {
  CUtensorMap q_map, k_map, v_map;
  const __nv_bfloat16* p;
  float* s_out;
  float* o_out;
};

template <int kHeadDim>
__global__ void __launch_bounds__(256, 1) sm90_probe_kernel(const __grid_constant__ ProbeParams params) {
#if STSA_SM90_ENABLED
  constexpr int kTileBytes = kRows * kHeadDim * 2;
  constexpr int kBlockBytes = int(sm90_layout::column_block_bytes(kRows));
  extern __shared__ unsigned char raw_shared[];
  unsigned char* const base = raw_shared + ((1024 - (shared_address(raw_shared) & 1023)) & 1023);
  unsigned char* const tiles[3] = {base, base + kTileBytes, base + 2 * kTileBytes};
  auto* const loaded = reinterpret_cast<std::uint64_t*>(base + 3 * kTileBytes);

  if (threadIdx.x == 0) {
    mbarrier_init(loaded, 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const CUtensorMap* maps[3] = {&params.q_map, &params.k_map, &params.v_map};
    mbarrier_arrive_expect_bytes(loaded, 3 * kTileBytes);
    for (int t = 0; t < 3; ++t)
      for (int c = 0; c < kHeadDim / 64; ++c) tma_load_4d(tiles[t] + c * kBlockBytes, maps[t], loaded, c * 64, 0, 0, 0);
  }
  mbarrier_wait(loaded, 0);

  const int group = int(threadIdx.x) / 128;  // 64 rows each, like the consumer warpgroups
  const int warp = (int(threadIdx.x) / 32) % 4;
  const int lane = int(threadIdx.x) % 32;
  const int row0 = group * 64 + warp * 16 + lane / 4;
  const int column0 = (lane % 4) * 2;

  float s[64];
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk)
    wgmma_m64n128k16_ss_bf16(
        s,
        matrix_descriptor(shared_address(tiles[0]) + sm90_layout::k_major_step_offset(kk, group * 64, kRows), 16,
                          sm90_layout::kGroupBytes),
        matrix_descriptor(shared_address(tiles[1]) + sm90_layout::k_major_step_offset(kk, 0, kRows), 16,
                          sm90_layout::kGroupBytes),
        kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
  pin_registers(s);
  for (int j = 0; j < 16; ++j)
    for (int half = 0; half < 2; ++half)
      for (int e = 0; e < 2; ++e)
        params.s_out[(row0 + 8 * half) * kRows + j * 8 + column0 + e] = s[4 * j + 2 * half + e];

  // A fragments of P read from global memory in the layout the kernel builds them in.
  auto p_at = [&](int row, int column) {
    const __nv_bfloat162 pair = *reinterpret_cast<const __nv_bfloat162*>(params.p + row * kRows + column);
    return *reinterpret_cast<const std::uint32_t*>(&pair);
  };
  float o[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.f;
  std::uint32_t a[8][4];
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    a[kk][0] = p_at(row0, kk * 16 + column0);
    a[kk][1] = p_at(row0 + 8, kk * 16 + column0);
    a[kk][2] = p_at(row0, kk * 16 + 8 + column0);
    a[kk][3] = p_at(row0 + 8, kk * 16 + 8 + column0);
  }
  pin_registers(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const std::uint64_t desc_v = matrix_descriptor(shared_address(tiles[2]) + sm90_layout::mn_major_step_offset(kk),
                                                   sm90_layout::column_block_bytes(kRows), sm90_layout::kGroupBytes);
    if constexpr (kHeadDim == 128)
      wgmma_m64n128k16_rs_tb_bf16(o, a[kk], desc_v, 1);
    else
      wgmma_m64n64k16_rs_tb_bf16(o, a[kk], desc_v, 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
  pin_registers(o);
  for (int j = 0; j < kHeadDim / 8; ++j)
    for (int half = 0; half < 2; ++half)
      for (int e = 0; e < 2; ++e)
        params.o_out[(row0 + 8 * half) * kHeadDim + j * 8 + column0 + e] = o[4 * j + 2 * half + e];
#else
  __trap();
#endif
}

template <int kHeadDim>
void run_probe(ProbeParams& params) {
  constexpr int kSmem = 1024 + 3 * kRows * kHeadDim * 2 + 16;
  const auto kernel = sm90_probe_kernel<kHeadDim>;
  STSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  kernel<<<1, 256, kSmem>>>(params);
  STSA_CUDA_CHECK(cudaGetLastError());
  STSA_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace

void sm90_probe_products(const void* q, const void* k, const void* v, const void* p, float* s_out, float* o_out,
                         int head_dim) {
  STSA_CHECK(head_dim == 64 || head_dim == 128, InvalidArgument, "sm90 probe: head dim ", head_dim);
  int device = 0, major = 0, minor = 0;
  STSA_CUDA_CHECK(cudaGetDevice(&device));
  STSA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  STSA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  STSA_CHECK(major == 9 && minor == 0, Unsupported, "sm90 probe needs compute capability 9.0, device has ", major,
             ".", minor);
  // One [1, 128, 1, D] tensor each: token stride D elements.
  const std::int64_t stride[3] = {std::int64_t(kRows) * head_dim, head_dim, head_dim};
  ProbeParams params;
  params.q_map = make_row_tensor_map(q, true, 1, kRows, 1, head_dim, stride, kRows);
  params.k_map = make_row_tensor_map(k, true, 1, kRows, 1, head_dim, stride, kRows);
  params.v_map = make_row_tensor_map(v, true, 1, kRows, 1, head_dim, stride, kRows);
  params.p = static_cast<const __nv_bfloat16*>(p);
  params.s_out = s_out;
  params.o_out = o_out;
  if (head_dim == 64)
    run_probe<64>(params);
  else
    run_probe<128>(params);
}

}  // namespace stsa::cuda_detail
