// Routed attention: one call that routes every head (or takes given decisions),
// runs dense, spatial and frame-window heads on the tensors as they are and
// temporal heads gathered into spatial-major order, on any backend.
//
//   1. route (Router) or take decisions;
//   2. plans from a PlanCache (one per distinct mask; each in its natural order);
//   3. backend call A: heads in frame-major order, temporal heads skipped;
//   4. gather the temporal heads' Q, K, V into packed spatial-major buffers (one pass);
//   5. backend call B on the packed heads;
//   6. scatter their O and LSE back (one pass), or, where the executor offers
//      it (where the backend runs_scattered: CPU, CUDA), step 5 stores them in
//      place itself and there is no step 6.
// Tensors come and go in frame-major token order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "stsa/attention.hpp"
#include "stsa/permute.hpp"
#include "stsa/plan.hpp"
#include "stsa/policy.hpp"
#include "stsa/router.hpp"

namespace stsa {

// The tensors of one attention call, without masks: q, k, v, o logical [B, N, H, D]
// in frame-major token order; lse [B, H, N] optional.
struct RoutedCall {
  VideoLayout layout;
  TensorView q, k, v, o;
  LseView lse;
  float softmax_scale = 0.f;  // 0: 1 / sqrt(D)
  Descales descales = {};     // per-(batch, head) q, k, v descales (attention.hpp); the router's too

  // The same tensors as a backend call, without head masks yet.
  AttentionCall attention_call() const {
    AttentionCall a;
    a.layout = layout;
    a.q = q;
    a.k = k;
    a.v = v;
    a.o = o;
    a.lse = lse;
    a.softmax_scale = softmax_scale;
    a.descales = descales;
    return a;
  }
  // The same with every head skipped (compute = false, no plan): what validate()
  // and Backend::supports() can check (tensors, dtypes, aliasing, memory)
  // before the heads are routed.
  AttentionCall unrouted_call() const {
    AttentionCall a = attention_call();
    a.heads.assign(std::size_t(std::max<std::int64_t>(layout.heads, 0)),
                   HeadMask{MaskSpec::dense(), TokenOrder::FrameMajor, nullptr, false});
    return a;
  }
};

struct RoutedOptions {
  TileShape tile;
  Alignment alignment = Alignment::Exact;
  int permute_threads = 0;  // 0: chosen from the copy size
  // Where the executor offers it (the CPU and CUDA backends do): the packed call stores the temporal
  // heads' O and LSE in place, instead of a packed output and a scatter pass.
  bool fuse_scatter = true;
  // Where the executor offers it (the CPU backend does) and the scatter is fused: the packed call
  // reads the temporal heads' Q, K and V in place, instead of packed copies and a gather pass.
  bool fuse_gather = true;
  // false: the steps are not timed (RoutedResult::timed false), and an asynchronous executor's
  // call returns once every step is enqueued, without waiting for them: a GPU caller's next
  // work queues behind them instead of the host waiting (routing, where the call routes,
  // still waits for its decisions).
  bool timed = true;
};

struct RoutedResult {
  std::vector<HeadRoute> heads;       // the decision each head ran with
  std::vector<std::int64_t> temporal; // heads run in spatial-major order
  double routing_ms = 0;              // 0 when decisions were given
  double routing_flops = 0;
  double permutation_ms = 0;          // gather + scatter (the gather alone when scatter_fused; 0 when both fused)
  double permutation_bytes = 0;       // read + written by those passes
  double attention_ms = 0;            // both backend calls
  bool scatter_fused = false;         // the packed call stored O and LSE in place
  bool gather_fused = false;          // and read Q, K and V in place (no packed copies)
  bool timed = true;                  // false: no times (RoutedOptions::timed off, or a CUDA graph capture)
  double kept_tile_flops = 0;         // what the backend's tiles compute (all heads, all batch entries)
  double kept_flops = 0;              // the masks' kept pairs alone (kept_pair_flops), all heads and batch entries

