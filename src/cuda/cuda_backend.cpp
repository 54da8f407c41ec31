// The CUDA backend: checks a call completely before touching the GPU, keeps the
// device copies of the plans it has seen, and launches one kernel per group of
// heads that share a plan.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "cuda/attention_launch.hpp"
#include "cuda/capture.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device_checks.hpp"
#include "cuda/device_plan_arrays.hpp"
#include "cuda/launch_schedule.hpp"
#include "cuda/scattered_output_order.hpp"
#include "stsa/cuda.hpp"
#include "stsa/error.hpp"

namespace stsa {
namespace {

using cuda_detail::AttentionParams;

constexpr double kLog2e = 1.4426950408889634;

// Everything that can be checked without a GPU.
void check_on_host(const AttentionCall& call) {
  // The kernels index tokens in 32 bits, up to one tile past the last (the
  // ragged-tile test `first_key + kTileK > tokens`). Right after the layout's
  // own checks (tokens() of an unchecked grid can overflow), so that a layout
  // too large for them is named as such rather than as a tensor mismatch.
  call.layout.validate();
  constexpr std::int64_t kMaxTokens = std::int64_t(INT_MAX) - cuda_detail::kTileK;
  STSA_CHECK(call.layout.tokens() <= kMaxTokens, Unsupported, "the cuda backend indexes tokens in 32 bits: at most ",
             kMaxTokens, " tokens per sequence, got ", call.layout.tokens());
  validate(call, /*require_plans=*/true);
  STSA_CHECK(call.q.dtype == DType::BF16 || call.q.dtype == DType::F16, Unsupported, "the cuda backend takes bf16 or ",
             "fp16 q/k/v, got ", to_string(call.q.dtype));
  STSA_CHECK(call.descales.empty(), Unsupported,
             "the cuda backend takes no per-(batch, head) descales yet (the cpu and reference backends do)");
  cuda_detail::refuse_grouped_kv("the cuda backend: ", call.k, call.layout.heads);
  STSA_CHECK(cuda_detail::attention_head_dim_supported(int(call.layout.head_dim)), Unsupported,
             "the cuda backend supports head dims 64 and 128, got ", call.layout.head_dim);
  // The kernel reads and writes whole 16-byte vectors (inputs) and element pairs
  // (outputs) of each (batch, token, head) row.
  for (const auto& [name, tensor] : {std::pair{"q", &call.q}, {"k", &call.k}, {"v", &call.v}, {"o", &call.o}})
    cuda_detail::require_row_vectors("", name, *tensor);
  STSA_CHECK(reinterpret_cast<std::uintptr_t>(call.lse.data) % alignof(float) == 0, Unsupported,
             "lse is not 4-byte aligned; the cuda backend stores it as fp32");
  // The kernels mask scores with -inf before scaling them and keep the running
  // maximum of unscaled scores: both hold only for a positive scale.
  STSA_CHECK(std::isfinite(call.scale()) && call.scale() > 0, Unsupported,
             "the cuda backend needs a positive softmax scale, got ", call.scale());
  for (std::size_t h = 0; h < call.heads.size(); ++h) {
    const HeadMask& head = call.heads[h];
    if (!head.compute) continue;
    const TileShape tile = head.plan->tile();
    STSA_CHECK(tile.q == cuda_detail::kTileQ && tile.k == cuda_detail::kTileK, Unsupported, "head ", h,
               " has a plan of ", tile.q, "x", tile.k, " tiles; the cuda backend runs ", cuda_detail::kTileQ, "x",
               cuda_detail::kTileK, " tiles only");
  }
}

struct DeviceFacts {
  int device = -1;
  int major = 0, minor = 0;
  int multiprocessors = 0;
  int smem_optin = 0;
};

DeviceFacts device_facts() {
  DeviceFacts f;
  f.device = cuda_detail::current_device();
  STSA_CUDA_CHECK(cudaDeviceGetAttribute(&f.major, cudaDevAttrComputeCapabilityMajor, f.device));
  STSA_CUDA_CHECK(cudaDeviceGetAttribute(&f.minor, cudaDevAttrComputeCapabilityMinor, f.device));
  STSA_CUDA_CHECK(cudaDeviceGetAttribute(&f.multiprocessors, cudaDevAttrMultiProcessorCount, f.device));
  STSA_CUDA_CHECK(cudaDeviceGetAttribute(&f.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, f.device));
  return f;
}

// The kernel `requested` becomes on this device; Unsupported when it cannot run here.
CudaKernel resolve_kernel(CudaKernel requested, const DeviceFacts& f) {
  STSA_CHECK(f.major >= 8, Unsupported, "the cuda backend needs compute capability 8.0 or newer, device ", f.device,
             " has ", f.major, ".", f.minor);
  // sm_90a machine code runs on compute capability 9.0 only (no PTX is shipped for it).
  const bool hopper = f.major == 9 && f.minor == 0;
  // The fastest correct kernel measured on an H200 (bench/gpu/RESULTS.md, 2026-12-04).
  if (requested == CudaKernel::Auto) return hopper ? CudaKernel::Sm90PingPong : CudaKernel::Sm80;
  STSA_CHECK(requested == CudaKernel::Sm80 || hopper, Unsupported, "the ", to_string(requested),
             " kernel needs compute capability 9.0, device ", f.device, " has ", f.major, ".", f.minor);
  return requested;
}

bool is_sm90(CudaKernel kernel) {
  return kernel == CudaKernel::Sm90 || kernel == CudaKernel::Sm90Overlap || kernel == CudaKernel::Sm90PingPong;
}

cuda_detail::Sm90Schedule sm90_schedule(CudaKernel kernel) {
  switch (kernel) {
    case CudaKernel::Sm90Overlap: return cuda_detail::Sm90Schedule::Overlap;
    case CudaKernel::Sm90PingPong: return cuda_detail::Sm90Schedule::PingPong;
    default: return cuda_detail::Sm90Schedule::Serial;
  }
}

int smem_bytes(CudaKernel kernel, int head_dim) {
  return is_sm90(kernel) ? cuda_detail::attention_sm90_smem_bytes(head_dim)
                         : cuda_detail::attention_smem_bytes(head_dim);
}

// The device a call runs on and the kernel it runs with there.
struct Launch {
  DeviceFacts facts;
  CudaKernel kernel = CudaKernel::Sm80;
};

// What needs the GPU: its presence and size, and that every tensor lives on it.
Launch check_on_device(const AttentionCall& call, CudaKernel requested) {
  const DeviceFacts f = device_facts();
  const int device = f.device;
  const CudaKernel kernel = resolve_kernel(requested, f);
  const int needed = smem_bytes(kernel, int(call.layout.head_dim));
  STSA_CHECK(f.smem_optin >= needed, Unsupported, "the cuda ", to_string(kernel), " kernel needs ", needed,
             " bytes of shared memory per block; device ", device, " offers ", f.smem_optin);
  // Host memory is valid input for the library (other backends take it), just not
  // for this backend: Unsupported, so generic harnesses treat it as "not supported".
  constexpr std::string_view kHint = "the cuda backend takes device pointers";
  for (const auto& [name, tensor] : {std::pair{"q", &call.q}, {"k", &call.k}, {"v", &call.v}, {"o", &call.o}})
    cuda_detail::require_device_memory("", name, tensor->byte_extent(), device, kHint);
  if (call.lse.data != nullptr) cuda_detail::require_device_memory("", "lse", call.lse.byte_extent(), device, kHint);
  return {f, kernel};
}

void copy_strides(std::int64_t (&out)[3], const TensorView& t) {
  for (int i = 0; i < 3; ++i) out[i] = t.stride[i];
}

int out_type(DType t) {
  switch (t) {
    case DType::F32: return cuda_detail::kOutF32;
    case DType::BF16: return cuda_detail::kOutBF16;
    case DType::F16: return cuda_detail::kOutF16;
    case DType::F8E4M3: break;  // not an output type: validate() refuses an fp8 o
  }
  return cuda_detail::kOutF32;
}

}  // namespace

std::string_view to_string(CudaKernel kernel) {
  switch (kernel) {
    case CudaKernel::Auto: return "auto";
    case CudaKernel::Sm80: return "sm80";
    case CudaKernel::Sm90: return "sm90";
    case CudaKernel::Sm90Overlap: return "sm90-overlap";
    case CudaKernel::Sm90PingPong: return "sm90-pingpong";
  }
  return "?";
}

CudaKernel parse_cuda_kernel(std::string_view name) {
  for (const CudaKernel k : {CudaKernel::Auto, CudaKernel::Sm80, CudaKernel::Sm90, CudaKernel::Sm90Overlap,
                             CudaKernel::Sm90PingPong})
    if (name == to_string(k)) return k;
  throw InvalidArgument(detail::concat("unknown cuda kernel '", name,
                                       "' (expected auto, sm80, sm90, sm90-overlap or sm90-pingpong)"));
}

std::string_view to_string(CudaWorkOrder order) {
  switch (order) {
    case CudaWorkOrder::Auto: return "auto";
    case CudaWorkOrder::AcrossHeads: return "across-heads";
    case CudaWorkOrder::HeadByHead: return "head-by-head";
    case CudaWorkOrder::HeavyFirst: return "heavy-first";
  }
  return "?";
}

CudaWorkOrder parse_cuda_work_order(std::string_view name) {
  for (const CudaWorkOrder order :
       {CudaWorkOrder::Auto, CudaWorkOrder::AcrossHeads, CudaWorkOrder::HeadByHead, CudaWorkOrder::HeavyFirst})
    if (name == to_string(order)) return order;
  throw InvalidArgument(detail::concat("unknown cuda work order '", name,
                                       "' (expected auto, across-heads, head-by-head or heavy-first)"));
}

std::string_view to_string(CudaBlockSchedule schedule) {
  switch (schedule) {
    case CudaBlockSchedule::Balanced: return "balanced";
    case CudaBlockSchedule::RoundRobin: return "round-robin";
    case CudaBlockSchedule::Snake: return "snake";
  }
  return "?";
}

CudaBlockSchedule parse_cuda_block_schedule(std::string_view name) {
  for (const CudaBlockSchedule schedule :
       {CudaBlockSchedule::Balanced, CudaBlockSchedule::RoundRobin, CudaBlockSchedule::Snake})
    if (name == to_string(schedule)) return schedule;
  throw InvalidArgument(
      detail::concat("unknown cuda block schedule '", name, "' (expected balanced, round-robin or snake)"));
}

struct CudaBackend::State {
  CudaBackendOptions options;
  struct Entry {
    const TilePlan* key = nullptr;        // identity only; `host` says whether it still lives
    std::weak_ptr<const TilePlan> host;
    int device = -1;
    std::shared_ptr<const DevicePlan> uploaded;
  };
  mutable std::mutex mutex;
  mutable std::vector<Entry> entries;

