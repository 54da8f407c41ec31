// The attention call and the backend interface.
//
//   O[b, i, h, :] = sum_j softmax_j(scale * q_i . k_j over allowed j) v_j
//   LSE[b, h, i]  = log sum_{allowed j} exp(scale * q_i . k_j)      (natural log)
// A query row with no allowed key gets O = 0 and LSE = -inf.
// Non-finite inputs propagate: a NaN or Inf in a row's q, or in an allowed
// key's k or v, makes that row NaN (or Inf); rows that never touch it are exact.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "stsa/layout.hpp"
#include "stsa/mask.hpp"
#include "stsa/plan.hpp"
#include "stsa/tensor.hpp"

namespace stsa {

struct HeadMask {
  MaskSpec spec;                          // what the head attends to (source of truth)
  TokenOrder order = TokenOrder::FrameMajor;  // order of this head's tokens in the tensors
  std::shared_ptr<const TilePlan> plan;   // needed by tiled backends; must match grid, spec and order
  bool compute = true;                    // false: the head is skipped, its O and LSE left untouched
};

struct AttentionCall {
  VideoLayout layout;
  TensorView q, k, v;  // logical [B, N, H, D]
  TensorView o;        // logical [B, N, H, D]; F32, BF16 or F16
  LseView lse;         // logical [B, H, N]; optional (data == nullptr)
  std::vector<HeadMask> heads;  // one per head
  float softmax_scale = 0.f;    // 0 means 1 / sqrt(D)

  float scale() const;
};

// Checks everything a backend relies on: layout, shapes and strides against the
// layout, dtypes, that o/lse do not overlap q/k/v or each other, one mask per
// head, and (when require_plans) that every computed head has a matching plan.
void validate(const AttentionCall& call, bool require_plans);

// The tensor parts of validate(): the layout itself, then one logical
// [B, N, H, D] view or [B, H, N] LSE view against it (shape, non-negative
// strides under which no two elements share an address, and for tensors the
// element alignment); InvalidArgument naming `name` otherwise.
void validate_tensor(const char* name, const TensorView& t, const VideoLayout& layout);
void validate_lse(const char* name, const LseView& lse, const VideoLayout& layout);

// Builds HeadMasks for all heads with the given spec and tensor order (plans from `cache`).
std::vector<HeadMask> uniform_heads(const VideoLayout& layout, const MaskSpec& spec, PlanCache& cache,
                                    TileShape tile = {}, Alignment alignment = Alignment::Exact);

struct Support {
  bool ok = true;
  std::string why;  // set when !ok
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Support supports(const AttentionCall& call) const = 0;
  // Validates, then computes. Throws Unsupported when supports() says no.
  virtual void run(const AttentionCall& call) const = 0;
};

// Registered backends: "reference", "cpu", and "cuda" when built with it.
std::vector<const Backend*> backends();
const Backend& backend(std::string_view name);  // throws InvalidArgument for an unknown name

}  // namespace stsa
