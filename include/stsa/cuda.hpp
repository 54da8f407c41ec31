// The CUDA backend: tile-sparse flash attention on NVIDIA GPUs, plus the GPU
// token permutation and small device-memory helpers.
//
// Plain C++: using it needs no CUDA header. Every tensor in an AttentionCall
// given to this backend must be device memory of the current device. Malformed
// calls give InvalidArgument (validate()); everything below, host pointers
// included, gives Unsupported, checked before any launch:
//   - q, k, v in bf16 or fp16 (o in fp32, bf16 or fp16; LSE fp32, any strides);
//   - head dim 64 or 128;
//   - the head dim contiguous (stride 1) and every (batch, token, head) row
//     16-byte aligned: data pointers and the B, N and H strides in bytes are
//     multiples of 16;
//   - tile plans of 128 x 128 tiles, in the tensors' token order (temporal
//     heads are gathered first, cuda_gather_heads, and their output scattered
//     back by cuda_scatter_heads or by the kernel's stores, run_async_scattered);
//   - a positive softmax scale;
//   - a GPU of compute capability 8.0 or newer with enough shared memory per
//     block (the sm80 kernel at D = 128: 136 KB, so A100/H100/H200 class, not
//     the 99 KB of compute capability 8.6/8.9).
// The first call with a plan uploads it and waits for the copy, the first Hopper
// call of each launch shape (plan, batch x heads, persistent blocks, work order,
// block schedule) uploads its block schedule the same way, and the first Hopper
// call allocates the small host-mapped buffer a hung barrier wait reports into:
// make such calls before capturing into a CUDA graph (a warm-up call of every
// shape the graph will hold, before any capture begins). A call on a capturing
// stream that would need an upload throws InvalidArgument before anything is
// enqueued, so the capture stays intact (tested in global capture mode,
// PyTorch's default). A graph
// holds the device addresses of the plans it launched with: keep each plan's
// device copy alive while the graph may replay, by holding what device_plan()
// returns (the backend's cache drops a copy when its host plan dies or past
// kMaxCachedPlans, and the memory goes with the last reference).
// Without a GPU the backend still constructs; supports() says why it cannot
// run and run() throws Unsupported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stsa/attention.hpp"
#include "stsa/layout.hpp"
#include "stsa/permute.hpp"
#include "stsa/plan.hpp"
#include "stsa/tensor.hpp"