  // The cached device copy of `plan`, uploaded on a miss unless !may_upload
  // (the call's stream is being captured into a graph: InvalidArgument; no
  // expired plan is freed then either, since freeing waits for the device).
  std::shared_ptr<const DevicePlan> device_plan(const std::shared_ptr<const TilePlan>& plan, bool may_upload) const;
};

CudaBackend::CudaBackend(CudaBackendOptions options) : state_(std::make_unique<State>()) {
  STSA_CHECK(options.persistent_blocks >= 0, InvalidArgument,
             "CudaBackendOptions::persistent_blocks must be >= 0 (0: one per multiprocessor), got ",
             options.persistent_blocks);
  // Enumerators only: a value cast from an integer would otherwise fall into
  // some branch's default (the across-heads order, the sm80 launch path).
  STSA_CHECK(options.kernel == CudaKernel::Auto || options.kernel == CudaKernel::Sm80 ||
                 options.kernel == CudaKernel::Sm90 || options.kernel == CudaKernel::Sm90Overlap ||
                 options.kernel == CudaKernel::Sm90PingPong,
             InvalidArgument, "CudaBackendOptions::kernel is not a CudaKernel (", int(options.kernel), ")");
  STSA_CHECK(options.work_order == CudaWorkOrder::Auto || options.work_order == CudaWorkOrder::AcrossHeads ||
                 options.work_order == CudaWorkOrder::HeadByHead || options.work_order == CudaWorkOrder::HeavyFirst,
             InvalidArgument, "CudaBackendOptions::work_order is not a CudaWorkOrder (", int(options.work_order), ")");
  STSA_CHECK(options.block_schedule == CudaBlockSchedule::Balanced ||
                 options.block_schedule == CudaBlockSchedule::RoundRobin ||
                 options.block_schedule == CudaBlockSchedule::Snake,
             InvalidArgument, "CudaBackendOptions::block_schedule is not a CudaBlockSchedule (",
             int(options.block_schedule), ")");
  state_->options = options;
}
CudaBackend::~CudaBackend() = default;

const CudaBackendOptions& CudaBackend::options() const { return state_->options; }

CudaKernel CudaBackend::resolved_kernel() const { return resolve_kernel(state_->options.kernel, device_facts()); }

std::shared_ptr<const DevicePlan> CudaBackend::device_plan(const std::shared_ptr<const TilePlan>& plan) const {
  return state_->device_plan(plan, /*may_upload=*/true);
}

std::shared_ptr<const DevicePlan> CudaBackend::State::device_plan(const std::shared_ptr<const TilePlan>& plan,
                                                                  bool may_upload) const {
  STSA_CHECK(plan != nullptr, InvalidArgument, "device_plan: no plan given");
  const int device = cuda_detail::current_device();
  std::lock_guard lock(mutex);
  // Plans whose host copy is gone are dropped (cudaFree waits for kernels still
  // using them); not during a capture, which a device-wide wait would break.
  if (may_upload) std::erase_if(entries, [](const State::Entry& e) { return e.host.expired(); });
  // Least recently used first: a hit moves to the back, a full cache drops the front.
  const auto hit = std::find_if(entries.begin(), entries.end(),
                                [&](const State::Entry& e) {
                                  // A live host plan: during a capture expired entries stay, and a new
                                  // plan may have been allocated at a dead one's address.
                                  return e.key == plan.get() && e.device == device && !e.host.expired();
                                });
  if (hit != entries.end()) {
    std::rotate(hit, hit + 1, entries.end());
    return entries.back().uploaded;
  }
  STSA_CHECK(may_upload, InvalidArgument,
             cuda_detail::capture_needs_warm_up(detail::concat("uploading the tile plan of ", plan->grid().describe(),
                                                               " (not on this device yet)")));
  if (entries.size() >= CudaBackend::kMaxCachedPlans) entries.erase(entries.begin());
  entries.push_back({plan.get(), plan, device, DevicePlan::upload(*plan)});
  return entries.back().uploaded;
}

std::size_t CudaBackend::cached_plans() const {
  std::lock_guard lock(state_->mutex);
  return state_->entries.size();
}

Support CudaBackend::supports(const AttentionCall& call) const {
  try {
    check_on_host(call);
    check_on_device(call, state_->options.kernel);
  } catch (const Error& e) {
    return {false, e.what()};
  }
  return {};
}

void CudaBackend::run(const AttentionCall& call) const {
  run_async(call, nullptr);
  STSA_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

void CudaBackend::run_scattered(const AttentionCall& call, const ScatteredOutput& out) const {
  run_async_scattered(call, out, nullptr);
  STSA_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

void CudaBackend::run_async(const AttentionCall& call, void* stream) const { enqueue(call, nullptr, stream, true); }

void CudaBackend::run_async_scattered(const AttentionCall& call, const ScatteredOutput& out, void* stream) const {
  enqueue(call, &out, stream, true);
}

std::vector<std::shared_ptr<const DevicePlan>> CudaBackend::prepare(const AttentionCall& call, void* stream,
                                                                    const ScatteredOutput* out) const {
  return enqueue(call, out, stream, false);
}

std::vector<std::shared_ptr<const DevicePlan>> CudaBackend::enqueue(const AttentionCall& call,
                                                                    const ScatteredOutput* scattered, void* stream,
                                                                    bool launch) const {
  // A scattered output is checked as the call's o and lse (narrowed to its heads).
  std::optional<AttentionCall> narrowed;
  if (scattered) {
    narrowed = scattered_call_for_checks(call, *scattered);
    // 16-byte rows in every head of the full tensor, not only the narrowed ones.
    cuda_detail::require_row_vectors("run_async_scattered: ", "o", scattered->o);
  }
  const AttentionCall& checked = narrowed ? *narrowed : call;
  check_on_host(checked);
  const auto [facts, kernel] = check_on_device(checked, state_->options.kernel);
  const TensorView& o = scattered ? scattered->o : call.o;
  const LseView& lse = scattered ? scattered->lse : call.lse;
  if (scattered) {
    cuda_detail::require_device_memory("", "o", o.byte_extent(), facts.device, "the cuda backend takes device pointers");
    if (lse.data != nullptr)
      cuda_detail::require_device_memory("", "lse", lse.byte_extent(), facts.device,
                                         "the cuda backend takes device pointers");
  }

  AttentionParams params;
  params.q = call.q.data;
  params.k = call.k.data;
  params.v = call.v.data;
  params.o = o.data;
  params.lse = lse.data;
  copy_strides(params.q_stride, call.q);
  copy_strides(params.k_stride, call.k);
  copy_strides(params.v_stride, call.v);
  copy_strides(params.o_stride, o);
  for (int i = 0; i < 3; ++i) params.lse_stride[i] = lse.stride[i];
  if (scattered) params.o_order = cuda_detail::output_order(scattered->grid, scattered->from, scattered->to);
  params.tokens = int(call.layout.tokens());
  params.batch = int(call.layout.batch);
  params.total_heads = int(call.layout.heads);
  params.head_dim = int(call.layout.head_dim);
  params.out_type = out_type(o.dtype);
  params.scale = call.scale();
  params.scale_log2 = float(double(call.scale()) * kLog2e);

  // Heads that share a plan share a launch (and the device copy of the plan).
  // During graph capture nothing may be uploaded (or freed): a plan or a launch
  // shape not seen before is refused before anything is enqueued.
  const bool may_upload = !cuda_detail::stream_is_capturing(stream, "");
  std::vector<const TilePlan*> group_keys;
  std::vector<std::pair<std::shared_ptr<const DevicePlan>, std::vector<int>>> groups;
  for (std::size_t h = 0; h < call.heads.size(); ++h) {
    const HeadMask& head = call.heads[h];
    if (!head.compute) continue;
    const auto found = std::find(group_keys.begin(), group_keys.end(), head.plan.get());
    std::size_t index = std::size_t(found - group_keys.begin());
    if (found == group_keys.end()) {
      group_keys.push_back(head.plan.get());
      groups.emplace_back(state_->device_plan(head.plan, may_upload), std::vector<int>{});
    }
    groups[index].second.push_back(int(h));
  }

  // Every launch's schedule first, then the launches: a schedule that cannot
  // be had (not uploaded during a capture, or past the kernel's counters)
  // throws before any launch, so a call runs whole or not at all.
  struct Launch {
    const DevicePlan::Arrays* arrays;
    const std::vector<int>* heads;
    std::size_t first, count;
    cuda_detail::LaunchSchedule schedule;
  };
  std::vector<Launch> launches;
  const int requested_blocks = state_->options.persistent_blocks;
  const int persistent_blocks = requested_blocks > 0 ? requested_blocks : facts.multiprocessors;
  for (const auto& [plan, heads] : groups)
    for (std::size_t first = 0; first < heads.size(); first += cuda_detail::kMaxHeadsPerLaunch) {
      const std::size_t count = std::min<std::size_t>(cuda_detail::kMaxHeadsPerLaunch, heads.size() - first);
      launches.push_back({&plan->arrays(), &heads, first, count,
                          cuda_detail::launch_schedule(plan->arrays(), state_->options, is_sm90(kernel),
                                                       call.layout.batch * std::int64_t(count), persistent_blocks,
                                                       may_upload)});
    }
  std::vector<std::shared_ptr<const DevicePlan>> used;
  for (const auto& group : groups) used.push_back(group.first);
  if (!launch) return used;

  const bool bf16 = call.q.dtype == DType::BF16;
  for (const Launch& launch : launches) {
    const DevicePlan::Arrays& arrays = *launch.arrays;
    params.row_begin = arrays.row_begin;
    params.partial_begin = arrays.partial_begin;
    params.key_tiles = arrays.key_tiles;
    params.mask_ids = arrays.mask_ids;
    params.masks = arrays.masks;
    params.q_tile_order = arrays.q_tile_order;
    params.q_tiles = int(arrays.q_tiles);
    params.head_count = int(launch.count);
    std::copy_n(launch.heads->begin() + std::ptrdiff_t(launch.first), launch.count, params.heads);
    for (std::size_t j = 0; j < launch.count; ++j)
      params.o_heads[j] = scattered ? int(scattered->heads[std::size_t(params.heads[j])]) : params.heads[j];
    params.work_order = launch.schedule.work_order;
    params.heavy_ranks = launch.schedule.heavy_ranks;
    params.snake = launch.schedule.snake ? 1 : 0;
    params.block_item_begin = launch.schedule.block_item_begin;
    params.block_items = launch.schedule.block_items;
    if (is_sm90(kernel))
      cuda_detail::launch_attention_sm90(params, bf16, launch.schedule.blocks, sm90_schedule(kernel), stream);
    else
      cuda_detail::launch_attention(params, bf16, int(call.layout.head_dim), stream);
  }
  return used;
}

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace stsa
