// The sm90 building-block probe (see sm90_probe.hpp): the attention kernel's own
// TMA tile layout and consumer steps (issue_scores, pack_probabilities,
// issue_values) on one tile, without the softmax and the pipeline.
#include <cuda_bf16.h>

#include "cuda/attention_sm90_kernel.cuh"
#include "cuda/barrier_timeout.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/sm90_probe.hpp"
#include "cuda/tensor_map.hpp"
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

  // The kernel's own steps (attention_sm90_kernel.cuh): its descriptors, its
  // fragment packing, its wgmma calls.
  using Traits = Sm90Traits<__nv_bfloat16, kHeadDim, Sm90Schedule::Serial>;
  ConsumerContext c;
  c.q_address = shared_address(tiles[0]);
  c.q_first_row = group * Traits::kRowsPerGroup;
  float s[64];
  issue_scores<Traits>(s, c, shared_address(tiles[1]));
  wgmma_wait<0>();
  pin_registers(s);
  for (int j = 0; j < 16; ++j)
    for (int half = 0; half < 2; ++half)
      for (int e = 0; e < 2; ++e)
        params.s_out[(row0 + 8 * half) * kRows + j * 8 + column0 + e] = s[4 * j + 2 * half + e];

  // P (given) in the accumulator layout the softmax leaves it in, packed as the kernel packs it.
  float p_values[64];
  for (int j = 0; j < 16; ++j)
    for (int half = 0; half < 2; ++half)
      for (int e = 0; e < 2; ++e)
        p_values[4 * j + 2 * half + e] = __bfloat162float(params.p[(row0 + 8 * half) * kRows + j * 8 + column0 + e]);
  std::uint32_t p_frag[8][4];
  pack_probabilities<__nv_bfloat16>(p_values, p_frag);
  float o[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.f;
  pin_registers(o);
  issue_values<Traits>(o, p_frag, shared_address(tiles[2]));
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

__global__ void __launch_bounds__(32, 1) sm90_barrier_timeout_kernel(std::uint64_t* report) {
#if STSA_SM90_ENABLED
  constexpr std::uint32_t kTimeoutProbeOffset = 24;  // from the aligned base: the fourth 8-byte slot
  extern __shared__ unsigned char raw_shared[];
  const std::uint32_t raw_address = shared_address(raw_shared);
  unsigned char* const base = raw_shared + ((1024 - (raw_address & 1023)) & 1023);
  auto* const never = reinterpret_cast<std::uint64_t*>(base + kTimeoutProbeOffset);
  if (threadIdx.x == 0) {
    barrier_timeout_report = report;
    mbarrier_init(never, 1);
    mbarrier_init_fence();
    mbarrier_wait(never, 0);  // phase 0 never completes: no thread arrives
  }
#else
  __trap();
#endif
}

void require_hopper() {
  int device = 0, major = 0, minor = 0;
  STSA_CUDA_CHECK(cudaGetDevice(&device));
  STSA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  STSA_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  STSA_CHECK(major == 9 && minor == 0, Unsupported, "sm90 probe needs compute capability 9.0, device has ", major,
             ".", minor);
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
  require_hopper();
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

void sm90_probe_barrier_timeout() {
  require_hopper();
  std::uint64_t* const report = barrier_timeout_slot(nullptr);
  STSA_CHECK(report != nullptr, Unsupported, "sm90 timeout probe: no host-mapped memory for the report");
  sm90_barrier_timeout_kernel<<<1, 32, 1024 + 64>>>(report);
  STSA_CUDA_CHECK(cudaGetLastError());
  STSA_CUDA_CHECK(cudaDeviceSynchronize());  // throws after the trap, with the report in the message
}

}  // namespace stsa::cuda_detail