namespace stsa {

// Number of usable CUDA devices; 0 when there is no driver or no GPU. Never throws.
int cuda_device_count();
// Why there is no usable device (the CUDA runtime's message), empty when there is one.
std::string cuda_unavailable_reason();

struct CudaDeviceInfo {
  int index = -1;
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int multiprocessors = 0;
  std::int64_t global_memory_bytes = 0;
  std::int64_t l2_cache_bytes = 0;
  std::int64_t shared_memory_per_block_optin = 0;
  bool memory_pools = false;  // stream-ordered allocation (the library's scratch pool needs it)
  int driver_version = 0, runtime_version = 0;  // e.g. 13000
  std::string pci_bus_id;  // "0000:00:06.0", as cudaDeviceGetPCIBusId writes it (how NVML finds the device)
};
// Properties of `device` (-1: the current one). Throws InvalidArgument for another
// negative index or one past the devices present, Unsupported without a GPU.
CudaDeviceInfo cuda_device_info(int device = -1);

// Waits for all work on the current device; throws Error with CUDA's message
// if a kernel failed. Throws Unsupported without a GPU.
void cuda_synchronize();

// Scratch memory (the GPU router's workspace, routed attention's packed
// temporal heads) comes from a stream-ordered pool the library keeps per device,
// so that repeated calls never allocate from the driver (cudaMalloc and cudaFree
// synchronize the device). The pool keeps its high-water mark.
// The bytes it holds on the current device (0 where the device has no pools);
// throws Unsupported without a GPU, as cuda_release_scratch does.
std::int64_t cuda_scratch_bytes();
// Waits for the current device, then returns the pool's unused memory to the driver.
void cuda_release_scratch();

// An owning allocation of device memory on the current device.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Throws Unsupported without a GPU and ResourceError when the device is out of memory.
  explicit DeviceBuffer(std::size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  // Synchronous copies; the range [offset, offset + bytes) must lie in the buffer.
  void copy_from_host(const void* src, std::size_t bytes, std::size_t offset = 0);
  void copy_to_host(void* dst, std::size_t bytes, std::size_t offset = 0) const;
  void fill_bytes(unsigned char value);

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// A tile plan copied to one device once (CSR lists, partial bitmasks and a
// longest-first order of query tiles) and reused by every call, head and layer
// that uses the plan. Keeps no reference to the host plan.
class DevicePlan {
 public:
  // Uploads to the current device. Throws Unsupported without a GPU.
  static std::shared_ptr<const DevicePlan> upload(const TilePlan& plan);
  ~DevicePlan();
  DevicePlan(const DevicePlan&) = delete;
  DevicePlan& operator=(const DevicePlan&) = delete;

  int device() const;
  TileShape tile() const;
  std::int64_t q_tiles() const;
  std::int64_t kept_tiles() const;
  // Device memory the plan holds: its arrays, and the block schedule of each
  // launch shape a persistent Hopper kernel has run it with (kept until the
  // plan is freed).
  std::int64_t device_bytes() const;

  struct Arrays;  // device pointers, read by the kernels (src/cuda/device_plan_arrays.hpp)
  const Arrays& arrays() const { return *arrays_; }

 private:
  DevicePlan();
  std::unique_ptr<Arrays> arrays_;
};

// Which attention kernel the backend launches.
//   Sm90: Hopper path (wgmma from warpgroups, TMA loads, producer/consumer warp
//         specialization, persistent scheduler); needs compute capability 9.0.
//   Sm90Overlap: the same with each consumer warpgroup overlapping the scores of
//         tile t with P V of tile t-1 (FlashAttention-3's intra-warpgroup
//         overlap).
//   Sm90PingPong: Sm90Overlap with the two consumer warpgroups taking turns to
//         issue their products (ping-pong), so one's softmax runs under the
//         other's products.
//   Sm80: portable path (mma.sync, cp.async); compute capability >= 8.0 with the
//         shared memory it needs (D = 128: 136 KB per block, as on A100/H100/H200).
//   Auto: Sm90PingPong on compute capability 9.0 (with the Auto work order,
//         6-17% faster than Sm90Overlap in all 15 Wan2.1 cases of the fourth
//         H200 run: bench/gpu/RESULTS.md), Sm80 elsewhere.
enum class CudaKernel : std::uint8_t { Auto, Sm80, Sm90, Sm90Overlap, Sm90PingPong };
// "auto", "sm80", "sm90", "sm90-overlap", "sm90-pingpong"
std::string_view to_string(CudaKernel kernel);
CudaKernel parse_cuda_kernel(std::string_view name);  // the names above; throws InvalidArgument

// The order in which a launch walks its work items (one per query tile of each
// (batch, head)); both kernels take the heaviest query tiles of a head first.
//   AcrossHeads: the heaviest tiles of every head, then the next heaviest, ...
//         (the persistent sm90 blocks stay balanced to about one item).
//   HeadByHead: every tile of one head before the next, so the blocks running
//         at one moment share that head's K and V in L2 (FlashAttention-3's
//         order): 6-18% faster on an H200 where the blocks stay balanced.
//   HeavyFirst: the heavy tiles (those keeping more than 1.5x the median
//         tile's key tiles: the anchor rows) of every head first, across
//         heads, then the rest head by head. Meant for the Snake schedule
//         below: a model of the L2 (bench/gpu/stsa_l2_model) keeps the running
//         blocks on one head's K and V window at every density that way, where
//         head by head round-robin drifts apart at 1440p s >= 0.2. Not yet
//         measured on a GPU (bench/NOTES.md, "Heavy first, snake").
//   Auto: per launch, head by head unless a model of the persistent blocks
//         under the block schedule below predicts it unbalanced (round-robin:
//         plans whose few heavy rows land on few blocks, as 720p at density
//         0.1-0.2); across heads for sm80 (src/cuda/work_order_model.hpp).
enum class CudaWorkOrder : std::uint8_t { Auto, AcrossHeads, HeadByHead, HeavyFirst };
// "auto", "across-heads", "head-by-head", "heavy-first"
std::string_view to_string(CudaWorkOrder order);
CudaWorkOrder parse_cuda_work_order(std::string_view name);  // the names above; throws InvalidArgument

// How the persistent Hopper kernels share a launch's work items among their
// blocks; each block walks its items in the order they were handed out
// (src/cuda/block_schedule.hpp).
//   Balanced: on the host, each item goes to the block whose items so far cost
//         least (kept key tiles plus a fixed cost per item): what a dynamic
//         scheduler does, without atomics. Items are handed out in the work
//         order, or every head's heavy items (the anchor rows) first where
//         that models a shorter slowest block. Computed once per plan and
//         launch shape and kept on the device with the plan, and walked as
//         lists, which the third H200 run measured 9-12% slower at equal items.
//   RoundRobin (the default): block b takes items b, b + G, b + 2G, ... (G
//         blocks), walked by arithmetic in the kernel; nothing is uploaded.
//   Snake: round-robin with every other round of G items handed out
//         backwards (blocks G-1 .. 0), so the block that took a round's
//         heaviest item takes the next round's lightest and the blocks do not
//         drift apart along costs that fall over the walk; by arithmetic too.
// The sm80 kernel is not persistent (the hardware hands out its blocks) and
// ignores this.
enum class CudaBlockSchedule : std::uint8_t { Balanced, RoundRobin, Snake };
// "balanced", "round-robin", "snake"
std::string_view to_string(CudaBlockSchedule schedule);
CudaBlockSchedule parse_cuda_block_schedule(std::string_view name);  // the names above; throws InvalidArgument

struct CudaBackendOptions {
  CudaKernel kernel = CudaKernel::Auto;
  CudaWorkOrder work_order = CudaWorkOrder::Auto;
  // How many blocks the persistent Hopper kernels launch (never more than work
  // items); 0: one per multiprocessor. Fewer leave multiprocessors to work
  // running alongside, such as a communication kernel. The sm80 kernel is not
  // persistent (one block per item) and does not use it. Must be >= 0.
  int persistent_blocks = 0;
  // RoundRobin by default: the H200's third run measured the balanced lists
  // 9-12% slower than the arithmetic walk, even naming the same items.
  CudaBlockSchedule block_schedule = CudaBlockSchedule::RoundRobin;
};

class CudaBackend final : public Backend {
 public:
  // Touches no GPU: safe in a build or on a machine without one.
  explicit CudaBackend(CudaBackendOptions options = {});
  const CudaBackendOptions& options() const;
  // The kernel a call runs with on the current device (Auto resolved). Throws
  // Unsupported without a GPU or when the requested kernel cannot run on it.
  CudaKernel resolved_kernel() const;
  ~CudaBackend() override;
  std::string_view name() const override { return "cuda"; }
  Support supports(const AttentionCall& call) const override;
  // Validates (see the top of this file), launches and waits for the result.
  void run(const AttentionCall& call) const override;
  bool runs_scattered() const override { return true; }
  // run_async_scattered on the default stream, waiting for the result.
  void run_scattered(const AttentionCall& call, const ScatteredOutput& out) const override;
  // Validates and launches on `stream` (a cudaStream_t; nullptr: the default stream)
  // without waiting; a kernel fault then surfaces at the next synchronisation.
  void run_async(const AttentionCall& call, void* stream) const;
  // run_async with O and LSE stored where `out` says (attention.hpp): the scatter
  // of packed heads fused into the kernel's stores, as routed attention runs
  // its temporal heads (no packed output, no second pass over it). call.o and
  // call.lse must be empty (data == nullptr). Checked by scattered_call_for_checks
  // (attention.hpp), then as run_async checks a call, out.o and out.lse (narrowed)
  // in the roles of o and lse, and 16-byte rows in every head of out.o.
  void run_async_scattered(const AttentionCall& call, const ScatteredOutput& out, void* stream) const;
  // Everything run_async (with `out`: run_async_scattered) would check and
  // upload for `call` on `stream`, without launching: on a stream being
  // captured into a CUDA graph it refuses what run_async would refuse. A
  // caller that captures several calls prepares them all first, so that a
  // refusal comes before any of them is recorded. Returns the device plans
  // (with their block schedules) the call's launches read: a graph that
  // recorded the call replays correctly while they are held.
  std::vector<std::shared_ptr<const DevicePlan>> prepare(const AttentionCall& call, void* stream,
                                                         const ScatteredOutput* out = nullptr) const;

  // The device copy of `plan` on the current device, uploaded on first use and
  // cached while the host plan lives: at most kMaxCachedPlans plans, the least
  // recently used dropped first (a dropped plan is uploaded again when next used).
  std::shared_ptr<const DevicePlan> device_plan(const std::shared_ptr<const TilePlan>& plan) const;
  // Device plans held, those of host plans gone since the last upload included (they are
  // freed at the next upload outside a capture: freeing waits for the device).
  std::size_t cached_plans() const;
  static constexpr std::size_t kMaxCachedPlans = 256;

 private:
  // The checks, uploads and block schedules of a call, then its launches unless
  // !launch; returns the device plans the launches read.
  std::vector<std::shared_ptr<const DevicePlan>> enqueue(const AttentionCall& call, const ScatteredOutput* scattered,
                                                         void* stream, bool launch) const;
  struct State;
  std::unique_ptr<State> state_;
};

std::unique_ptr<Backend> make_cuda_backend();

// GPU versions of gather_heads / scatter_heads (permute.hpp), same arguments and
// checks (made on the host first: InvalidArgument with or without a GPU), on
// device tensors (Unsupported otherwise), enqueued on `stream` (nullptr: default stream).
// Rows move as 16-byte vectors when the head dim is contiguous and rows are
// 16-byte aligned, element by element otherwise.
void cuda_gather_heads(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
                       std::span<const TensorView> sources, std::span<const TensorView> packed,
                       void* stream = nullptr);
void cuda_scatter_heads(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
                        std::span<const TensorView> packed, std::span<const TensorView> dests,
                        const LseView& packed_lse = {}, const LseView& lse = {}, void* stream = nullptr);

// The yardstick of the permutation's bandwidth (the GPU twin of
// measure_copy_gbps, permute.hpp): bytes read plus written per second by a
// device-to-device copy of `bytes`, in GB/s, the median of five copies timed
// with CUDA events after a warm-up. Allocates two buffers of `bytes` and waits
// for the device. Throws Unsupported without a GPU.
double cuda_measure_copy_gbps(std::size_t bytes = std::size_t(256) << 20);

}  // namespace stsa