  double permutation_gbps() const { return permutation_ms > 0 ? permutation_bytes / permutation_ms / 1e6 : 0.0; }
};

// Packed buffers for the temporal heads: q, k, v, o logical [B, N, count, D] with
// the call's dtypes, lse [B, count, N] when the call wants LSE (else data == nullptr);
// o and lse empty too when the scatter is fused (no packed output).
struct PackedHeads {
  TensorView q, k, v, o;
  LseView lse;
  std::shared_ptr<void> storage;  // owns the memory behind the views
};

// Where run_routed()'s steps run and how they are timed: host memory on the
// calling thread (HostRoutedExecutor), or device memory on a CUDA stream
// (cuda_routing.hpp). Steps may be enqueued asynchronously; mark() records a
// point on the executor's timeline and elapsed_ms() waits until both points
// were reached. run_routed() reads its times last, so a timed call returns with
// every step complete (an untimed one, RoutedOptions::timed off, once enqueued).
// It allocates and prepares both backend calls before it enqueues the first
// step, so that an executor that records (a CUDA graph capture) refuses before
// anything is recorded.
class RoutedExecutor {
 public:
  virtual ~RoutedExecutor() = default;
  virtual PackedHeads allocate(const RoutedCall& call, std::int64_t count, bool with_output) = 0;
  // gather_heads / scatter_heads (permute.hpp) in this executor's memory.
  virtual void gather(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
                      std::span<const TensorView> sources, std::span<const TensorView> packed) = 0;
  virtual void scatter(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
                       std::span<const TensorView> packed, std::span<const TensorView> dests,
                       const LseView& packed_lse, const LseView& lse) = 0;
  virtual void attend(const Backend& backend, const AttentionCall& call) = 0;
  // Whether attend_scattered() runs on `backend` (the attention storing the
  // packed heads' O and LSE in place: steps 5 and 6 in one).
  virtual bool fuses_scatter(const Backend& backend) const {
    (void)backend;
    return false;
  }
  // The packed call (its o and lse empty) with its output stored as `out` says.
  virtual void attend_scattered(const Backend& backend, const AttentionCall& packed, const ScatteredOutput& out);
  // Whether attend_gathered() runs on `backend` (the attention also reading
  // the temporal heads' Q, K and V in place: steps 4 to 6 in one, nothing
  // allocated). Such an executor's prepare() is not given that call.
  virtual bool fuses_gather(const Backend& backend) const {
    (void)backend;
    return false;
  }
  // The packed call (its q, k, v, o and lse empty) reading `in`, storing `out`.
  virtual void attend_gathered(const Backend& backend, const AttentionCall& packed, const GatheredInput& in,
                               const ScatteredOutput& out);
  // Each backend call (the direct one, even with no head to compute; then the
  // packed one, with `out` when the scatter is fused), before any step is
  // enqueued: where the executor records rather than runs (a CUDA graph
  // capture), what a step would refuse is refused here.
  virtual void prepare(const Backend& backend, const AttentionCall& call, const ScatteredOutput* out) {
    (void)backend, (void)call, (void)out;
  }
  // Whether the steps run and can be timed; false while they are being
  // recorded (a CUDA graph capture): then run_routed() marks nothing and its
  // result has no times (RoutedResult::timed false).
  virtual bool timed() const { return true; }
  virtual int mark() = 0;
  virtual double elapsed_ms(int from, int to) = 0;
};

// Host tensors, the calling thread, wall-clock times.
class HostRoutedExecutor final : public RoutedExecutor {
 public:
  explicit HostRoutedExecutor(int permute_threads = 0) : threads_(permute_threads) {}
  PackedHeads allocate(const RoutedCall& call, std::int64_t count, bool with_output) override;
  void gather(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
              std::span<const TensorView> sources, std::span<const TensorView> packed) override;
  void scatter(const VideoGrid& grid, TokenOrder from, TokenOrder to, std::span<const std::int64_t> heads,
               std::span<const TensorView> packed, std::span<const TensorView> dests, const LseView& packed_lse,
               const LseView& lse) override;
  void attend(const Backend& backend, const AttentionCall& call) override;
  // Where the backend stores a scattered output (Backend::runs_scattered).
  bool fuses_scatter(const Backend& backend) const override;
  void attend_scattered(const Backend& backend, const AttentionCall& packed, const ScatteredOutput& out) override;
  // Where the backend reads a gathered input (Backend::runs_gathered).
  bool fuses_gather(const Backend& backend) const override;
  void attend_gathered(const Backend& backend, const AttentionCall& packed, const GatheredInput& in,
                       const ScatteredOutput& out) override;
  int mark() override;
  double elapsed_ms(int from, int to) override;

 private:
  int threads_;
  std::vector<double> marks_ms_;  // steady-clock readings
};

// run_routed() below with its steps on `executor` (options.permute_threads is the executor's business).
RoutedResult run_routed(RoutedExecutor& executor, const Backend& backend, PlanCache& plans, const RoutedCall& call,
                        std::vector<HeadRoute> decisions, const RoutedOptions& options = {});

// Routes with `router`, then runs (see above).
RoutedResult routed_attention(const Backend& backend, PlanCache& plans, const RoutedCall& call, const Router& router,
                              const RoutedOptions& options = {});

// Runs with given decisions (one per head): each head runs with its spec (a band in
// spatial-major order gathered, as a temporal head); route is only carried into the result.
RoutedResult run_routed(const Backend& backend, PlanCache& plans, const RoutedCall& call,
                        std::vector<HeadRoute> decisions, const RoutedOptions& options = {});

// Under a policy: dense during the warm-up (step < dense_steps or layer < dense_layers);
// otherwise heads with a reusable decision keep it and only the others are routed
// (the router uses policy.options().router), and new decisions are remembered.
RoutedResult policy_attention(const Backend& backend, PlanCache& plans, Policy& policy, const RoutedCall& call,
                              std::int64_t step, std::int64_t layer, const RoutedOptions& options = {});

}  // namespace stsa
