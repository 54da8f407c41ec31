// Thin wrappers over the Hopper (sm_90a) PTX the sm90 attention kernel is built
// from: mbarriers (transaction-counted), TMA tile loads, the wgmma fence/commit/
// wait protocol and register reallocation. (Matrix descriptors: sm90_tile_layout.hpp.)
// Only meaningful inside code compiled for sm_90a (see STSA_SM90_ENABLED).
#pragma once

#include <cstdint>

#include "cuda/barrier_timeout.hpp"
#include "cuda/ptx.cuh"

// True in the device pass for sm_90a: the only target with wgmma, TMA and setmaxnreg.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define STSA_SM90_ENABLED 1
#else
#define STSA_SM90_ENABLED 0
#endif

namespace stsa::cuda_detail {

// ---- mbarrier: a shared-memory barrier with an arrival count and a transaction
// (byte) count; a phase completes when both reach zero, then the phase bit flips.

__device__ __forceinline__ void mbarrier_init(std::uint64_t* barrier, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(arrivals) : "memory");
}

// Makes the initialised barriers visible to the async proxy (TMA) and the other threads.
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive(std::uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(barrier)) : "memory");
}

// Arrives and announces `bytes` that asynchronous copies will deliver to this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(std::uint64_t* barrier, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ bool mbarrier_try_wait(std::uint64_t* barrier, std::uint32_t parity) {
  std::uint32_t done = 0;
  asm volatile(
      "{\n.reg .pred complete;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
      "selp.u32 %0, 1, 0, complete;\n}\n"
      : "=r"(done)
      : "r"(shared_address(barrier)), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ std::uint64_t global_timer_ns() {
  std::uint64_t ns;
  asm volatile("mov.u64 %0, %globaltimer;\n" : "=l"(ns));
  return ns;
}

// A wait that lasts this long is a protocol bug (a deadlock), never real work:
// the kernel traps (the launch fails with cudaErrorLaunchFailure after about
// this long) instead of hanging the process. No printf: its call would make the
// compiler spill registers on every path.
constexpr std::uint64_t kBarrierTimeoutNs = 5'000'000'000ull;

// Where a wait that timed out says so before the trap (barrier_timeout.hpp):
// host-mapped memory, set by a kernel from its parameters; null until then. One
// copy per translation unit (no device linking), set by that unit's kernels.
static __device__ std::uint64_t* barrier_timeout_report = nullptr;

// Two plain 64-bit stores (each single-copy atomic, so one thread's words are
// never torn; with several threads timing out, the pair may mix two of them)
// and a system fence, so that the host sees them after the trap ends the context.
__device__ __forceinline__ void report_barrier_timeout(std::uint64_t* barrier, std::uint32_t parity) {
  volatile std::uint64_t* const report = barrier_timeout_report;
  if (report == nullptr) return;
  extern __shared__ unsigned char timeout_dynamic_shared[];  // the kernel's dynamic shared memory
  const std::uint32_t raw = shared_address(timeout_dynamic_shared);
  const std::uint32_t base = raw + ((1024 - (raw & 1023)) & 1023);  // the kernels' 1024-byte aligned base
  const std::uint32_t at = shared_address(barrier);
  std::uint64_t state = 0;
  asm volatile("ld.volatile.shared.b64 %0, [%1];\n" : "=l"(state) : "r"(at) : "memory");
  report[1] = state;
  report[0] = encode_barrier_wait(at - base, parity, blockIdx.x, threadIdx.x);
  __threadfence_system();
}

__device__ __forceinline__ void mbarrier_wait_slow(std::uint64_t* barrier, std::uint32_t parity) {
  const std::uint64_t start = global_timer_ns();
  while (!mbarrier_try_wait(barrier, parity)) {
    if (global_timer_ns() - start > kBarrierTimeoutNs) {
      report_barrier_timeout(barrier, parity);
      __trap();
      // Nothing is live past the trap: without this, ptxas keeps the loop's values
      // alive across the report and spills (8 bytes stored, 32 loaded, every kernel).
      __builtin_unreachable();
    }
  }
}

// Blocks until the phase with parity `parity` has completed. A fresh barrier is
// in phase 0, so waiting for parity 1 (the phase "before" it) returns at once:
// producers start by waiting for parity 1 on their empty barriers.
__device__ __forceinline__ void mbarrier_wait(std::uint64_t* barrier, std::uint32_t parity) {
  if (!mbarrier_try_wait(barrier, parity)) mbarrier_wait_slow(barrier, parity);
}

// ---- TMA: one box of a 4-D tensor map (coordinates innermost first) into shared
// memory, completing `bytes` on `barrier`. Out-of-range elements are zero-filled.
__device__ __forceinline__ void tma_load_4d(void* shared, const void* tensor_map, std::uint64_t* barrier, int c0,
                                            int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(shared_address(shared)),
      "l"(tensor_map), "r"(shared_address(barrier)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// Pulls a tensor map (a __grid_constant__ kernel parameter) into the cache ahead of first use.
__device__ __forceinline__ void tma_prefetch_descriptor(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tensor_map) : "memory");
}

// ---- wgmma protocol. fence: registers written by ordinary instructions (A
// fragments, rescaled accumulators) are ready for the next wgmma. commit: closes a
// group of issued wgmma. wait<N>: at most N groups still in flight.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The hardware writes wgmma accumulators asynchronously; this empty asm makes the
// compiler treat the registers as live and changed at this point, so it neither
// reads them before the wait nor moves writes to them across the issue. Pinned
// right before wgmma_fence, a wgmma's inputs are complete when the fence runs.
template <int kCount>
__device__ __forceinline__ void pin_registers(float (&r)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int kCount>
__device__ __forceinline__ void pin_registers(std::uint32_t (&r)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// ---- Register reallocation between warpgroups (producer gives, consumers take).
template <int kRegisters>
__device__ __forceinline__ void registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

}  // namespace stsa::cuda_detail
