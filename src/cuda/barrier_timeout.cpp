#include "cuda/barrier_timeout.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <mutex>

#include "cuda/sm90_tile_layout.hpp"
#include "stsa/error.hpp"

namespace stsa::cuda_detail {
namespace {

std::mutex slot_mutex;
std::atomic<std::uint64_t*> host_slot{nullptr};  // published after allocation: read without the mutex
std::uint64_t* device_slot = nullptr;

}  // namespace

std::string sm90_barrier_name(std::uint32_t offset) {
  for (const int head_dim : {64, 128}) {
    const std::uint32_t begin = sm90_layout::barriers_offset(head_dim);
    const int count = sm90_layout::barrier_count(head_dim);
    if (offset < begin || offset >= begin + 8u * std::uint32_t(count) || (offset - begin) % 8 != 0) continue;
    const int index = int(offset - begin) / 8, stages = sm90_layout::stages(head_dim);
    std::string name;
    if (index == 0) {
      name = "q_full";
    } else if (index == 1) {
      name = "q_empty";
    } else {
      static const char* const kRings[] = {"k_full", "k_empty", "v_full", "v_empty", "turn"};
      const int ring = (index - 2) / stages;
      name = detail::concat(kRings[ring], "[", ring < 4 ? (index - 2) % stages : index - 2 - 4 * stages, "]");
    }
    return detail::concat(name, " (D = ", head_dim, " layout)");
  }
  return detail::concat("shared offset ", offset, " (not a barrier of the sm90 attention kernel)");
}

std::string describe_barrier_timeout(const std::uint64_t (&words)[2]) {
  const BarrierWait w = decode_barrier_wait(words[0]);
  if (!w.written) return {};
  const std::uint32_t group = w.thread / 128;
  char state[32];
  std::snprintf(state, sizeof state, "0x%016llx", static_cast<unsigned long long>(words[1]));
  return detail::concat("a barrier wait timed out (a protocol bug, not slow work): block ", w.block, ", thread ",
                        w.thread, " (warpgroup ", group, group == 0 ? ", the producer" : ", a consumer", ", warp ",
                        w.thread / 32, ") waited 5 s for parity ", w.parity, " of ", sm90_barrier_name(w.offset),
                        "; barrier word ", state);
}

std::uint64_t* barrier_timeout_slot(void* stream) {
  if (host_slot.load(std::memory_order_acquire) != nullptr) return device_slot;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return nullptr;  // allocating now would break the capture
  }
  const std::lock_guard<std::mutex> lock(slot_mutex);
  if (host_slot.load(std::memory_order_relaxed) != nullptr) return device_slot;
  void* host = nullptr;
  void* device = nullptr;
  if (cudaHostAlloc(&host, 2 * sizeof(std::uint64_t), cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  if (cudaHostGetDevicePointer(&device, host, 0) != cudaSuccess) {
    cudaGetLastError();
    cudaFreeHost(host);
    cudaGetLastError();
    return nullptr;
  }
  auto* words = static_cast<std::uint64_t*>(host);
  words[0] = words[1] = 0;
  device_slot = static_cast<std::uint64_t*>(device);
  host_slot.store(words, std::memory_order_release);  // kept for the life of the process
  return device_slot;
}

std::string barrier_timeout_note() {
  const std::uint64_t* words = host_slot.load(std::memory_order_acquire);
  if (words == nullptr) return {};
  const std::uint64_t copy[2] = {reinterpret_cast<const volatile std::uint64_t*>(words)[0],
                                 reinterpret_cast<const volatile std::uint64_t*>(words)[1]};
  return describe_barrier_timeout(copy);
}

}  // namespace stsa::cuda_detail
