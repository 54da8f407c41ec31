// Online head routing: decide per head whether it is spatial, temporal (or
// frame-window) or must stay dense, from a small sample of its own query rows.
//
// For each head the router takes S query rows (default 64; every row of a call
// with fewer tokens) spread over all frames (stratified, seeded, round-robin
// over the batch), computes their exact
// attention output against all keys, and again under each candidate mask at
// the configured kept density. The candidate with the lowest MSE of the sampled
// outputs wins (Sparse VideoGen's rule; the relative L2 error is reported too).
// If even the winner's relative L2 error is above max_rel_l2 the head stays
// dense: a head is never forced into a mask that breaks it.
//
// Cost per head: 2 S N D FLOPs for the scores plus 2 S D (N + kept keys of each
// candidate) for the outputs, i.e. O(S x N x D); the report gives the exact count.
// On CPUs with AMX, bf16, fp16 and fp8 inputs (any head dim up to 512, padded
// to the packer's) run these as tile products: every candidate's output over all keys, with the weights as
// two bf16 parts each (within 2^-16 of themselves); the counted FLOPs stay the
// ones above.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "stsa/attention.hpp"
#include "stsa/cpu.hpp"
#include "stsa/layout.hpp"
#include "stsa/mask.hpp"
#include "stsa/tensor.hpp"

namespace stsa {

enum class Route : std::uint8_t { Dense, Spatial, Temporal, FrameWindow };
std::string_view to_string(Route route);
Route parse_route(std::string_view name);  // "dense" | "spatial" | "temporal" | "frames"; throws InvalidArgument

struct RouterOptions {
  int samples = 64;                   // S query rows per head
  double spatial_density = 0.25;      // kept fraction of each candidate mask
  double temporal_density = 0.25;
  double frame_window_density = 0.25;
  bool try_frame_window = false;      // also consider the frame-window mask
  double max_rel_l2 = 0.5;            // best candidate above this relative L2 error -> dense
  bool anchor = true;                 // symmetric frame-0 anchor in every candidate
  std::uint64_t seed = 1;
  int threads = 0;                    // 0: resolve_threads(0) (cpu.hpp): the process default, STSA_THREADS, all
  // Resolved as CpuOptions::isa is (STSA_ISA; Amx on a CPU without it throws
  // Unsupported). Amx: AMX tile products where they apply (bf16, fp16 or fp8
  // inputs, head dim up to 512); Avx512: the scores from AVX-512 bf16 dot
  // products for bf16 or fp8 inputs (head dim up to 512), the weighted sums in
  // fp32; otherwise, and any other isa, fp32 vector arithmetic throughout
  // (RoutingReport::product_units says which ran).
  Isa isa = Isa::Auto;
  void validate() const;              // throws InvalidArgument naming the field and its range
};

// The mask a route runs with on `grid` under `options` (Dense -> MaskSpec::dense()).
MaskSpec route_spec(const VideoGrid& grid, Route route, const RouterOptions& options);

struct CandidateError {
  Route route = Route::Spatial;
  MaskSpec spec;
  double mse = 0;     // mean over sampled rows and channels of (O_mask - O_dense)^2
  double rel_l2 = 0;  // ||O_mask - O_dense|| / ||O_dense|| over the sampled rows
};

struct HeadRoute {
  Route route = Route::Dense;
  MaskSpec spec;                           // what the head runs with
  std::vector<CandidateError> candidates;  // spatial, temporal[, frame window]; empty if given, not measured
  const CandidateError* best() const;      // lowest MSE, nullptr when none
};

struct RoutingReport {
  std::vector<HeadRoute> heads;              // one per routed head, in the order asked for
  std::vector<std::int64_t> sampled_rows;    // token positions in tensor order
  std::vector<std::int64_t> sampled_batch;   // batch index of each sampled row
  double routing_ms = 0;         // wall time of the whole call
  double routing_device_ms = 0;  // the GPU router's kernels alone (CUDA events); 0 from the CPU router
  double flops = 0;  // floating-point operations of the sampled attention (scores and outputs)
  // What the CPU router computed them on (RouterOptions::isa): AmxTiles (scores and
  // weighted sums), Bf16Dot (the scores from AVX-512 VDPBF16PS, the sums fp32 FMAs) or
  // Fma (fp32 vectors throughout); empty from the GPU router.
  std::optional<ProductUnits> product_units;
  bool tile_products = false;  // product_units == AmxTiles
};

class Router {
 public:
  explicit Router(RouterOptions options = {});
  const RouterOptions& options() const { return options_; }

  // The sampled (batch, position) pairs: min(samples, tokens) of them, so a call
  // with fewer tokens than samples has every position sampled once.
  void sample_rows(const VideoLayout& layout, TokenOrder order, std::vector<std::int64_t>& rows,
                   std::vector<std::int64_t>& batch) const;

  // Routes heads `heads` (all when empty) of q, k, v (logical [B, N, H, D], tokens in `order`).
  // softmax_scale 0 means 1 / sqrt(D); `descales` (attention.hpp) scale each (batch, head)'s
  // scores and outputs as the attention's, so the errors are those of the dequantized
  // values. The views follow validate()'s memory rules (attention.hpp: shapes, strides,
  // alignment; q, k and v may differ in dtype here, each read as its own), the descales
  // validate_descales'; InvalidArgument otherwise, before any element is read.
  RoutingReport route(const VideoLayout& layout, const TensorView& q, const TensorView& k, const TensorView& v,
                      TokenOrder order = TokenOrder::FrameMajor, float softmax_scale = 0.f,
                      std::span<const std::int64_t> heads = {}, const Descales& descales = {}) const;

 private:
  RouterOptions options_;
};

}  // namespace stsa
