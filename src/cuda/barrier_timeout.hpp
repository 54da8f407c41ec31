// What an sm90 kernel leaves behind when one of its barrier waits times out (a
// protocol bug: a hang turned into a trap after 5 s, ptx_sm90.cuh). Before it
// traps, the waiting thread writes two words to host-mapped memory: where it
// waited (the barrier's shared-memory offset from the kernel's 1024-byte aligned
// base, the parity it waited for, its block and thread) and the barrier's raw
// state. The trap makes the context unusable, but host memory stays readable,
// so the error the host then raises can say which barrier hung, and where.
#pragma once

#include <cstdint>
#include <string>

#include "cuda/host_device.hpp"

namespace stsa::cuda_detail {

// words[0]: bit 63 set (written), bit 52 parity, bits 32-51 shared offset,
// bits 10-31 block, bits 0-9 thread. words[1]: the mbarrier's 64 bits. (A block
// index past 2^22 would be cut to its low bits; persistent grids are far smaller.)
STSA_HOST_DEVICE std::uint64_t encode_barrier_wait(std::uint32_t offset, std::uint32_t parity, std::uint32_t block,
                                                   std::uint32_t thread) {
  return (std::uint64_t(1) << 63) | (std::uint64_t(parity & 1) << 52) | (std::uint64_t(offset & 0xFFFFF) << 32) |
         (std::uint64_t(block & 0x3FFFFF) << 10) | std::uint64_t(thread & 0x3FF);
}

struct BarrierWait {
  bool written = false;
  std::uint32_t offset = 0, parity = 0, block = 0, thread = 0;
};

inline BarrierWait decode_barrier_wait(std::uint64_t word) {
  BarrierWait w;
  w.written = (word >> 63) != 0;
  w.parity = std::uint32_t(word >> 52) & 1;
  w.offset = std::uint32_t(word >> 32) & 0xFFFFF;
  w.block = std::uint32_t(word >> 10) & 0x3FFFFF;
  w.thread = std::uint32_t(word) & 0x3FF;
  return w;
}

// The barrier of the sm90 attention kernel at `offset` (its layout for D = 64
// and D = 128 do not overlap), e.g. "k_empty[1] (D = 128 layout)".
std::string sm90_barrier_name(std::uint32_t offset);

// One sentence for an error message; "" when `words[0]` was never written.
std::string describe_barrier_timeout(const std::uint64_t (&words)[2]);

// Host side, process-wide. The two words in mapped pinned memory, as the device
// addresses them: allocated on first call; null when that fails or `stream` is
// being captured (then a timed-out wait traps without a report). Never throws.
std::uint64_t* barrier_timeout_slot(void* stream);

// describe_barrier_timeout() of the slot; "" when none was allocated or written.
std::string barrier_timeout_note();

}  // namespace stsa::cuda_detail
